// The weight-streaming linear tile: y[r, c] = sum_k x[r, k] W[c, k] for up to 16 rows of bf16 x,
// fp32 sums, W FP8 E4M3 with fp32 128 x 128 block scales or bf16, streamed from the packed layout
// of crates/model/src/weights/packed.rs (read it first: tiles of 16 packed rows in two halves,
// k-blocks of 128, each lane's 16-byte load holding its m16n8k16 A operand).
//
// A team runs a range of tiles of one matrix (lin_tiles). Its threads form groups of 32 (a warp
// on NVIDIA, half a wave on AMD); a group streams batches of 4 loads a lane (a k-block of FP8,
// half one of bf16), either through registers, each batch's loads issued while the batch before
// it is being multiplied, or (NVIDIA, a whole-CTA team, a long range) through a ring of LDS slots
// that the copy engine fills; the first loads go out before the caller's `ready` (the wait on the
// input: weights never wait on a hand-off). The groups split a round of
// tiles: G groups share a tile's batches, P = groups / G tiles a round; each group's sums go to
// LDS, then the team adds the G parts of each output in a fixed order and applies the epilogue.
//
// NVIDIA: bf16 mma.sync m16n8k16 with the weights as the M side (the 16 packed rows) and the x
// rows as N (8 or 16), FP8 converted to bf16 in registers; a k-block's sums are scaled by the
// half's scale. Elsewhere (AMD, the host stand-in): the same loads and partition, each lane
// multiplying its own elements with fp32 FMAs, summed over the lane quad.
#pragma once
#include "prelude.h"
#include "ops/team.h"
#include "ops/warp_mma.h"
#include "ops/copy.h"
#include "ops/rows.h"

#define LIN_TILE_ROWS 16u
#define LIN_HALF_ROWS 8u
#define LIN_K_BLOCK 128u
#define LIN_GROUP 32u
#define LIN_MAX_ROWS 16u
// x rows in LDS are padded by 16 bytes so that the 8 rows a B operand reads fall in distinct banks.
#define LIN_X_PAD 8u

// lin_matrix.flags
#define LIN_FP8 1u        // FP8 codes + packed scales (else bf16)
#define LIN_OUT_F32 2u    // fp32 output, no rounding (else bf16)
#define LIN_SWIGLU 4u     // gate/up pairing: bf16(bf16(silu(bf16 g)) * bf16 u), 8 columns a tile
#define LIN_RESIDUAL 8u   // + residual[r, c] (bf16), last
#define LIN_ROW_SCALE 16u // * row_scale[r] (a routed expert's weight), before the residual
#define LIN_RMSNORM 32u   // x is RMSNorm(source rows), normed while it is staged (lin_stage_x_normed)

// One matrix of a launch (src/gpu.rs `LinMatrix`, 96 bytes).
struct lin_matrix {
  const u8* w;             // packed weight
  const float* scales;     // packed scales [tiles][k-blocks][2] (FP8)
  const u16* x;            // [rows, x_stride] bf16, 16-byte aligned rows (LIN_RMSNORM: the source rows)
  void* y;                 // [rows, y_stride] bf16 or fp32
  const u16* residual;     // [rows, y_stride] bf16 (LIN_RESIDUAL)
  const float* row_scale;  // [rows] (LIN_ROW_SCALE)
  const u16* norm_w;       // [row_len] bf16, 16-byte aligned: the norm's weight of the whole row (LIN_RMSNORM)
  u32 k;                   // multiple of 128
  u32 n;                   // output columns
  u32 tiles;
  u32 rows;                // 1..16
  u32 x_stride;            // elements, multiple of 8
  u32 y_stride;            // elements
  u32 flags;
  // x points at element row_at of source rows of row_len elements (0: the rows are the k-range).
  // Columns past a row's end stage as zeros (lin_stage_x); LIN_RMSNORM takes the RMS over all.
  u32 row_len;
  u32 row_at;              // a multiple of 8
  float norm_eps;          // (LIN_RMSNORM)
};

// LDS a team needs (host twin: src/layout.rs `lds_bytes`): one round's partial sums of every
// group (a slot), x, then the register path's further slots (lin_wide_rounds).
MONO_DEV constexpr u32 lin_partial_floats(u32 groups, u32 row_tiles) { return groups * LIN_TILE_ROWS * 8u * row_tiles; }
// Group grp's sums within a slot: the groups before it take lin_partial_floats(grp, ..).
MONO_DEV float* lin_group_sums(float* slot, u32 grp, u32 row_tiles) {
  return slot + lin_partial_floats(grp, row_tiles);
}
// Rounds whose sums the register path keeps in LDS before one epilogue adds them all (host twin:
// src/layout.rs `wide_rounds`): each round's end is then a store of the groups' sums, not two team
// barriers around an epilogue. At 8 RT = 16 rows a slot is 16 KB and x at k = 6144 takes 192 KB,
// so one slot is all that fits.
MONO_DEV constexpr u32 lin_wide_rounds(u32 row_tiles) { return row_tiles == 1 ? 4u : 1u; }
// Slot w of a range's partial sums: slot 0 before x, the others after the x rows (`wide`).
MONO_DEV float* lin_slot(float* parts, float* wide, u32 w, u32 slot_floats) {
  return w == 0 ? parts : wide + (w - 1) * slot_floats;
}
MONO_DEV u32 lin_x_stride(u32 k) { return k + LIN_X_PAD; }

// ---- how a team's groups share its tiles ----------------------------------------------------------
// A batch is LIN_LOADS loads of a lane (2 KB of a tile for the group): a k-block of FP8, half of
// one of bf16 ("units", `units` a tile).
#define LIN_LOADS 4u
struct lin_plan {
  u32 share;   // G: groups per tile (a power of two, at most the units)
  u32 across;  // P: tiles a round
  u32 rounds;
  u32 units;
  u32 count;   // tiles of the range
};
MONO_DEV lin_plan lin_plan_of(u32 groups, u32 units, u32 count) {
  lin_plan p;
  p.share = 1;
  while (p.share * 2 <= groups && p.share * 2 <= units) p.share *= 2;
  p.across = groups / p.share;
  p.rounds = (count + p.across - 1) / p.across;
  p.units = units;
  p.count = count;
  return p;
}
// The i-th batch of group `grp` in round r: false when there is none.
MONO_DEV bool lin_batch(const lin_plan& p, u32 grp, u32 r, u32 i, u32* tile, u32* unit) {
  const u32 t = r * p.across + grp / p.share, b = grp % p.share + i * p.share;
  if (t >= p.count || b >= p.units) return false;
  *tile = t;
  *unit = b;
  return true;
}

