// The innermost tile of scoring, the only per-platform code of the indexer: one row's heads (A, in
// registers) times a tile of keys (B, in LDS) on the matrix units, f16 in, f32 accumulate, then
// ReLU, head weights and the sum over heads: the mma path (mma.sync on NVIDIA, MFMA on AMD) with
// bf16 queries, and the wgmma page (sm_90a) with FP8 queries, below it. The matrix instructions
// themselves are the ops layer's (ops/warp_mma.h, ops/warpgroup_mma.h).
//
// Numbers: keys sit in LDS as f16 of value e4m3 * 2^-8 (exact, see idx_e4m3x4_to_f16); each head of
// the query is scaled by a power of two 2^-e that puts its largest element in [2^14, 2^15) and
// rounded to f16, exact for every bf16 element above 2^-28 of the head's largest. The head weights
// carry 2^e * 2^8 back, so a tile's sums equal sum_h w_h ReLU(q_h . k_t) up to fp32 accumulation.
//
// Order of the contraction: the dot product may visit the dims in any order as long as A and B
// agree. Both take k-step j of a lane's dims from 16-byte f16 chunk (4 * (j / 2) + kg) of the key,
// where kg is the lane's k-group (NVIDIA: lane % 4; AMD: lane / 16), so a lane reads its B
// fragments as whole 16-byte chunks: (j % 2) picks the chunk's first or second four dims.
#pragma once
#include "idx_common.h"
#include "ops/warp_mma.h"
#include "ops/warpgroup_mma.h"

#if IDX_WGMMA && !(MONO_NVIDIA && IDX_HEAD_DIM == 128 && IDX_HEADS == 32)
#error "WGMMA scoring is written for NVIDIA sm_90a, 32 heads of 128 (GLM-5's indexer)"
#endif

// Bytes of a key in LDS: E4M3 as cached (wgmma, which widens in registers), or widened to f16.
#define IDX_TOKEN_BYTES (IDX_HEAD_DIM * (IDX_WGMMA ? 1 : 2))
// Matrix-op k16 steps of a head.
#define IDX_K_STEPS (IDX_HEAD_DIM / 16)
#define IDX_M_TILES ((IDX_HEADS + 15) / 16)
static_assert(IDX_HEAD_DIM % 64 == 0, "k-groups need whole 16-byte chunks, two per k-group");

// 16-byte chunk `chunk` of batch token `token`. With tokens of 128 bytes or more, odd tokens swap
// chunk halves of 64 bytes, so that the two tokens a phase of B-fragment loads reads (8 lanes:
// tokens n, n + 1, four chunks each) fall on different banks; shorter tokens already do.
// Under WGMMA the copy engine lays the pages in as cached (no swizzle; the wave's A loads then meet
// 2-way bank conflicts, cheaper than copying piece by piece into a swizzled layout, measured).
#define IDX_SWIZZLE (IDX_TOKEN_BYTES >= 128 && !IDX_WGMMA ? 4u : 0u)
MONO_DEV u32 idx_chunk_offset(u32 token, u32 chunk) {
  return token * IDX_TOKEN_BYTES + 16u * (chunk ^ ((token & 1u) * IDX_SWIZZLE));
}

// Two E4M3 codes at bits 0-7 and 16-23 to two f16 of value code * 2^-8: the sign to bit 15, the
// exponent and mantissa bits under the f16 ones (bias 15 against 7 is the 2^-8; E4M3 subnormals
// land on f16 subnormals of the same scaled value).
MONO_DEV u32 idx_e4m3x2_to_f16x2(u32 x) { return ((x & 0x00800080u) << 8) | ((x & 0x007f007fu) << 7); }
// A cache word of four codes (first dim in the low byte) to f16 pairs of dims 0,1 and 2,3.
MONO_DEV void idx_e4m3x4_to_f16(u32 w, u32* lo, u32* hi) {
  *lo = idx_e4m3x2_to_f16x2((w & 0xffu) | ((w & 0xff00u) << 8));
  *hi = idx_e4m3x2_to_f16x2(((w >> 16) & 0xffu) | ((w >> 8) & 0xff0000u));
}
#define IDX_KEY_F16_SCALE 256.0f

