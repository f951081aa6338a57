// Row operations a team runs on a few activation rows (a step's 1 to 16): the reductions and the
// RMSNorm that every stage's chain needs between its matrices (the attention half's three norms,
// the MoE half's post-attention norm, the tail's final norm).
//
// Deterministic by construction: a thread sums its elements in index order, a wave folds its lanes
// by the fixed butterfly of mono_wave_sum, and the waves' partials are added in wave order by
// every thread alike, so the same inputs give the same bits on every replay and every thread holds
// the same total.
#pragma once
#include "prelude.h"
#include "numerics.h"

// Floats of shared memory mono_team_sum needs: one a wave of the team.
#define MONO_ROWS_SCRATCH_FLOATS 32u

// The sum of every thread's `v` over the team, returned to every thread. `scratch` is the team's
// own shared memory (at least Team::waves floats); it may be reused after the call returns.
template <class Team>
MONO_DEV float mono_team_sum(const Team& team, float v, float* scratch) {
  static_assert(Team::waves <= MONO_ROWS_SCRATCH_FLOATS, "one scratch float a wave");
  v = mono_wave_sum(v);
  if (Team::size <= MONO_WAVE) return v;
  if (team.lane() == 0) scratch[team.wave()] = v;
  team.sync();
  float total = 0.0f;
  for (u32 w = 0; w < Team::waves; ++w) total += scratch[w];
  team.sync();
  return total;
}

// y[r][i] = bf16(x[r][i] * inv_rms_r * w[i]), inv_rms_r = 1 / sqrt(mean_i(x[r][i]^2) + eps), fp32
// throughout; the reference (model::numerics::rms_norm) computes the same in f64, so the two
// differ by the bf16 rounding of the output at most a unit. `x` and `y` may be the same rows.
template <class Team>
MONO_DEV void mono_rmsnorm_rows(const Team& team, const u16* x, u32 x_stride, const u16* w, u32 n, u32 rows,
                                float eps, u16* y, u32 y_stride, float* scratch) {
  for (u32 r = 0; r < rows; ++r) {
    const u16* xr = x + (u64)r * x_stride;
    float squares = 0.0f;
    for (u32 i = team.thread(); i < n; i += Team::size) {
      const float v = mono_bf16_to_f32(xr[i]);
      squares += v * v;
    }
    const float inv_rms = 1.0f / mono_sqrtf(mono_team_sum(team, squares, scratch) / (float)n + eps);
    u16* yr = y + (u64)r * y_stride;
    for (u32 i = team.thread(); i < n; i += Team::size)
      yr[i] = mono_f32_to_bf16(mono_bf16_to_f32(xr[i]) * inv_rms * mono_bf16_to_f32(w[i]));
  }
}