MONO_DEV u32 lin_word(const mono_u32x4& v, u32 q) { return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w; }

#if MONO_NVIDIA
// Two E4M3 codes (low byte first) as bf16x2, exactly: E4M3 -> f16 is exact, and so is f16 -> bf16
// for every value an E4M3 code holds.
MONO_DEV u32 lin_e4m3x2_to_bf16x2(u32 pair) {
  u32 h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((u16)pair));
  float lo, hi;
  asm("{ .reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }" : "=f"(lo), "=f"(hi) : "r"(h));
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#endif

// A group's running sums. NVIDIA: the mma C fragments, per 8-row block of x (rt): c[rt][0..1] for
// packed row g and x rows 8 rt + 2t, +1; c[rt][2..3] for packed row g + 8. Elsewhere: this lane's
// own products for packed rows g and g + 8 and every x row, summed over the lane quad at the end.
template <u32 RT>
struct lin_acc {
#if MONO_NVIDIA
  float c[RT][4];
#else
  float v[2][8 * RT];
#endif
  MONO_DEV void zero() {
#if MONO_NVIDIA
    for (u32 i = 0; i < RT; ++i)
      for (u32 j = 0; j < 4; ++j) c[i][j] = 0.f;
#else
#pragma unroll
    for (u32 h = 0; h < 2; ++h)
#pragma unroll
      for (u32 r = 0; r < 8 * RT; ++r) v[h][r] = 0.f;
#endif
  }
};

// Multiplies one batch (its first k is k_base) into `acc`: the lane's loads in `w`, x in LDS (xs:
// 8 RT rows of lin_x_stride(k)), s0/s1 the halves' scales (FP8).
template <bool FP8, u32 RT>
MONO_DEV void lin_multiply(lin_acc<RT>& acc, const mono_u32x4* w, const u16* xs, u32 xstride, u32 rows, u32 k_base,
                           float s0, float s1, u32 lane) {
  constexpr u32 L = LIN_LOADS;
  const u32 g = lane / 4, t = lane % 4;
  constexpr u32 KL = FP8 ? 32u : 16u;  // k of one load
#if MONO_NVIDIA
  // FP8: a k-block's sums apart, then scaled by each half's scale; bf16: straight into acc.
  float tmp[RT][4];
#pragma unroll
  for (u32 i = 0; i < RT; ++i)
#pragma unroll
    for (u32 j = 0; j < 4; ++j) tmp[i][j] = 0.f;
#pragma unroll
  for (u32 j = 0; j < L; ++j) {
#pragma unroll
    for (u32 s = 0; s < (FP8 ? 2u : 1u); ++s) {
      u32 a[4];
      if constexpr (FP8) {
        const u32 lo = lin_word(w[j], 2 * s), hi = lin_word(w[j], 2 * s + 1);
        a[0] = lin_e4m3x2_to_bf16x2(lo);
        a[1] = lin_e4m3x2_to_bf16x2(lo >> 16);
        a[2] = lin_e4m3x2_to_bf16x2(hi);
        a[3] = lin_e4m3x2_to_bf16x2(hi >> 16);
      } else {
        a[0] = w[j].x, a[1] = w[j].y, a[2] = w[j].z, a[3] = w[j].w;
      }
      const u32 k0 = k_base + j * KL + 16 * s + 2 * t;
#pragma unroll
      for (u32 rt = 0; rt < RT; ++rt) {
        // Only the matrix's x rows are staged; the B operand of the others is zero.
        const u16* xr = xs + (8 * rt + g) * xstride + k0;
        const bool real = 8 * rt + g < rows;
        mono_mma_m16n8k16_bf16(FP8 ? tmp[rt] : acc.c[rt], a, real ? *(const u32*)xr : 0u,
                               real ? *(const u32*)(xr + 8) : 0u);
      }
    }
  }
  if constexpr (FP8) {
#pragma unroll
    for (u32 rt = 0; rt < RT; ++rt) {
      acc.c[rt][0] += s0 * tmp[rt][0];
      acc.c[rt][1] += s0 * tmp[rt][1];
      acc.c[rt][2] += s1 * tmp[rt][2];
      acc.c[rt][3] += s1 * tmp[rt][3];
    }
  }
#else
  // A row at a time, every loop unrolled, so that the sums are indexed by constants and stay in
  // registers (an index known only at run time puts them in scratch memory: a load and a store
  // around every FMA on gfx950). Each (half, row) sum still adds its products in (load, element)
  // order.
  constexpr u32 E = FP8 ? 16u : 8u;
  float wv[L][E];
#pragma unroll
  for (u32 j = 0; j < L; ++j)
#pragma unroll
    for (u32 i = 0; i < E; ++i) {
      const u32 word = lin_word(w[j], FP8 ? i / 4 : i / 2);
      wv[j][i] = FP8 ? mono_e4m3_to_f32((u8)(word >> (8 * (i % 4)))) : mono_bf16_to_f32((u16)(word >> (16 * (i % 2))));
    }
#pragma unroll
  for (u32 r = 0; r < 8 * RT; ++r) {
    if (r >= rows) continue;
    float sum[2] = {FP8 ? 0.f : acc.v[0][r], FP8 ? 0.f : acc.v[1][r]};
    const u16* xr = xs + r * xstride + k_base + 2 * t;
#pragma unroll
    for (u32 j = 0; j < L; ++j)
#pragma unroll
      for (u32 i = 0; i < E; ++i) {
        const u32 s = i / 8, reg = (i % 8) / 2, e = i % 2;
        sum[reg & 1u] += wv[j][i] * mono_bf16_to_f32(xr[j * KL + 16 * s + 8 * (reg >> 1) + e]);
      }
    if (FP8) {
      acc.v[0][r] += s0 * sum[0];
      acc.v[1][r] += s1 * sum[1];
    } else {
      acc.v[0][r] = sum[0];
      acc.v[1][r] = sum[1];
    }
  }
#endif
}