// Stores 16 dims of a key (16 * piece ..) into the batch's LDS widened to f16 (the mma path).
MONO_DEV void idx_store_key_piece(u8* keys, u32 token, u32 piece, const mono_u32x4& v) {
  u32 f[8];
  idx_e4m3x4_to_f16(v.x, &f[0], &f[1]);
  idx_e4m3x4_to_f16(v.y, &f[2], &f[3]);
  idx_e4m3x4_to_f16(v.z, &f[4], &f[5]);
  idx_e4m3x4_to_f16(v.w, &f[6], &f[7]);
  *(mono_u32x4*)(keys + idx_chunk_offset(token, 2u * piece)) = mono_u32x4{f[0], f[1], f[2], f[3]};
  *(mono_u32x4*)(keys + idx_chunk_offset(token, 2u * piece + 1u)) = mono_u32x4{f[4], f[5], f[6], f[7]};
}

// Stores a key word (dims 4 word .. +3) in the scorer's LDS format.
MONO_DEV void idx_store_key_word(u8* keys, u32 token, u32 word, u32 value) {
#if IDX_WGMMA
  *(u32*)(keys + idx_chunk_offset(token, word / 4u) + 4u * (word % 4u)) = value;
#else
  u32* dst = (u32*)(keys + idx_chunk_offset(token, word / 2u) + 8u * (word % 2u));
  idx_e4m3x4_to_f16(value, dst, dst + 1);
#endif
}

// A word of two bf16 times `mul` (a power of two) as two f16.
MONO_DEV u32 idx_bf16x2_to_f16x2(u32 w, float mul) {
  return mono_pack_f16x2(mono_bits_f32(w << 16) * mul, mono_bits_f32(w & 0xffff0000u) * mul);
}

// 2^-e and 2^e for the head scale: e = floor(log2(amax)) - 14, kept within +-100.
MONO_DEV void idx_head_scale(float amax, float* down, float* up) {
  i32 e = (i32)((mono_f32_bits(amax) >> 23) & 0xffu) - 127 - 14;
  e = e < -100 ? -100 : (e > 100 ? 100 : e);
  *down = mono_bits_f32((u32)(127 - e) << 23);
  *up = mono_bits_f32((u32)(127 + e) << 23);
}

MONO_DEV float idx_abs_max_bf16x2(float m, u32 w) {
  const float lo = mono_bits_f32(w << 16), hi = mono_bits_f32(w & 0xffff0000u);
  return mono_fmaxf(m, mono_fmaxf(lo < 0.0f ? -lo : lo, hi < 0.0f ? -hi : hi));
}

// Pair index (within a head) of k-step j's first two dims for k-group kg.
MONO_DEV u32 idx_pair_of(u32 j, u32 kg) { return 4u * (4u * (j / 2u) + kg) + 2u * (j % 2u); }

#if MONO_NVIDIA || MONO_HOST
// mma.m16n8k16: rows = heads, columns = 8 tokens. Lane (g = lane / 4, kg = lane % 4) holds A rows
// g and g + 8 of each head tile, B column g, and accumulators of heads g, g + 8 at tokens 2kg, 2kg + 1.
#define IDX_TILE_TOKENS 8
// A wave holds one head tile: the fragments of two take half the registers of a CTA that runs two a SM.
#define IDX_WAVE_M_TILES 1
struct idx_qfrag {
  u32 a[IDX_WAVE_M_TILES][IDX_K_STEPS][4];
  float w[IDX_WAVE_M_TILES][2];  // heads 16m + g and 16m + g + 8
};

