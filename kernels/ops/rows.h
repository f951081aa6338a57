// TEMPORARY stand-in until the shared rows.h lands.
#pragma once
#include "prelude.h"
template <class Team>
MONO_DEV void mono_rmsnorm_rows(const Team& team, const u16* in, u32 in_stride, const u16* weight, u16* out,
                                u32 out_stride, u32 width, u32 rows, float eps, u8* smem) {
  (void)smem;
  for (u32 r = team.wave(); r < rows; r += Team::waves) {
    const u16* x = in + (u64)r * in_stride;
    float ss = 0.f;
    for (u32 i = team.lane(); i < width; i += MONO_WAVE) {
      const float v = mono_bf16_to_f32(x[i]);
      ss += v * v;
    }
    ss = mono_wave_sum(ss);
    const float inv = 1.f / mono_sqrtf(ss / (float)width + eps);
    for (u32 i = team.lane(); i < width; i += MONO_WAVE)
      out[(u64)r * out_stride + i] = mono_f32_to_bf16(mono_bf16_to_f32(x[i]) * inv * mono_bf16_to_f32(weight[i]));
  }
  team.sync();
}