// The group's sums to its LDS slot: part[(packed row) * 8 RT + x row].
template <u32 RT>
MONO_DEV void lin_flush(lin_acc<RT>& acc, float* part, u32 lane) {
  const u32 g = lane / 4, t = lane % 4;
#if MONO_NVIDIA
#pragma unroll
  for (u32 rt = 0; rt < RT; ++rt) {
    const u32 r = 8 * rt + 2 * t;
    part[g * 8 * RT + r] = acc.c[rt][0];
    part[g * 8 * RT + r + 1] = acc.c[rt][1];
    part[(g + 8) * 8 * RT + r] = acc.c[rt][2];
    part[(g + 8) * 8 * RT + r + 1] = acc.c[rt][3];
  }
#else
#pragma unroll
  for (u32 h = 0; h < 2; ++h)
#pragma unroll
    for (u32 r = 0; r < 8 * RT; ++r) {
      float v = acc.v[h][r];
      v += mono_shfl_xor_f32(v, 1);
      v += mono_shfl_xor_f32(v, 2);
      if (r % 4 == t) part[(g + 8 * h) * 8 * RT + r] = v;
    }
#endif
}

MONO_DEV float lin_silu(float v) { return v / (1.f + mono_expf(-v)); }
MONO_DEV float lin_bf16(float v) { return mono_bf16_to_f32(mono_f32_to_bf16(v)); }

MONO_DEV u32 lin_min(u32 a, u32 b) { return a < b ? a : b; }

// LIN_STAMPS=1 (measurement builds only): the leader notes clock readings (mono_clock_cycles: the
// SM's cycles on NVIDIA, nanoseconds on the host stand-in) at the task's milestones (LIN_STAMP_*)
// in lin_stamps; the stage's task writes them out (lin_task.h, beside the task's trace record).
#ifndef LIN_STAMPS
#define LIN_STAMPS 0
#endif
#define LIN_STAMP_TILE 0u     // the matrix descriptor read, the first loads issued
#define LIN_STAMP_READY 1u    // the input wait over
#define LIN_STAMP_X 2u        // x in LDS
#define LIN_STAMP_FIRST 3u    // the first batch multiplied (register path) / its slot landed (ring)
#define LIN_STAMP_LAST 4u     // the last batch multiplied / its slot landed
#define LIN_STAMP_STORED 5u   // the last round's epilogue stored
#define LIN_STAMP_PUBLISHED 6u
#define LIN_STAMP_SLOWEST 7u  // the slowest group's last batch multiplied (LAST is the leader's own)
#define LIN_STAMP_WORDS 8u
#if LIN_STAMPS
__shared__ u64 lin_stamps[LIN_STAMP_WORDS];
// Each group's own "last", which its lane 0 notes; the leader keeps the latest once a team barrier
// has passed (lin_stamp_slowest). Up to 1024 threads: 32 groups.
__shared__ u64 lin_group_last[32];
// The clock once `dep` is known (so a stamp is not hoisted above the load it follows).
MONO_DEV u64 lin_clock_after(u32 dep) {
#if MONO_NVIDIA
  u64 t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t) : "r"(dep));
  return t;
#else
  (void)dep;
  return mono_clock_cycles();
#endif
}
#define LIN_STAMP(team, j, dep) \
  do {                          \
    if ((team).leader()) lin_stamps[j] = lin_clock_after(dep); \
  } while (0)
#define LIN_STAMP_GROUP(grp, lane) \
  do {                             \
    if ((lane) == 0) lin_group_last[grp] = lin_clock_after(0u); \
  } while (0)
template <class Team>
MONO_DEV void lin_stamp_slowest(const Team& team) {
  if (!team.leader()) return;
  u64 t = 0;
  for (u32 g = 0; g < Team::size / LIN_GROUP; ++g) t = lin_group_last[g] > t ? lin_group_last[g] : t;
  lin_stamps[LIN_STAMP_SLOWEST] = t;
}
#else
#define LIN_STAMP(team, j, dep) \
  do {                          \
  } while (0)
#define LIN_STAMP_GROUP(grp, lane) \
  do {                             \
  } while (0)
template <class Team>
MONO_DEV void lin_stamp_slowest(const Team&) {}
#endif

// A weight load of the register path, around L1 on NVIDIA (ld.global.nc.L1::no_allocate): a CTA
// that takes all of the SM's shared memory leaves it about 29 KB of L1, less than the 32 to 64 KB
// of weight loads its groups keep in flight, and each weight byte is read once. On the H200 this
// took 2.4 to 4.6 % off every linear figure (PERF.md).
MONO_DEV mono_u32x4 lin_load_weight(const mono_u32x4* p) {
#if MONO_NVIDIA
  mono_u32x4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
#else
  return *p;
#endif
}

// Issues the loads of batch (tile, unit) for lane `lane` of a group.
MONO_DEV void lin_load(mono_u32x4* dst, const lin_matrix& m, u32 units, u32 tile, u32 unit, u32 lane) {
  const mono_u32x4* src = (const mono_u32x4*)m.w + ((u64)tile * units + unit) * (LIN_LOADS * LIN_GROUP) + lane;
#pragma unroll
  for (u32 j = 0; j < LIN_LOADS; ++j) dst[j] = lin_load_weight(src + j * LIN_GROUP);
}