// Head tiles m0 .. m0 + WAVE_M_TILES of the row whose published words (HEADS * HEAD_DIM / 2 bf16
// pairs, then HEADS weights) are at `stage`.
MONO_DEV void idx_load_query(const u32* stage, u32 m0, idx_qfrag& q) {
  const u32 g = mono_lane() >> 2, kg = mono_lane() & 3u;
#pragma unroll
  for (u32 m = 0; m < IDX_WAVE_M_TILES; ++m) {
#pragma unroll
    for (u32 half = 0; half < 2; ++half) {
      const u32 head = 16u * (m0 + m) + g + 8u * half;
      const bool valid = head < IDX_HEADS;
      const u32* words = stage + (valid ? head : 0u) * (IDX_HEAD_DIM / 2);
      float amax = 0.0f;
#pragma unroll
      for (u32 j = 0; j < IDX_K_STEPS; ++j) {
        amax = idx_abs_max_bf16x2(amax, words[idx_pair_of(j, kg)]);
        amax = idx_abs_max_bf16x2(amax, words[idx_pair_of(j, kg) + 1u]);
      }
      // The head's other elements are in the lanes of the same g.
      amax = mono_fmaxf(amax, mono_shfl_xor_f32(amax, 1u));
      amax = mono_fmaxf(amax, mono_shfl_xor_f32(amax, 2u));
      float down, up;
      idx_head_scale(amax, &down, &up);
#pragma unroll
      for (u32 j = 0; j < IDX_K_STEPS; ++j) {
        // a0/a1: dims of pair p for heads g/g+8; a2/a3: pair p + 1.
        q.a[m][j][half] = valid ? idx_bf16x2_to_f16x2(words[idx_pair_of(j, kg)], down) : 0u;
        q.a[m][j][half + 2] = valid ? idx_bf16x2_to_f16x2(words[idx_pair_of(j, kg) + 1u], down) : 0u;
      }
      const float w = mono_bits_f32(stage[IDX_QUERY_VALUE_WORDS + (valid ? head : 0u)]);
      q.w[m][half] = valid ? w * up * IDX_KEY_F16_SCALE : 0.0f;
    }
  }
}

#endif

#if MONO_NVIDIA || MONO_HOST
// The wave's heads' share of the scores of tokens n0 .. n0 + 7 of the batch (before the key
// scales): lane kg < 4 returns those of tokens n0 + 2kg and n0 + 2kg + 1 in s[0], s[1].
MONO_DEV void idx_tile(const idx_qfrag& q, const u8* keys, u32 n0, float (&s)[2]) {
  const u32 g = mono_lane() >> 2, kg = mono_lane() & 3u;
  float acc[IDX_WAVE_M_TILES][4];
#pragma unroll
  for (u32 m = 0; m < IDX_WAVE_M_TILES; ++m) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
#pragma unroll
  for (u32 c = 0; c < IDX_K_STEPS / 2; ++c) {
    const mono_u32x4 b = *(const mono_u32x4*)(keys + idx_chunk_offset(n0 + g, 4u * c + kg));
#pragma unroll
    for (u32 m = 0; m < IDX_WAVE_M_TILES; ++m) {
      mono_mma_m16n8k16_f16(acc[m], q.a[m][2 * c], b.x, b.y);
      mono_mma_m16n8k16_f16(acc[m], q.a[m][2 * c + 1], b.z, b.w);
    }
  }
  s[0] = s[1] = 0.0f;
#pragma unroll
  for (u32 m = 0; m < IDX_WAVE_M_TILES; ++m) {
    s[0] += q.w[m][0] * mono_fmaxf(acc[m][0], 0.0f) + q.w[m][1] * mono_fmaxf(acc[m][2], 0.0f);
    s[1] += q.w[m][0] * mono_fmaxf(acc[m][1], 0.0f) + q.w[m][1] * mono_fmaxf(acc[m][3], 0.0f);
  }
#pragma unroll
  for (u32 mask = 4; mask < 32; mask <<= 1) {
    s[0] += mono_shfl_xor_f32(s[0], mask);
    s[1] += mono_shfl_xor_f32(s[1], mask);
  }
}

