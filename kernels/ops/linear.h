// The weight-streaming linear tile: y[r, c] = sum_k x[r, k] W[c, k] for up to 16 rows of bf16 x,
// fp32 sums, W FP8 E4M3 with fp32 128 x 128 block scales or bf16, streamed from the packed layout
// of crates/model/src/weights/packed.rs (read it first: tiles of 16 packed rows in two halves,
// k-blocks of 128, each lane's 16-byte load holding its m16n8k16 A operand).
//
// A team runs a range of tiles of one matrix (lin_tiles). Its threads form groups of 32 (a warp
// on NVIDIA, half a wave on AMD); a group streams batches of 4 loads a lane (a k-block of FP8,
// half one of bf16), each batch's loads
// issued while the batch before it is being multiplied, the very first before the caller's
// `ready` (the wait on the input: weights never wait on a hand-off). The groups split a round of
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

// One matrix of a launch (src/gpu.rs `LinMatrix`, 80 bytes).
struct lin_matrix {
  const u8* w;             // packed weight
  const float* scales;     // packed scales [tiles][k-blocks][2] (FP8)
  const u16* x;            // [rows, x_stride] bf16, 16-byte aligned rows
  void* y;                 // [rows, y_stride] bf16 or fp32
  const u16* residual;     // [rows, y_stride] bf16 (LIN_RESIDUAL)
  const float* row_scale;  // [rows] (LIN_ROW_SCALE)
  u32 k;                   // multiple of 128
  u32 n;                   // output columns
  u32 tiles;
  u32 rows;                // 1..16
  u32 x_stride;            // elements, multiple of 8
  u32 y_stride;            // elements
  u32 flags;
  u32 pad;
};

// LDS a team needs (host twin: src/layout.rs `lds_bytes`): the groups' partial sums, then x.
MONO_DEV u32 lin_partial_floats(u32 groups, u32 row_tiles) { return groups * LIN_TILE_ROWS * 8u * row_tiles; }
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
    for (u32 h = 0; h < 2; ++h)
      for (u32 r = 0; r < 8 * RT; ++r) v[h][r] = 0.f;
#endif
  }
};