// The matrix's x rows to LDS (no others: lin_multiply reads none). A thread's loads go out four
// at a time before their stores, so it waits on one round trip per four chunks, not per chunk.
// Columns past the source rows' end (row_len) stage as zeros: a matrix padded with zero weight
// columns to whole k-blocks (W_UK's nope) then multiplies them by zeros, never by the bytes that
// follow its rows in the arena, which may be anything (0 x NaN is NaN).
template <class Team>
MONO_DEV void lin_stage_x(const Team& team, const lin_matrix& m, u16* xs, u32 xstride) {
  constexpr u32 B = 4;
  const u32 chunks = m.k / 8, total = m.rows * chunks;
  const u32 held = m.row_len == 0 ? chunks : (m.row_len - m.row_at) / 8;
  for (u32 base = team.thread(); base < total; base += B * Team::size) {
    mono_u32x4 v[B];
#pragma unroll
    for (u32 b = 0; b < B; ++b) {
      const u32 i = base + b * Team::size;
      v[b] = mono_u32x4{0u, 0u, 0u, 0u};
      if (i < total && i % chunks < held)
        v[b] = *(const mono_u32x4*)(m.x + (u64)(i / chunks) * m.x_stride + 8 * (i % chunks));
    }
#pragma unroll
    for (u32 b = 0; b < B; ++b) {
      const u32 i = base + b * Team::size;
      if (i < total) *(mono_u32x4*)(xs + (i / chunks) * xstride + 8 * (i % chunks)) = v[b];  // 16-byte aligned rows
    }
  }
}

// x = RMSNorm(the source rows) to LDS (LIN_RMSNORM), the link of a norm task taken out of the
// step's chain: each row's inverse RMS over its whole source row (row_len elements, also when the
// matrix reads only the k-range from row_at, as the router's k-splits do), then the matrix's
// k-range of bf16(x * inv_rms * w). The pieces are the norm task's (ops/rows.h: mono_row_squares,
// mono_team_sum's two steps mono_wave_sum_to and mono_waves_total, mono_inv_rms,
// mono_rmsnorm_value), so a team of the norm task's size stages the very bits that task would have
// written (tests/host_emulation.rs and tests/gpu.rs compare them bit for bit). `scratch`:
// lin_norm_scratch_floats of the team's LDS that nothing else uses meanwhile.
MONO_DEV u32 lin_norm_pair(u32 x, float inv_rms, u32 w) {
  return (u32)mono_rmsnorm_value((u16)x, inv_rms, (u16)w) |
         (u32)mono_rmsnorm_value((u16)(x >> 16), inv_rms, (u16)(w >> 16)) << 16;
}

// Eight elements of a row (one 16-byte chunk of x and of w) normed.
MONO_DEV mono_u32x4 lin_norm_chunk(mono_u32x4 x, float inv_rms, mono_u32x4 w) {
  mono_u32x4 o;
  o.x = lin_norm_pair(x.x, inv_rms, w.x);
  o.y = lin_norm_pair(x.y, inv_rms, w.y);
  o.z = lin_norm_pair(x.z, inv_rms, w.z);
  o.w = lin_norm_pair(x.w, inv_rms, w.w);
  return o;
}

// Floats of `scratch` lin_stage_x_normed takes: every row's wave sums, then its inverse RMS.
template <class Team>
MONO_DEV constexpr u32 lin_norm_scratch_floats() {
  return LIN_MAX_ROWS * Team::waves + LIN_MAX_ROWS;
}

// Every row's inverse RMS to inv[row], from each thread's part of the row's sum of squares
// (`squares(r)`): the rows' wave sums go to scratch together, then thread r adds row r's, so the
// rows take two team barriers in all rather than two each.
template <class Team, class Squares>
MONO_DEV void lin_inv_rms_rows(const Team& team, u32 rows, u32 len, float eps, float* scratch, Squares squares) {
  float* inv = scratch + LIN_MAX_ROWS * Team::waves;
  for (u32 r = 0; r < rows; ++r) mono_wave_sum_to(team, squares(r), scratch + r * Team::waves);
  team.sync();
  const u32 r = team.thread();
  if (r < rows) inv[r] = mono_inv_rms(mono_waves_total(team, scratch + r * Team::waves), len, eps);
  team.sync();
}

template <class Team>
MONO_DEV void lin_stage_x_normed(const Team& team, const lin_matrix& m, u16* xs, u32 xstride, float* scratch) {
  static_assert(LIN_MAX_ROWS <= Team::size, "a thread adds a row's sums");
  const float* inv = scratch + LIN_MAX_ROWS * Team::waves;
  if (m.row_at == 0 && m.k == m.row_len) {
    // The matrix reads whole rows: staged as they are (one pass over global memory), then normed
    // in place from LDS, the sums over the same elements in the same order.
    lin_stage_x(team, m, xs, xstride);
    team.sync();
    lin_inv_rms_rows(team, m.rows, m.k, m.norm_eps, scratch,
                     [&](u32 r) { return mono_row_squares(team, xs + r * xstride, m.k); });
    const u32 chunks = m.k / 8;
    for (u32 i = team.thread(); i < m.rows * chunks; i += Team::size) {
      const u32 r = i / chunks, c = i % chunks;
      const mono_u32x4 g = *(const mono_u32x4*)(m.norm_w + 8 * c);
      mono_u32x4* at = (mono_u32x4*)(xs + r * xstride + 8 * c);
      const mono_u32x4 v = *at;
      const float s = inv[r];
      *at = lin_norm_chunk(v, s, g);
    }
    return;
  }
  lin_inv_rms_rows(team, m.rows, m.row_len, m.norm_eps, scratch, [&](u32 r) {
    return mono_row_squares(team, m.x - m.row_at + (u64)r * m.x_stride, m.row_len);
  });
  const u16* w = m.norm_w + m.row_at;
  const u32 chunks = m.k / 8, total = m.rows * chunks;
  for (u32 i = team.thread(); i < total; i += Team::size) {
    const u32 r = i / chunks, c = i % chunks;
    const mono_u32x4 v = *(const mono_u32x4*)(m.x + (u64)r * m.x_stride + 8 * c);
    const mono_u32x4 g = *(const mono_u32x4*)(w + 8 * c);
    const float s = inv[r];
    *(mono_u32x4*)(xs + r * xstride + 8 * c) = lin_norm_chunk(v, s, g);
  }
}