// Lane's tokens of a tile, for the write: how many, and the first.
#define IDX_LANE_TOKENS 2
MONO_DEV bool idx_tile_writer() { return mono_lane() < 4u; }
MONO_DEV u32 idx_tile_token() { return 2u * mono_lane(); }

#else
// v_mfma_f32_16x16x16f16: rows = heads, columns = 16 tokens. Lane (r = lane % 16, kg = lane / 16)
// holds A row r of each head tile, B column r, and accumulators of heads 4kg .. 4kg + 3 at token r.
#define IDX_TILE_TOKENS 16

// A wave holds every head tile (wave64 fragments are half the size, and VGPRs plentiful).
#define IDX_WAVE_M_TILES IDX_M_TILES
struct idx_qfrag {
  u32 a[IDX_WAVE_M_TILES][IDX_K_STEPS][2];
  float w[IDX_WAVE_M_TILES][4];  // heads 16m + 4kg + i
};

MONO_DEV void idx_load_query(const u32* stage, u32 m0, idx_qfrag& q) {
  const u32 r = mono_lane() & 15u, kg = mono_lane() >> 4;
#pragma unroll
  for (u32 m = 0; m < IDX_WAVE_M_TILES; ++m) {
    const u32 head = 16u * (m0 + m) + r;
    const bool valid = head < IDX_HEADS;
    const u32* words = stage + (valid ? head : 0u) * (IDX_HEAD_DIM / 2);
    float amax = 0.0f;
#pragma unroll
    for (u32 j = 0; j < IDX_K_STEPS; ++j) {
      amax = idx_abs_max_bf16x2(amax, words[idx_pair_of(j, kg)]);
      amax = idx_abs_max_bf16x2(amax, words[idx_pair_of(j, kg) + 1u]);
    }
    amax = mono_fmaxf(amax, mono_shfl_xor_f32(amax, 16u));
    amax = mono_fmaxf(amax, mono_shfl_xor_f32(amax, 32u));
    float down, up;
    idx_head_scale(amax, &down, &up);
#pragma unroll
    for (u32 j = 0; j < IDX_K_STEPS; ++j) {
      q.a[m][j][0] = valid ? idx_bf16x2_to_f16x2(words[idx_pair_of(j, kg)], down) : 0u;
      q.a[m][j][1] = valid ? idx_bf16x2_to_f16x2(words[idx_pair_of(j, kg) + 1u], down) : 0u;
    }
    // This lane's accumulators are heads 16m + 4kg + i, whose scales lanes 4kg + i computed.
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
      const u32 head_i = 16u * (m0 + m) + 4u * kg + i;
      const float up_i = mono_bits_f32(mono_shfl(mono_f32_bits(up), 4u * kg + i));
      const float w = mono_bits_f32(stage[IDX_QUERY_VALUE_WORDS + (head_i < IDX_HEADS ? head_i : 0u)]);
      q.w[m][i] = head_i < IDX_HEADS ? w * up_i * IDX_KEY_F16_SCALE : 0.0f;
    }
  }
}

