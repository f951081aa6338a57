// The innermost tile of scoring, the only per-platform code of the indexer: one row's heads (A, in
// registers) times a tile of keys (B, in LDS) on the matrix units, f16 in, f32 accumulate, then
// ReLU, head weights and the sum over heads. Two methods (FP8_QUERY picks): f16 (below) and FP8.
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

#if IDX_FP8_QUERY && !MONO_NVIDIA
#error "FP8_QUERY scoring is written for NVIDIA mma.sync e4m3; AMD scores with f16 MFMA (FP8_QUERY 0)"
#endif

// Bytes of a key in LDS: E4M3 as cached (FP8), or widened to f16.
#define IDX_TOKEN_BYTES (IDX_HEAD_DIM * (IDX_FP8_QUERY ? 1 : 2))
// Matrix-op k-steps of a head: k32 for FP8, k16 for f16.
#define IDX_K_STEPS (IDX_HEAD_DIM / (IDX_FP8_QUERY ? 32 : 16))
#define IDX_M_TILES ((IDX_HEADS + 15) / 16)
static_assert(IDX_HEAD_DIM % 64 == 0, "k-groups need whole 16-byte chunks, two per k-group");

// 16-byte chunk `chunk` of batch token `token`. With tokens of 128 bytes or more, odd tokens swap
// chunk halves of 64 bytes, so that the two tokens a phase of B-fragment loads reads (8 lanes:
// tokens n, n + 1, four chunks each) fall on different banks; shorter tokens already do.
#define IDX_SWIZZLE (IDX_TOKEN_BYTES >= 128 ? 4u : 0u)
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

// Stores 16 dims of a key (16 * piece ..) into the batch's LDS in the method's format.
MONO_DEV void idx_store_key_piece(u8* keys, u32 token, u32 piece, const mono_u32x4& v) {
#if IDX_FP8_QUERY
  *(mono_u32x4*)(keys + idx_chunk_offset(token, piece)) = v;
#else
  u32 f[8];
  idx_e4m3x4_to_f16(v.x, &f[0], &f[1]);
  idx_e4m3x4_to_f16(v.y, &f[2], &f[3]);
  idx_e4m3x4_to_f16(v.z, &f[4], &f[5]);
  idx_e4m3x4_to_f16(v.w, &f[6], &f[7]);
  *(mono_u32x4*)(keys + idx_chunk_offset(token, 2u * piece)) = mono_u32x4{f[0], f[1], f[2], f[3]};
  *(mono_u32x4*)(keys + idx_chunk_offset(token, 2u * piece + 1u)) = mono_u32x4{f[4], f[5], f[6], f[7]};
#endif
}

// Stores a key word (dims 4 word .. +3) the same way.
MONO_DEV void idx_store_key_word(u8* keys, u32 token, u32 word, u32 value) {
#if IDX_FP8_QUERY
  *(u32*)(keys + idx_chunk_offset(token, word / 4u) + 4u * (word % 4u)) = value;
#else
  u32* dst = (u32*)(keys + idx_chunk_offset(token, word / 2u) + 8u * (word % 2u));
  idx_e4m3x4_to_f16(value, dst, dst + 1);
#endif
}

MONO_DEV u32 idx_pack_f16x2(float lo, float hi) {
#if MONO_NVIDIA
  u16 l, h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(l) : "f"(lo));
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(hi));
  return (u32)l | ((u32)h << 16);
#else
  return (u32)__builtin_bit_cast(u16, (_Float16)lo) | ((u32)__builtin_bit_cast(u16, (_Float16)hi) << 16);
#endif
}