// The matrix's x to LDS, normed or as it is; ends on a team barrier.
template <class Team>
MONO_DEV void lin_stage(const Team& team, const lin_matrix& m, u16* xs, u32 xstride, float* scratch) {
  if (m.flags & LIN_RMSNORM)
    lin_stage_x_normed(team, m, xs, xstride, scratch);
  else
    lin_stage_x(team, m, xs, xstride);
  team.sync();
}

// Asks L2 for the residual the epilogue of tiles first .. first + count will read, before the
// task waits on its input: each round's epilogue then finds it in L2 rather than in HBM.
template <class Team>
MONO_DEV void lin_prefetch_residual(const Team& team, const lin_matrix& m, u32 first, u32 count) {
#if MONO_NVIDIA
  if (!(m.flags & LIN_RESIDUAL) || (m.flags & (LIN_SWIGLU | LIN_OUT_F32))) return;
  const u32 c0 = first * LIN_TILE_ROWS, c1 = lin_min(m.n, (first + count) * LIN_TILE_ROWS);
  if (c1 <= c0) return;
  const u32 lines = (c1 - c0) * 2 / 128 + 2;  // 128-byte lines a row's run can touch
  for (u32 i = team.thread(); i < m.rows * lines; i += Team::size) {
    const u16* row = m.residual + (u64)(i / lines) * m.y_stride;
    const u64 at = ((u64)(row + c0) & ~127ull) + 128ull * (i % lines);
    if (at < (u64)(row + c1)) asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
  }
#else
  (void)team, (void)m, (void)first, (void)count;
#endif
}

// The end of rounds r0 .. r0 + nw - 1, whose sums every group has stored to slots 0 .. nw - 1
// (lin_flush): the team adds the G parts of each output in group order and applies the epilogue.
// The outputs of all nw rounds are one pass over the team's threads, so that a thread's epilogue
// loads (the residual, the row scale) go out beside the other rounds' rather than a round trip
// after them. The matrix's fields are read into registers before the first barrier: a barrier
// orders memory for the compiler, so fields read after it (and after a store through y, which
// may alias the table) are loaded again, each a round trip behind the last once the input wait's
// acquire has emptied L1. Starts and ends with a team barrier.
template <u32 RT, class Team>
MONO_DEV void lin_rounds_end(const Team& team, const lin_matrix& m, const lin_plan& p, u32 r0, u32 nw, u32 first,
                             float* parts, float* wide) {
  constexpr u32 RS = 8 * RT;
  constexpr u32 slot_floats = lin_partial_floats(Team::size / LIN_GROUP, RT);
  const u32 flags = m.flags, rows = m.rows, n_cols = m.n;
  const u64 y_stride = m.y_stride;
  void* const y = m.y;
  const u16* const residual = m.residual;
  const float* const row_scale = m.row_scale;
  team.sync();
  const u32 cols = (flags & LIN_SWIGLU) ? LIN_HALF_ROWS : LIN_TILE_ROWS;
  const u32 items = p.across * cols * rows;
  for (u32 wit = team.thread(); wit < nw * items; wit += Team::size) {
    const u32 w = wit / items, it = wit % items;
    const u32 pp = it / (cols * rows), n = it / rows % cols, row = it % rows;
    const u32 t = (r0 + w) * p.across + pp;
    if (t >= p.count) continue;
    const u32 col = (first + t) * cols + n;
    if (col >= n_cols) continue;
    const float* part = lin_slot(parts, wide, w, slot_floats) + pp * p.share * LIN_TILE_ROWS * RS;
    float v = 0.f, u = 0.f;
    for (u32 q = 0; q < p.share; ++q) v += part[(q * LIN_TILE_ROWS + n) * RS + row];
    const u64 at = (u64)row * y_stride + col;
    if (flags & LIN_OUT_F32) {
      ((float*)y)[at] = v;
      continue;
    }
    if (flags & LIN_SWIGLU) {
      for (u32 q = 0; q < p.share; ++q) u += part[(q * LIN_TILE_ROWS + n + LIN_HALF_ROWS) * RS + row];
      v = lin_bf16(lin_silu(lin_bf16(v))) * lin_bf16(u);
    } else {
      if (flags & LIN_ROW_SCALE) v = lin_bf16(v) * row_scale[row];
      if (flags & LIN_RESIDUAL) v = mono_bf16_to_f32(residual[at]) + lin_bf16(v);
    }
    ((u16*)y)[at] = mono_f32_to_bf16(v);
  }
  team.sync();
}