// The wave's heads' share of the scores of tokens n0 .. n0 + 15 (before the key scales): lane
// r < 16 returns token n0 + r's in s[0].
MONO_DEV void idx_tile(const idx_qfrag& q, const u8* keys, u32 n0, float (&s)[1]) {
  const u32 r = mono_lane() & 15u, kg = mono_lane() >> 4;
  mono_f32x4 acc[IDX_WAVE_M_TILES];
#pragma unroll
  for (u32 m = 0; m < IDX_WAVE_M_TILES; ++m) acc[m] = mono_f32x4{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (u32 c = 0; c < IDX_K_STEPS / 2; ++c) {
    const mono_u32x4 b = *(const mono_u32x4*)(keys + idx_chunk_offset(n0 + r, 4u * c + kg));
#pragma unroll
    for (u32 m = 0; m < IDX_WAVE_M_TILES; ++m) {
      acc[m] = mono_mfma_16x16x16_f16(acc[m], q.a[m][2 * c][0], q.a[m][2 * c][1], b.x, b.y);
      acc[m] = mono_mfma_16x16x16_f16(acc[m], q.a[m][2 * c + 1][0], q.a[m][2 * c + 1][1], b.z, b.w);
    }
  }
  s[0] = 0.0f;
#pragma unroll
  for (u32 m = 0; m < IDX_WAVE_M_TILES; ++m)
#pragma unroll
    for (u32 i = 0; i < 4; ++i) s[0] += q.w[m][i] * mono_fmaxf(acc[m][i], 0.0f);
  s[0] += mono_shfl_xor_f32(s[0], 16u);
  s[0] += mono_shfl_xor_f32(s[0], 32u);
}

#define IDX_LANE_TOKENS 1
MONO_DEV bool idx_tile_writer() { return mono_lane() < 16u; }
MONO_DEV u32 idx_tile_token() { return mono_lane(); }
#endif

// Waves that split a row's heads: each holds WAVE_M_TILES head tiles.
#define IDX_HEAD_GROUPS (IDX_M_TILES / IDX_WAVE_M_TILES)

#if IDX_WGMMA
// wgmma.m64nNk16 f16 (sm_90a), one warpgroup (4 waves) a page: rows = the page's 64 tokens (A),
// columns = the heads of all R rows of the group (N = 32 R, B), K = 128 in eight k16 steps, f32
// accumulation. Both sides are E4M3 converted exactly to f16 (cvt.rn.f16x2.e4m3x2): the keys in
// registers, from the cached codes in LDS, right before the steps (A from registers); the
// queries once per task into an LDS tile (B, K-major, 128-byte swizzle). Why not wgmma on the E4M3
// codes directly: on the H200 its sums came out about 1.2e-4 of the row's largest score off (its
// FP8 path does not keep f32 accuracy while it adds), over the check's 1e-4 bound; f16 products
// are summed in f32.
//
// Order of the contraction: lane (g = lane / 4, q = lane % 4) of wave v holds A rows (tokens)
// 16v + g and 16v + g + 8 at k-slots 2q, 2q + 1, 2q + 8, 2q + 9 of each k16 step j; it fills them
// from key dims 32q + 4j .. 32q + 4j + 3 (one cached word), so its keys are 32 contiguous bytes a
// token. B holds the query in the same order: logical k = 16j + 2q + (s % 2) + 8 (s / 2) is dim
// 32q + 4j + s. Accumulators: tokens 16v + g (+ 8) at columns 8i + 2q + e (i < 4 R, e < 2); row
// r's heads are columns 32r .., so a token's sum over a row's heads needs only its quad's lanes.
#define IDX_WG_THREADS 128
#define IDX_WG_COLUMNS (IDX_GROUP_ROWS * IDX_HEADS)  // B tile rows: every head of every row
#define IDX_WG_QUERY_BYTES (IDX_WG_COLUMNS * IDX_HEAD_DIM * 2)

// Byte offset of (column n = row * HEADS + head, logical k) in the B tile (f16, 128-byte swizzle).
MONO_DEV u32 idx_wg_offset(u32 n, u32 k) { return mono_sw128_offset(IDX_WG_COLUMNS, n, k / 8u) + 2u * (k % 8u); }
// Logical k of key dim d (the inverse of the order above).
MONO_DEV u32 idx_wg_k_of_dim(u32 d) {
  const u32 q = d / 32u, j = (d % 32u) / 4u, s = d % 4u;
  return 16u * j + 2u * q + (s % 2u) + 8u * (s / 2u);
}

// Four E4M3 codes (first dim in the low byte) to f16 pairs of dims 0,1 and 2,3, exactly.
MONO_DEV void idx_e4m3x4_to_f16_exact(u32 w, u32* lo, u32* hi) {
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.rn.f16x2.e4m3x2 %0, l; cvt.rn.f16x2.e4m3x2 %1, h; }"
      : "=r"(*lo), "=r"(*hi)
      : "r"(w));
}

