// The index query of one row (spec §3.1-3.3, §3.6): rope and Hadamard of every head, once per row,
// published with the head weights w_h = g_h * (HEADS * HEAD_DIM)^-1/2 * s_h for the scorers: in
// bf16 (s_h = 1), or for the wgmma scorer as E4M3 words of four with s_h the head's power-of-two scale.
#pragma once
#include "idx_common.h"

// Words of two bf16 (lower dim in the low half) of a head: a lane owns LANE_DIMS / 2 of them, or
// with one dim a lane, even lanes own one (their dim and the next lane's).
#define IDX_LANE_PAIRS (IDX_LANE_DIMS >= 2 ? IDX_LANE_DIMS / 2 : 1)

// The query of row task.args[0], a wave a head: wave w of the team does heads w, w + waves, ...
// Waits on its inputs (the boxes of the projections and gates it reads) first.
template <class Team>
MONO_DEV bool idx_query_task(const Team& team, const mbx_task& task, mbx_ctx& c, const idx_args& a, u8* smem) {
  (void)smem;
  if (!idx_wait_inputs(team, task, c)) return false;
  const u32 row = task.args[0];
  const u32 lane = idx_unhoisted(team.lane());
  const u32 position = idx_position(a, row);
  for (u32 h = idx_unhoisted(team.wave()); h < IDX_HEADS; h += Team::waves) {
    const u16* in = a.query_proj + ((u64)row * IDX_HEADS + h) * IDX_HEAD_DIM + lane * IDX_LANE_DIMS;
    float v[IDX_LANE_DIMS];
#pragma unroll
    for (u32 i = 0; i < IDX_LANE_DIMS; ++i) v[i] = mono_bf16_to_f32(in[i]);
    idx_rope(v, lane, position, a.inv_freq);
#if IDX_HADAMARD
    idx_hadamard(v, lane);
#endif
#if IDX_WGMMA
    u8 codes[IDX_LANE_DIMS];
    const float head_scale = idx_quantise(v, codes);
    u32 word;
    if (idx_pack_codes(codes, lane, &word))
      mono_st_relaxed_u64(c.scratch + idx_query_box(a, row, h * (IDX_HEAD_DIM / 4) + lane * IDX_LANE_DIMS / 4),
                          mbx_pack(c.tag, word));
#else
    const float head_scale = 1.0f;
    u32 pairs[IDX_LANE_PAIRS];
#if IDX_LANE_DIMS >= 2
#pragma unroll
    for (u32 p = 0; p < IDX_LANE_PAIRS; ++p)
      pairs[p] = (u32)mono_f32_to_bf16(v[2 * p]) | ((u32)mono_f32_to_bf16(v[2 * p + 1]) << 16);
    const bool owner = true;
    const u32 first_word = lane * IDX_LANE_PAIRS;
#else
    const u32 mine = (u32)mono_f32_to_bf16(v[0]) << (16u * (lane & 1u));
    pairs[0] = mine | mono_shfl_xor(mine, 1u);
    const bool owner = (lane & 1u) == 0;
    const u32 first_word = lane / 2;
#endif
    if (owner) {
#pragma unroll
      for (u32 p = 0; p < IDX_LANE_PAIRS; ++p) {
        const u32 box = idx_query_box(a, row, h * (IDX_HEAD_DIM / 2) + first_word + p);
        mono_st_relaxed_u64(c.scratch + box, mbx_pack(c.tag, pairs[p]));
      }
    }
#endif
    if (lane == 0) {
      // The scale is a power of two: multiplying it in last is exact.
      const float w = a.gates[(u64)row * IDX_HEADS + h] * a.weight_scale * head_scale;
      mono_st_relaxed_u64(c.scratch + idx_query_box(a, row, IDX_QUERY_VALUE_WORDS + h),
                          mbx_pack(c.tag, mono_f32_bits(w)));
    }
  }
  return true;
}