// Through registers: each group keeps its next batch's loads in flight while it multiplies the
// current one (the path of every target without a copy engine, and of a CTA whose LDS is too
// small for the ring).
template <bool FP8, u32 RT, class Team, class Ready>
MONO_DEV bool lin_tiles_regs(const Team& team, const lin_matrix& m, const lin_plan& p, u32 first, float* parts,
                             u16* xs, u32 xstride, Ready ready) {
  constexpr u32 L = LIN_LOADS;
  constexpr u32 unit_k = FP8 ? LIN_K_BLOCK : LIN_K_BLOCK / 2;
  const u32 grp = team.thread() / LIN_GROUP, lane = team.thread() % LIN_GROUP;
  LIN_STAMP(team, LIN_STAMP_TILE, p.units);

  mono_u32x4 cur[L], nxt[L];
  u32 cr = 0, ci = 0, ctile = 0, cunit = 0;
  bool have = lin_batch(p, grp, 0, 0, &ctile, &cunit);
  if (have) lin_load(cur, m, p.units, first + ctile, cunit, lane);
  lin_prefetch_residual(team, m, first, p.count);
  if (!ready()) return false;
  LIN_STAMP(team, LIN_STAMP_READY, 0u);
  lin_stage(team, m, xs, xstride, parts);
  LIN_STAMP(team, LIN_STAMP_X, 0u);

  // Up to W rounds' sums wait in LDS for one epilogue; x lies between slot 0 and the others.
  constexpr u32 W = lin_wide_rounds(RT), slot_floats = lin_partial_floats(Team::size / LIN_GROUP, RT);
  float* wide = (float*)(xs + m.rows * xstride);
  for (u32 r = 0; r < p.rounds; ++r) {
    lin_acc<RT> acc;
    acc.zero();
    while (have && cr == r) {
      u32 nr = cr, ni = ci + 1, ntile = 0, nunit = 0;
      bool nhave = lin_batch(p, grp, nr, ni, &ntile, &nunit);
      if (!nhave) {
        nr = cr + 1, ni = 0;
        nhave = lin_batch(p, grp, nr, ni, &ntile, &nunit);
      }
      if (nhave) lin_load(nxt, m, p.units, first + ntile, nunit, lane);
      float s0 = 0.f, s1 = 0.f;
      if (FP8) {
        const float* sc = m.scales + ((u64)(first + ctile) * p.units + cunit) * 2;
        s0 = sc[0], s1 = sc[1];
      }
      lin_multiply<FP8, RT>(acc, cur, xs, xstride, m.rows, cunit * unit_k, s0, s1, lane);
      if (cr == 0 && ci == 0) LIN_STAMP(team, LIN_STAMP_FIRST, 0u);
#pragma unroll
      for (u32 j = 0; j < L; ++j) cur[j] = nxt[j];
      cr = nr, ci = ni, ctile = ntile, cunit = nunit, have = nhave;
    }
    if (r + 1 == p.rounds) {
      LIN_STAMP(team, LIN_STAMP_LAST, 0u);
      LIN_STAMP_GROUP(grp, lane);
    }
    const u32 w = r % W;
    lin_flush<RT>(acc, lin_group_sums(lin_slot(parts, wide, w, slot_floats), grp, RT), lane);
    if (w + 1 == W || r + 1 == p.rounds) lin_rounds_end<RT>(team, m, p, r - w, w + 1, first, parts, wide);
  }
  lin_stamp_slowest(team);  // the last round's end was a team barrier
  LIN_STAMP(team, LIN_STAMP_STORED, 0u);
  return true;
}

// The fewest steps a range takes to go through the ring at all (tests set 1 to run the ring on
// small matrices). On the H200 the copy engine lands a task's slots at about 27 GB/s an SM (the 64 KB
// after a task's first slot took 2.4 us): a long range streams at the HBM's rate when every SM
// does so (lm_head: 56 steps a CTA, 1.05 x the copy kernel, against 1.16 x through registers), but
// shorter ranges finish sooner through registers, whose loads many warps keep in flight (q_a: 3
// steps a CTA, 11.3 against 13.3 us a launch; the routed experts' downs at 4 rows, 12 steps, took
// the MoE launch 93.0 us through the ring and 83.6 through registers). PERF.md has the figures.
#ifndef LIN_RING_MIN_STEPS
#define LIN_RING_MIN_STEPS 16u
#endif
#if MONO_NVIDIA && defined(MONO_CTA_THREADS)
// ---- through an LDS ring filled by the copy engine (NVIDIA) ----------------------------------------
// A step is one batch of every group: for each of a round's P tiles, G consecutive units (one run
// of memory), so a step is P bulk copies into one slot, and group grp's batch lands at grp * 2 KB
// (FP8 scales: the same units' pairs, grp * 8 bytes into the slot's scales, when they are 16-byte
// runs; else each lane reads its pair from global memory). A slot completes on an mbarrier that
// counts its bytes. Every slot is filled before the task waits on its input, so a task of up to
// `slots` steps has all its weight bytes in flight at once; thereafter the slot of step s - 1 is
// refilled with step s - 1 + slots once every group is past step s - 1 (a team barrier; a
// round's end already is one). Fewer slots, fewer of them before the wait, or smaller copies were
// no faster on the H200 (PERF.md).
#define LIN_RING_MAX 8u
#define LIN_UNIT_BYTES (LIN_LOADS * LIN_GROUP * 16u)
#define LIN_RING_PIECE (1u << 20)

MONO_DEV u32 lin_dynamic_lds() {
  u32 v;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
  return v;
}

// Where the ring lies, as offsets from the LDS base.
struct lin_ring {
  u32 slots;      // 0: too little LDS for a ring
  u32 steps;      // of the whole range
  u32 per_round;  // steps a round
  u32 bar;        // slot j's barrier at bar + 8 j
  u32 scales;     // slot j's scales at scales + 8 groups j
  u32 w;          // slot j's weights at w + 2 KB groups j
  bool lds_scales;
};

template <u32 groups>
MONO_DEV lin_ring lin_ring_of(const lin_matrix& m, const lin_plan& p, bool fp8, u32 used, u32 min_steps) {
  lin_ring g;
  g.per_round = (p.units + p.share - 1) / p.share;
  g.steps = p.rounds * g.per_round;
  g.bar = (used + 15u) & ~15u;
  g.scales = g.bar + 8u * LIN_RING_MAX;
  g.w = (g.scales + 8u * groups * LIN_RING_MAX + 127u) & ~127u;
  g.lds_scales = fp8 && p.share % 2 == 0 && p.units % 2 == 0 && ((u64)m.scales & 15u) == 0;
  const u32 lds = lin_dynamic_lds(), slot = groups * LIN_UNIT_BYTES;
  const u32 fit = lin_min(lin_min(lds > g.w ? (lds - g.w) / slot : 0u, LIN_RING_MAX), g.steps);
  // One slot for a longer range would leave nothing in flight while it is multiplied.
  g.slots = (g.steps >= min_steps && (fit >= 2 || fit == g.steps)) ? fit : 0u;
  return g;
}