// A word of two bf16 times `mul` (a power of two) as two f16.
MONO_DEV u32 idx_bf16x2_to_f16x2(u32 w, float mul) {
  return idx_pack_f16x2(mono_bits_f32(w << 16) * mul, mono_bits_f32(w & 0xffff0000u) * mul);
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

// Pair index (within a head) of k-step j's first two dims for k-group kg. Under FP8 the same
// formula gives the word (of four dims) of a k-step's first register.
MONO_DEV u32 idx_pair_of(u32 j, u32 kg) { return 4u * (4u * (j / 2u) + kg) + 2u * (j % 2u); }

#if MONO_NVIDIA && IDX_FP8_QUERY
// mma.m16n8k32 e4m3: rows = heads, columns = 8 tokens. Lane (g = lane / 4, kg = lane % 4) holds A
// rows g and g + 8 of each head tile (registers 0/1: k 4kg..+3 of heads g/g+8; 2/3: k 16+4kg..+3),
// B column g (b0: k 4kg..+3; b1: k 16+4kg..+3), and accumulators of heads g, g + 8 at tokens 2kg,
// 2kg + 1. k-step j's registers r = 0, 1 are key word idx_pair_of(j, kg) + r, so a lane's B of two
// k-steps is one 16-byte chunk. Products of E4M3 are exact in f32; K = 32 a step.
#define IDX_TILE_TOKENS 8
// A wave holds one head tile, as with f16: two would spill beside a batch's loads in flight.
#define IDX_WAVE_M_TILES 1
struct idx_qfrag {
  u32 a[IDX_WAVE_M_TILES][IDX_K_STEPS][4];
  float w[IDX_WAVE_M_TILES][2];  // heads 16m + g and 16m + g + 8
};

// Head tiles m0 .. of the row whose published words (HEADS * HEAD_DIM / 4 E4M3 words, then HEADS
// weights with the query scales in them) are at `stage`.
MONO_DEV void idx_load_query(const u32* stage, u32 m0, idx_qfrag& q) {
  const u32 g = mono_lane() >> 2, kg = mono_lane() & 3u;
#pragma unroll
  for (u32 m = 0; m < IDX_WAVE_M_TILES; ++m) {
#pragma unroll
    for (u32 half = 0; half < 2; ++half) {
      const u32 head = 16u * (m0 + m) + g + 8u * half;
      const bool valid = head < IDX_HEADS;
      const u32* words = stage + (valid ? head : 0u) * (IDX_HEAD_DIM / 4);
#pragma unroll
      for (u32 j = 0; j < IDX_K_STEPS; ++j) {
        q.a[m][j][half] = valid ? words[idx_pair_of(j, kg)] : 0u;
        q.a[m][j][half + 2] = valid ? words[idx_pair_of(j, kg) + 1u] : 0u;
      }
      q.w[m][half] = valid ? mono_bits_f32(stage[IDX_QUERY_VALUE_WORDS + head]) : 0.0f;
    }
  }
}

MONO_DEV void idx_mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#elif MONO_NVIDIA
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

MONO_DEV void idx_mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif

#if MONO_NVIDIA
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
      idx_mma(acc[m], q.a[m][2 * c], b.x, b.y);
      idx_mma(acc[m], q.a[m][2 * c + 1], b.z, b.w);
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
typedef _Float16 idx_half4 __attribute__((ext_vector_type(4)));
typedef float idx_float4 __attribute__((ext_vector_type(4)));
typedef u32 idx_u32x2 __attribute__((ext_vector_type(2)));

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

MONO_DEV idx_half4 idx_as_half4(u32 lo, u32 hi) {
  const idx_u32x2 v = {lo, hi};
  return __builtin_bit_cast(idx_half4, v);
}

// The wave's heads' share of the scores of tokens n0 .. n0 + 15 (before the key scales): lane
// r < 16 returns token n0 + r's in s[0].
MONO_DEV void idx_tile(const idx_qfrag& q, const u8* keys, u32 n0, float (&s)[1]) {
  const u32 r = mono_lane() & 15u, kg = mono_lane() >> 4;
  idx_float4 acc[IDX_WAVE_M_TILES];
#pragma unroll
  for (u32 m = 0; m < IDX_WAVE_M_TILES; ++m) acc[m] = idx_float4{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (u32 c = 0; c < IDX_K_STEPS / 2; ++c) {
    const mono_u32x4 b = *(const mono_u32x4*)(keys + idx_chunk_offset(n0 + r, 4u * c + kg));
#pragma unroll
    for (u32 m = 0; m < IDX_WAVE_M_TILES; ++m) {
      acc[m] = __builtin_amdgcn_mfma_f32_16x16x16f16(idx_as_half4(q.a[m][2 * c][0], q.a[m][2 * c][1]),
                                                     idx_as_half4(b.x, b.y), acc[m], 0, 0, 0);
      acc[m] = __builtin_amdgcn_mfma_f32_16x16x16f16(idx_as_half4(q.a[m][2 * c + 1][0], q.a[m][2 * c + 1][1]),
                                                     idx_as_half4(b.z, b.w), acc[m], 0, 0, 0);
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
