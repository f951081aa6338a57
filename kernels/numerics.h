// bf16 and FP8 E4M3 (OCP) conversions, bit-exact with the `half` and `float8` crates that the CPU
// references use, and wave reductions. Included by prelude.h.
#pragma once

// ---- bf16: round to nearest even; NaN stays NaN with its sign and upper payload (as half::bf16) -----
MONO_DEV u16 mono_f32_to_bf16(float f) {
  u32 x = mono_f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (u16)(x >> 16);
}
MONO_DEV float mono_bf16_to_f32(u16 b) { return mono_bits_f32((u32)b << 16); }

// ---- FP8 E4M3 (OCP): saturating, round to nearest even -------------------------------------------
// Finite values beyond 448 (and +-inf) become +-448; NaN becomes 0x7f with the input's sign.
MONO_DEV u8 mono_f32_to_e4m3_soft(float f) {
  const u32 x = mono_f32_bits(f);
  const u32 sign = (x >> 24) & 0x80u;
  const u32 ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (u8)(0x7fu | sign);
  if (ax > 0x43e80000u) return (u8)(0x7eu | sign);  // above 464, the midpoint between 448 and 480
  if (ax <= 0x3a800000u) return (u8)sign;           // at most 2^-10, half the smallest subnormal
  const i32 exp8 = (i32)(ax >> 23) - 127 + 7;
  const u32 mant = (ax >> 20) & 7u;
  const u32 half_ulp = 1u << 19;
  u32 res;
  if (exp8 >= 1) {
    res = ((u32)exp8 << 3) | mant;
    const u32 rest = ax & ((half_ulp << 1) - 1u);
    if (rest > half_ulp || (rest == half_ulp && (mant & 1u))) res += 1;
  } else {
    const u32 shift = (u32)(1 - exp8);
    res = (mant | 8u) >> shift;
    const u32 rest = (ax | (1u << 23)) & ((half_ulp << (shift + 1)) - 1u);
    const u32 half = half_ulp << shift;
    if (rest > half || (rest == half && (res & 1u))) res += 1;
  }
  return (u8)(res | sign);
}

MONO_DEV u8 mono_f32_to_e4m3(float f) {
#if MONO_NVIDIA && !defined(MONO_SOFT_FP8)
  u16 pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(f));
  // The hardware gives every NaN as 0x7f; the sign of the input is kept everywhere else, so
  // copying it in makes -NaN 0xff (as float8 and the portable path do) and changes nothing else.
  return (u8)((pair & 0xffu) | ((mono_f32_bits(f) >> 24) & 0x80u));
#else
  return mono_f32_to_e4m3_soft(f);
#endif
}

// Exact: every E4M3 value is an f32. NaN (0x7f / 0xff) decodes to the canonical f32 NaN 0x7fffe000,
// the bits float8 gives through its f16 canonical NaN.
MONO_DEV float mono_e4m3_to_f32(u8 c) {
  const u32 e = (c >> 3) & 15u;
  const u32 m = c & 7u;
  if ((c & 0x7fu) == 0x7fu) return mono_bits_f32(0x7fffe000u);
  float v = e == 0 ? (float)m * 0.001953125f  // m * 2^-9
                   : mono_bits_f32(((e + 120u) << 23) | (m << 20));
  return (c & 0x80u) ? -v : v;
}

// ---- wave reductions -----------------------------------------------------------------------------
MONO_DEV float mono_wave_sum(float v) {
#pragma unroll
  for (u32 m = MONO_WAVE / 2; m > 0; m >>= 1) v += mono_shfl_xor_f32(v, m);
  return v;
}
MONO_DEV float mono_wave_max(float v) {
#pragma unroll
  for (u32 m = MONO_WAVE / 2; m > 0; m >>= 1) v = mono_fmaxf(v, mono_shfl_xor_f32(v, m));
  return v;
}