// Step s's copies into its slot, by one thread.
template <class Team>
MONO_DEV void lin_ring_issue(const lin_matrix& m, const lin_plan& p, const lin_ring& g, u32 first, u32 base, u32 s) {
  constexpr u32 groups = Team::size / LIN_GROUP, slot_bytes = groups * LIN_UNIT_BYTES;
  const u32 slot = s % g.slots, r = s / g.per_round, u0 = (s % g.per_round) * p.share;
  const u32 nu = lin_min(p.share, p.units - u0), tiles = lin_min(p.across, p.count - r * p.across);
  const u32 bar = base + g.bar + 8u * slot;
  mono_lds_barrier_expect(bar, tiles * nu * (LIN_UNIT_BYTES + (g.lds_scales ? 8u : 0u)));
  // Where a tile's run is the whole tile (a short k), the step's tiles lie end to end in memory
  // and in the slot: one copy for them all, not one a tile. The leader issues every copy, and the
  // 48 of three steps of 8 down tiles held its team about 5 us (PERF.md).
  const u32 per = nu == p.units ? tiles : 1u;
  for (u32 q = 0; q < tiles; q += per) {
    const u64 unit = (u64)(first + r * p.across + q) * p.units + u0;
    const u32 dst = base + g.w + slot * slot_bytes + q * p.share * LIN_UNIT_BYTES, len = per * nu * LIN_UNIT_BYTES;
    // In pieces of at most LIN_RING_PIECE (a run is at most 32 KB, so one): the plain single
    // copy made the fused attention kernel spill about 170 bytes more (nvrtc 13.0).
    for (u32 at = 0; at < len; at += LIN_RING_PIECE)
      mono_copy_bulk(dst + at, m.w + unit * LIN_UNIT_BYTES + at, lin_min(LIN_RING_PIECE, len - at), bar);
    if (g.lds_scales)
      mono_copy_bulk(base + g.scales + 8u * (slot * groups + q * p.share), m.scales + unit * 2, per * nu * 8u, bar);
  }
}

// Every slot's first step in flight: the ring's barriers set up, then its first `slots` steps
// issued by the leader.
template <class Team>
MONO_DEV void lin_ring_fill(const Team& team, const lin_matrix& m, const lin_plan& p, const lin_ring& g, u32 first,
                            u8* smem) {
  const u32 base = mono_lds_address(smem);
  // The previous task's plain stores to this LDS come before the copy engine's writes.
  mono_fence_lds_async();
  team.sync();
  if (team.leader()) {
    for (u32 j = 0; j < g.slots; ++j) mono_lds_barrier_init(base + g.bar + 8u * j);
    for (u32 s = 0; s < g.slots; ++s) lin_ring_issue<Team>(m, p, g, first, base, s);
  }
}

// `filled`: lin_ring_fill already ran for this range and ring (a task that fills the ring of a
// later range early, before an earlier one runs through registers below it).
template <bool FP8, u32 RT, class Team, class Ready>
MONO_DEV bool lin_tiles_ring(const Team& team, const lin_matrix& m, const lin_plan& p, const lin_ring& g, u32 first,
                             u8* smem, float* parts, u16* xs, u32 xstride, bool filled, Ready ready) {
  constexpr u32 groups = Team::size / LIN_GROUP, slot_bytes = groups * LIN_UNIT_BYTES;
  constexpr u32 unit_k = FP8 ? LIN_K_BLOCK : LIN_K_BLOCK / 2;
  const u32 grp = team.thread() / LIN_GROUP, lane = team.thread() % LIN_GROUP;
  const u32 base = mono_lds_address(smem);

  LIN_STAMP(team, LIN_STAMP_TILE, p.units);
  if (!filled) lin_ring_fill(team, m, p, g, first, smem);
  lin_prefetch_residual(team, m, first, p.count);
  if (!ready()) {
    // The copies still land in this LDS: let them before the CTA stops.
    for (u32 j = 0; j < g.slots; ++j) mono_lds_barrier_wait(base + g.bar + 8u * j, 0);
    return false;
  }
  LIN_STAMP(team, LIN_STAMP_READY, 0u);
  lin_stage(team, m, xs, xstride, parts);
  LIN_STAMP(team, LIN_STAMP_X, 0u);

  lin_acc<RT> acc;
  acc.zero();
  for (u32 s = 0; s < g.steps; ++s) {
    const u32 r = s / g.per_round, i = s % g.per_round, slot = s % g.slots;
    if (s > 0 && s - 1 + g.slots < g.steps) {
      if (i != 0) team.sync();
      if (team.leader()) lin_ring_issue<Team>(m, p, g, first, base, s - 1 + g.slots);
    }
    mono_lds_barrier_wait(base + g.bar + 8u * slot, (s / g.slots) & 1u);
    if (s == 0) LIN_STAMP(team, LIN_STAMP_FIRST, 0u);
    if (s + 1 == g.steps) LIN_STAMP(team, LIN_STAMP_LAST, 0u);
    u32 tile = 0, unit = 0;
    if (lin_batch(p, grp, r, i, &tile, &unit)) {
      const mono_u32x4* src = (const mono_u32x4*)(smem + g.w + slot * slot_bytes + grp * LIN_UNIT_BYTES) + lane;
      mono_u32x4 w[LIN_LOADS];
#pragma unroll
      for (u32 j = 0; j < LIN_LOADS; ++j) w[j] = src[j * LIN_GROUP];
      float s0 = 0.f, s1 = 0.f;
      if (FP8) {
        const float* sc = g.lds_scales ? (const float*)(smem + g.scales + 8u * (slot * groups + grp))
                                       : m.scales + ((u64)(first + tile) * p.units + unit) * 2;
        s0 = sc[0], s1 = sc[1];
      }
      lin_multiply<FP8, RT>(acc, w, xs, xstride, m.rows, unit * unit_k, s0, s1, lane);
    }
    if (s + 1 == g.steps) LIN_STAMP_GROUP(grp, lane);
    if (i + 1 == g.per_round) {
      lin_flush<RT>(acc, lin_group_sums(parts, grp, RT), lane);
      lin_rounds_end<RT>(team, m, p, r, 1u, first, parts, parts);
      acc.zero();
    }
  }
  // The last round's end was a team barrier after every wait: the barriers' words go back to
  // plain LDS.
  if (team.leader())
    for (u32 j = 0; j < g.slots; ++j) mono_lds_barrier_inval(base + g.bar + 8u * j);
  lin_stamp_slowest(team);
  LIN_STAMP(team, LIN_STAMP_STORED, 0u);
  return true;
}
#endif

