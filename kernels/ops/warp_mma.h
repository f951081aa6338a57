// Wave-scope matrix operations: one warp's (NVIDIA, 32 lanes) or one wave's (AMD, 64 lanes) matrix
// instruction on register fragments, f16 or bf16 inputs and f32 accumulators. The fragment shapes differ by
// vendor (NVIDIA mma.sync m16n8k16, AMD MFMA 16x16x16), so each has its own function, defined only
// on its platform; a stage's innermost tile function picks one behind `#if MONO_NVIDIA`.
#pragma once
#include "prelude.h"

// Two f32 to an f16 pair (round to nearest even), `lo` in the low half.
MONO_DEV u32 mono_pack_f16x2(float lo, float hi) {
#if MONO_NVIDIA
  u16 l, h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(l) : "f"(lo));
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(hi));
  return (u32)l | ((u32)h << 16);
#else
  return (u32)__builtin_bit_cast(u16, (_Float16)lo) | ((u32)__builtin_bit_cast(u16, (_Float16)hi) << 16);
#endif
}

#if MONO_NVIDIA
// mma.sync.m16n8k16 f16 x f16 + f32: d (+)= A B with A 16 x 16 (a[0..4), two f16 each), B 16 x 8
// (b0, b1), d 16 x 8. Lane (g = lane / 4, q = lane % 4): a[0]/a[1] are rows g/g + 8 at k 2q, 2q + 1;
// a[2]/a[3] the same rows at k 2q + 8, 2q + 9; b0 is column g at k 2q, 2q + 1, b1 at k 2q + 8, 2q + 9;
// d[0], d[1] are row g at columns 2q, 2q + 1, d[2], d[3] row g + 8.
MONO_DEV void mono_mma_m16n8k16_f16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The same shape and fragments with bf16 inputs.
MONO_DEV void mono_mma_m16n8k16_bf16(float* d, const u32 (&a)[4], u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#elif MONO_HOST
// The host stand-in (kernels/host): NVIDIA's fragments, so a stage's NVIDIA tile runs on CPU
// threads. A lane gathers the A rows and B columns it needs from the lanes that hold them, a word
// (two halves of k) at a time, and sums in k order: the same products as the hardware's, added in
// an order of its own.
MONO_DEV float mono_f16_to_f32(u32 half_bits) { return (float)__builtin_bit_cast(_Float16, (u16)half_bits); }
template <class Half>
MONO_DEV void mono_mma_m16n8k16_host(float* d, const u32 (&a)[4], u32 b0, u32 b1, Half half) {
  const u32 lane = mono_lane(), g = lane >> 2, q = lane & 3u;
  for (u32 kk = 0; kk < 8; ++kk) {
    const u32 hi = kk >= 4 ? 2u : 0u, src = kk & 3u;
    const u32 a_lo = mono_shfl(a[hi], 4u * g + src), a_hi = mono_shfl(a[hi + 1u], 4u * g + src);
    const u32 b_0 = mono_shfl(kk >= 4 ? b1 : b0, 4u * (2u * q) + src);
    const u32 b_1 = mono_shfl(kk >= 4 ? b1 : b0, 4u * (2u * q + 1u) + src);
    for (u32 h = 0; h < 2; ++h) {
      const u32 sh = 16u * h;
      const float x0 = half(a_lo >> sh), x1 = half(a_hi >> sh), y0 = half(b_0 >> sh), y1 = half(b_1 >> sh);
      d[0] += x0 * y0;
      d[1] += x0 * y1;
      d[2] += x1 * y0;
      d[3] += x1 * y1;
    }
  }
}
MONO_DEV void mono_mma_m16n8k16_f16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  mono_mma_m16n8k16_host(d, a, b0, b1, [](u32 v) { return mono_f16_to_f32(v & 0xffffu); });
}
MONO_DEV void mono_mma_m16n8k16_bf16(float* d, const u32 (&a)[4], u32 b0, u32 b1) {
  mono_mma_m16n8k16_host(d, a, b0, b1, [](u32 v) { return mono_bits_f32((v & 0xffffu) << 16); });
}
#elif MONO_AMD
typedef float mono_f32x4 __attribute__((ext_vector_type(4)));
// v_mfma_f32_16x16x16f16: acc + A B with A 16 x 16 and B 16 x 16. Lane (r = lane % 16, kg = lane /
// 16): (a0, a1) are A row r at k 4kg .. 4kg + 3 (two f16 each), (b0, b1) B column r at the same k;
// the result's element i is row 4kg + i, column r.
MONO_DEV mono_f32x4 mono_mfma_16x16x16_f16(mono_f32x4 acc, u32 a0, u32 a1, u32 b0, u32 b1) {
  typedef _Float16 half4 __attribute__((ext_vector_type(4)));
  typedef u32 u32x2 __attribute__((ext_vector_type(2)));
  const u32x2 a = {a0, a1}, b = {b0, b1};
  return __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(half4, a), __builtin_bit_cast(half4, b), acc, 0, 0, 0);
}
#endif