// Multiplies one batch (its first k is k_base) into `acc`: the lane's loads in `w`, x in LDS (xs:
// 8 RT rows of lin_x_stride(k)), s0/s1 the halves' scales (FP8).
template <bool FP8, u32 RT>
MONO_DEV void lin_multiply(lin_acc<RT>& acc, const mono_u32x4* w, const u16* xs, u32 xstride, u32 k_base, float s0,
                           float s1, u32 lane) {
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
        const u16* xr = xs + (8 * rt + g) * xstride + k0;
        mono_mma_m16n8k16_bf16(FP8 ? tmp[rt] : acc.c[rt], a, *(const u32*)xr, *(const u32*)(xr + 8));
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
  float tmp[2][8 * RT];
  for (u32 h = 0; h < 2; ++h)
    for (u32 r = 0; r < 8 * RT; ++r) tmp[h][r] = 0.f;
  constexpr u32 E = FP8 ? 16u : 8u;
  for (u32 j = 0; j < L; ++j) {
    for (u32 i = 0; i < E; ++i) {
      const u32 word = lin_word(w[j], FP8 ? i / 4 : i / 2);
      const float wv = FP8 ? mono_e4m3_to_f32((u8)(word >> (8 * (i % 4))))
                           : mono_bf16_to_f32((u16)(word >> (16 * (i % 2))));
      const u32 s = i / 8, reg = (i % 8) / 2, e = i % 2;
      const u32 h = reg & 1u, k = k_base + j * KL + 16 * s + 2 * t + 8 * (reg >> 1) + e;
      for (u32 r = 0; r < 8 * RT; ++r) {
        const float p = wv * mono_bf16_to_f32(xs[r * xstride + k]);
        if (FP8)
          tmp[h][r] += p;
        else
          acc.v[h][r] += p;
      }
    }
  }
  if (FP8)
    for (u32 r = 0; r < 8 * RT; ++r) {
      acc.v[0][r] += s0 * tmp[0][r];
      acc.v[1][r] += s1 * tmp[1][r];
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
  for (u32 h = 0; h < 2; ++h)
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

// Issues the loads of batch (tile, unit) for lane `lane` of a group.
MONO_DEV void lin_load(mono_u32x4* dst, const lin_matrix& m, u32 units, u32 tile, u32 unit, u32 lane) {
  const mono_u32x4* src = (const mono_u32x4*)m.w + ((u64)tile * units + unit) * (LIN_LOADS * LIN_GROUP) + lane;
#pragma unroll
  for (u32 j = 0; j < LIN_LOADS; ++j) dst[j] = src[j * LIN_GROUP];
}

// Tiles first .. first + count of matrix m, by the team; `ready()` is called by every thread after
// the first weight loads are issued and before x is read (false: stop, returned). Ends on a
// team barrier after the last store.
template <bool FP8, u32 RT, class Team, class Ready>
MONO_DEV bool lin_tiles_as(const Team& team, const lin_matrix& m, u32 first, u32 count, u8* smem, Ready ready) {
  static_assert(Team::size % LIN_GROUP == 0, "a team of whole groups of 32");
  constexpr u32 L = LIN_LOADS, RS = 8 * RT, groups = Team::size / LIN_GROUP;
  constexpr u32 unit_k = FP8 ? LIN_K_BLOCK : LIN_K_BLOCK / 2;
  const u32 grp = team.thread() / LIN_GROUP, lane = team.thread() % LIN_GROUP;
  const lin_plan p = lin_plan_of(groups, m.k / unit_k, count);
  float* parts = (float*)smem;
  u16* xs = (u16*)(parts + lin_partial_floats(groups, RT));
  const u32 xstride = lin_x_stride(m.k);

  mono_u32x4 cur[L], nxt[L];
  u32 cr = 0, ci = 0, ctile = 0, cunit = 0;
  bool have = lin_batch(p, grp, 0, 0, &ctile, &cunit);
  if (have) lin_load(cur, m, p.units, first + ctile, cunit, lane);
  if (!ready()) return false;

  // x to LDS, rows past m.rows as zeros.
  const u32 chunks = m.k / 8;
  for (u32 i = team.thread(); i < RS * chunks; i += Team::size) {
    const u32 r = i / chunks, c = i % chunks;
    mono_u32x4 v = {0u, 0u, 0u, 0u};
    if (r < m.rows) v = *(const mono_u32x4*)(m.x + (u64)r * m.x_stride + 8 * c);
    *(mono_u32x4*)(xs + r * xstride + 8 * c) = v;  // rows of 2 k + 16 bytes stay 16-byte aligned
  }
  team.sync();

  const u32 cols = (m.flags & LIN_SWIGLU) ? LIN_HALF_ROWS : LIN_TILE_ROWS;
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
      lin_multiply<FP8, RT>(acc, cur, xs, xstride, cunit * unit_k, s0, s1, lane);
#pragma unroll
      for (u32 j = 0; j < L; ++j) cur[j] = nxt[j];
      cr = nr, ci = ni, ctile = ntile, cunit = nunit, have = nhave;
    }
    lin_flush<RT>(acc, parts + grp * LIN_TILE_ROWS * RS, lane);
    team.sync();
    // The G parts of each output, in group order, then the epilogue.
    const u32 items = p.across * cols * m.rows;
    for (u32 it = team.thread(); it < items; it += Team::size) {
      const u32 pp = it / (cols * m.rows), n = it / m.rows % cols, row = it % m.rows;
      const u32 t = r * p.across + pp;
      if (t >= count) continue;
      const u32 col = (first + t) * cols + n;
      if (col >= m.n) continue;
      const float* part = parts + pp * p.share * LIN_TILE_ROWS * RS;
      float v = 0.f, u = 0.f;
      for (u32 q = 0; q < p.share; ++q) v += part[(q * LIN_TILE_ROWS + n) * RS + row];
      const u64 at = (u64)row * m.y_stride + col;
      if (m.flags & LIN_OUT_F32) {
        ((float*)m.y)[at] = v;
        continue;
      }
      if (m.flags & LIN_SWIGLU) {
        for (u32 q = 0; q < p.share; ++q) u += part[(q * LIN_TILE_ROWS + n + LIN_HALF_ROWS) * RS + row];
        v = lin_bf16(lin_silu(lin_bf16(v))) * lin_bf16(u);
      } else {
        if (m.flags & LIN_ROW_SCALE) v = lin_bf16(v) * m.row_scale[row];
        if (m.flags & LIN_RESIDUAL) v = mono_bf16_to_f32(m.residual[at]) + lin_bf16(v);
      }
      ((u16*)m.y)[at] = mono_f32_to_bf16(v);
    }
    team.sync();
  }
  return true;
}

// The same for any matrix: dispatches on its format and row count.
template <class Team, class Ready>
MONO_DEV bool lin_tiles(const Team& team, const lin_matrix& m, u32 first, u32 count, u8* smem, Ready ready) {
  const bool fp8 = (m.flags & LIN_FP8) != 0, wide = m.rows > 8;
  if (fp8) return wide ? lin_tiles_as<true, 2>(team, m, first, count, smem, ready)
                       : lin_tiles_as<true, 1>(team, m, first, count, smem, ready);
  return wide ? lin_tiles_as<false, 2>(team, m, first, count, smem, ready)
              : lin_tiles_as<false, 1>(team, m, first, count, smem, ready);
}