// The mma's 8-row tiles m's x rows take (RT; host twin: src/layout.rs `row_tiles`).
MONO_DEV u32 lin_row_tiles(const lin_matrix& m) { return m.rows > 8 ? 2u : 1u; }
// Bytes of the team's LDS a range's first slot of partial sums and x take (its ring lies beyond
// them), and those a range through registers takes with its further slots.
MONO_DEV u32 lin_lds_used(u32 groups, const lin_matrix& m) {
  return lin_partial_floats(groups, lin_row_tiles(m)) * 4u + m.rows * lin_x_stride(m.k) * 2u;
}
MONO_DEV u32 lin_lds_regs(u32 groups, const lin_matrix& m) {
  const u32 rt = lin_row_tiles(m);
  return lin_lds_used(groups, m) + (lin_wide_rounds(rt) - 1u) * lin_partial_floats(groups, rt) * 4u;
}

// Where a range's ring may lie and from how many steps it takes one (lin_tiles_ring), and
// whether lin_ring_start already filled it. A task that runs two ranges fills the second one's
// ring before the first runs through registers below it: `from` past both ranges' partials and x.
struct lin_ring_use {
  u32 from;       // the ring starts at or beyond this LDS offset
  u32 min_steps;  // the fewest steps a range takes to go through the ring (~0u: registers only)
  bool filled;
};
MONO_DEV lin_ring_use lin_ring_default() { return {0u, LIN_RING_MIN_STEPS, false}; }

#if MONO_NVIDIA && defined(MONO_CTA_THREADS)
// The ring a whole-CTA team's range takes (slots 0: none, registers), past its partials and x and
// u.from: lin_tiles_as and lin_ring_start_as must agree on it.
template <u32 groups>
MONO_DEV lin_ring lin_ring_for(const lin_matrix& m, const lin_plan& p, bool fp8, const lin_ring_use& u) {
  const u32 used = u.from > lin_lds_used(groups, m) ? u.from : lin_lds_used(groups, m);
  return lin_ring_of<groups>(m, p, fp8, used, u.min_steps);
}
#endif

// Tiles first .. first + count of matrix m, by the team; `ready()` is called by every thread after
// the first weight loads are issued and before x is read (false: stop, returned). Ends on a team
// barrier after the last store. smem: the team's LDS, at least lin_partial_floats + the x rows;
// for a team that is the whole CTA (NVIDIA), the CTA's dynamic shared memory from its start, and
// what lies beyond partials and x (and u.from) becomes the ring.
template <bool FP8, u32 RT, class Team, class Ready>
MONO_DEV bool lin_tiles_as(const Team& team, const lin_matrix& m, u32 first, u32 count, u8* smem,
                           const lin_ring_use& u, Ready ready) {
  static_assert(Team::size % LIN_GROUP == 0, "a team of whole groups of 32");
  constexpr u32 groups = Team::size / LIN_GROUP;
  constexpr u32 unit_k = FP8 ? LIN_K_BLOCK : LIN_K_BLOCK / 2;
  const lin_plan p = lin_plan_of(groups, m.k / unit_k, count);
  static_assert(lin_partial_floats(groups, RT) >= lin_norm_scratch_floats<Team>(), "x's prologue sums in a slot");
  float* parts = (float*)smem;
  u16* xs = (u16*)(parts + lin_partial_floats(groups, RT));
  const u32 xstride = lin_x_stride(m.k);
#if MONO_NVIDIA && defined(MONO_CTA_THREADS)
  if (Team::size == MONO_CTA_THREADS) {
    const lin_ring g = lin_ring_for<groups>(m, p, FP8, u);
    if (g.slots) return lin_tiles_ring<FP8, RT>(team, m, p, g, first, smem, parts, xs, xstride, u.filled, ready);
  }
#else
  (void)u;
#endif
  return lin_tiles_regs<FP8, RT>(team, m, p, first, parts, xs, xstride, ready);
}

// The ring lin_tiles_as(.., u, ..) will take for this range, filled now (its first steps in
// flight); false where it takes none (registers, or no copy engine).
template <bool FP8, u32 RT, class Team>
MONO_DEV bool lin_ring_start_as(const Team& team, const lin_matrix& m, u32 first, u32 count, u8* smem,
                                const lin_ring_use& u) {
#if MONO_NVIDIA && defined(MONO_CTA_THREADS)
  constexpr u32 groups = Team::size / LIN_GROUP;
  constexpr u32 unit_k = FP8 ? LIN_K_BLOCK : LIN_K_BLOCK / 2;
  if (Team::size == MONO_CTA_THREADS) {
    const lin_plan p = lin_plan_of(groups, m.k / unit_k, count);
    const lin_ring g = lin_ring_for<groups>(m, p, FP8, u);
    if (g.slots) {
      lin_ring_fill(team, m, p, g, first, smem);
      return true;
    }
  }
#else
  (void)team, (void)m, (void)first, (void)count, (void)smem, (void)u;
#endif
  return false;
}

// The same for any matrix: dispatches on its format and row count.
template <class Team, class Ready>
MONO_DEV bool lin_tiles(const Team& team, const lin_matrix& m, u32 first, u32 count, u8* smem, const lin_ring_use& u,
                        Ready ready) {
  const bool fp8 = (m.flags & LIN_FP8) != 0, wide = lin_row_tiles(m) == 2u;
  if (fp8) return wide ? lin_tiles_as<true, 2>(team, m, first, count, smem, u, ready)
                       : lin_tiles_as<true, 1>(team, m, first, count, smem, u, ready);
  return wide ? lin_tiles_as<false, 2>(team, m, first, count, smem, u, ready)
              : lin_tiles_as<false, 1>(team, m, first, count, smem, u, ready);
}

template <class Team>
MONO_DEV bool lin_ring_start(const Team& team, const lin_matrix& m, u32 first, u32 count, u8* smem,
                             const lin_ring_use& u) {
  const bool fp8 = (m.flags & LIN_FP8) != 0, wide = lin_row_tiles(m) == 2u;
  if (fp8) return wide ? lin_ring_start_as<true, 2>(team, m, first, count, smem, u)
                       : lin_ring_start_as<true, 1>(team, m, first, count, smem, u);
  return wide ? lin_ring_start_as<false, 2>(team, m, first, count, smem, u)
              : lin_ring_start_as<false, 1>(team, m, first, count, smem, u);
}