// LDS written by ordinary stores becomes visible to the tensor units' reads.
MONO_DEV void idx_lds_written() { mono_fence_lds_async(); }

// Loads at 32-bit LDS addresses. The scorer's page loop reaches its LDS from one such address (its
// ring's, which its copies and barriers need anyway): through pointers it held a second base, the
// 64-bit one of the pointers, in two more registers of the 4-row MMAs.
MONO_DEV mono_u32x4 idx_lds_u32x4(u32 at) {
  mono_u32x4 v;
  asm("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(at) : "memory");
  return v;
}
MONO_DEV u64 idx_lds_u64(u32 at) {
  u64 v;
  asm("ld.shared.u64 %0, [%1];" : "=l"(v) : "r"(at) : "memory");
  return v;
}
MONO_DEV u32 idx_lds_u32(u32 at) {
  u32 v;
  asm("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(at) : "memory");
  return v;
}

// Row r's sums over this thread's heads of ReLU(score) times the head's weight, for tokens g (x)
// and g + 8 (y); the other heads of the row are in the quad's other lanes. d: the page's
// accumulators (mono_wgmma_f16_rs order), row r's at 16 r ..
template <u32 G>
MONO_DEV void idx_wg_head_sums(const float (&d)[16 * G], u32 weights, u32 quad, float (&x)[G], float (&y)[G]) {
#pragma unroll
  for (u32 r = 0; r < G; ++r) {
    x[r] = 0.0f;
    y[r] = 0.0f;
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
      // Heads 8i + 2 quad and the next one: adjacent weights, one 8-byte load.
      const u64 pair = idx_lds_u64(weights + 4u * (r * IDX_HEADS + 8u * i + 2u * quad));
#pragma unroll
      for (u32 e = 0; e < 2; ++e) {
        const float wt = mono_bits_f32((u32)(pair >> (32u * e)));
        x[r] += wt * mono_fmaxf(d[16 * r + 4 * i + e], 0.0f);
        y[r] += wt * mono_fmaxf(d[16 * r + 4 * i + 2 + e], 0.0f);
      }
    }
  }
}

// The quad's head sums of G rows, added up: lane q gets row q's (q < G; with one row, every lane
// gets it), for both tokens. Each step trades the rows a lane does not keep for its partner's
// share of the ones it keeps: 6 shuffles at 4 rows, where summing every row in every lane takes 16.
template <u32 G>
MONO_DEV void idx_wg_quad_sum(const float (&x)[G], const float (&y)[G], u32 quad, float& sx, float& sy) {
  static_assert(G >= 1 && G <= 4, "a row a lane of the quad");
  const bool odd = quad & 1u, high = quad & 2u;
  if constexpr (G == 1) {
    sx = x[0] + mono_shfl_xor_f32(x[0], 1u);
    sy = y[0] + mono_shfl_xor_f32(y[0], 1u);
  } else if constexpr (G == 2) {
    sx = (odd ? x[1] : x[0]) + mono_shfl_xor_f32(odd ? x[0] : x[1], 1u);
    sy = (odd ? y[1] : y[0]) + mono_shfl_xor_f32(odd ? y[0] : y[1], 1u);
  } else {
    // Rows odd and odd + 2 (a missing fourth row is 0), then the one of them that is the lane's.
    auto row = [](const float (&v)[G], u32 r) { return r < G ? v[r] : 0.0f; };
    float kx[2], ky[2];
#pragma unroll
    for (u32 p = 0; p < 2; ++p) {
      kx[p] = (odd ? row(x, 2 * p + 1) : row(x, 2 * p)) + mono_shfl_xor_f32(odd ? row(x, 2 * p) : row(x, 2 * p + 1), 1u);
      ky[p] = (odd ? row(y, 2 * p + 1) : row(y, 2 * p)) + mono_shfl_xor_f32(odd ? row(y, 2 * p) : row(y, 2 * p + 1), 1u);
    }
    sx = (high ? kx[1] : kx[0]) + mono_shfl_xor_f32(high ? kx[0] : kx[1], 2u);
    sy = (high ? ky[1] : ky[0]) + mono_shfl_xor_f32(high ? ky[0] : ky[1], 2u);
    return;
  }
  sx += mono_shfl_xor_f32(sx, 2u);
  sy += mono_shfl_xor_f32(sy, 2u);
}

// Thread t (wave v, lane l) of a warpgroup holds the page's tokens 16v + l / 4 and 8 more: A's rows.
MONO_DEV u32 idx_wg_token(u32 t) { return 16u * (t / MONO_WAVE) + (t % MONO_WAVE) / 4u; }

// The scores of one page's 64 tokens for the group's R rows, before the key scales: thread t of the
// warpgroup (wave v, lane l) returns row l % 4's (when l % 4 < R) for tokens 16v + l / 4 (s[0]) and
// 16v + l / 4 + 8 (s[1]). keys: LDS address of the page as cached (idx_chunk_offset); query: the B
// tile's start field (mono_smem_desc_start); weights: LDS address of [R][HEADS] floats.
// meanwhile() runs while the tensor units work, between the MMAs' issue and the wait for them.
template <u32 R, class Meanwhile>
MONO_DEV void idx_wg_page(u32 t, u32 keys, u32 query, u32 weights, float (&s)[2], Meanwhile meanwhile) {
  const u32 quad = t % 4u, token = idx_wg_token(t);
  u32 w[2][8];  // [token g, g + 8][word j]: dims 32q + 4j .. + 3
#pragma unroll
  for (u32 h8 = 0; h8 < 2; ++h8)
#pragma unroll
    for (u32 h = 0; h < 2; ++h) {
      const mono_u32x4 v = idx_lds_u32x4(keys + idx_chunk_offset(token + 8u * h8, 2u * quad + h));
      w[h8][4 * h] = v.x;
      w[h8][4 * h + 1] = v.y;
      w[h8][4 * h + 2] = v.z;
      w[h8][4 * h + 3] = v.w;
    }
  u32 a[IDX_HEAD_DIM / 16][4];
#pragma unroll
  for (u32 j = 0; j < IDX_HEAD_DIM / 16; ++j) {
    idx_e4m3x4_to_f16_exact(w[0][j], &a[j][0], &a[j][2]);
    idx_e4m3x4_to_f16_exact(w[1][j], &a[j][1], &a[j][3]);
    mono_wgmma_hold(a[j]);
  }
  float d[16 * R] = {};
  mono_wgmma_hold(d);
  mono_wgmma_fence();
#pragma unroll
  for (u32 j = 0; j < IDX_HEAD_DIM / 16; ++j)
    mono_wgmma_f16_rs<32 * R>(d, a[j], mono_smem_desc_sw128(query + idx_wg_offset(0, 16u * j) / 16u), j > 0);
  mono_wgmma_commit();
  meanwhile();
  mono_wgmma_wait<0>();
  mono_wgmma_hold(d);
#pragma unroll
  for (u32 j = 0; j < IDX_HEAD_DIM / 16; ++j) mono_wgmma_hold(a[j]);
  float x[R], y[R];
  idx_wg_head_sums<R>(d, weights, quad, x, y);
  idx_wg_quad_sum<R>(x, y, quad, s[0], s[1]);
}
#else
MONO_DEV void idx_lds_written() {}
#endif
