// The innermost tiles of MLA attention: one wave computes a 16 x 8 fp32 tile of a bf16 product
// whose operands sit in LDS, and hands each element to a store functor. NVIDIA: ldmatrix +
// mma.sync m16n8k16 (sm_80 and later). Everywhere else (AMD until an MFMA path is written, and the
// host build that runs the kernels on CPU threads): plain fp32 FMAs over the same operands. The
// per-platform code stays inside these two functions; the tasks never see a register layout.
// These are local to MLA until the ops layer's matrix wrappers (kernels/ops) land.
#pragma once
#include "prelude.h"

#if MONO_NVIDIA
MONO_DEV void mla_ldsm_x4(u32 (&r)[4], u32 address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
MONO_DEV void mla_ldsm_x4_trans(u32 (&r)[4], u32 address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
MONO_DEV void mla_ldsm_x2(u32 (&r)[2], u32 address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(address));
}
MONO_DEV void mla_mma_bf16(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// Accumulator element i of lane l: row g or g + 8, column 2 * (l % 4) + (i & 1), g = l / 4.
template <class Store>
MONO_DEV void mla_store_acc(u32 lane, const float (&d)[4], Store store) {
  const u32 row = lane / 4, col = 2 * (lane % 4);
  store(row, col, d[0]);
  store(row, col + 1, d[1]);
  store(row + 8, col, d[2]);
  store(row + 8, col + 1, d[3]);
}
#endif

// Scores: out(t, q) for t < 16, q < 8 is the sum over k in [k0, k0 + 16 * steps) of
// a[(t0 + t) * a_stride + k] * b[(q0 + q) * b_stride + k] (keys in M, queries in N: the few heads
// of a rank fill N, not a padded M). a, b in LDS, rows 16-byte aligned. Every lane of one wave.
template <class Store>
MONO_DEV void mla_tile_rows_dot(u32 lane, const u16* a, u32 a_stride, const u16* b, u32 b_stride, u32 t0, u32 q0,
                                u32 k0, u32 steps, Store store) {
#if MONO_NVIDIA
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  const u32 a_addr = mono_lds_address(a + (t0 + (lane & 15)) * a_stride + k0 + (lane >> 4) * 8);
  const u32 b_addr = mono_lds_address(b + (q0 + (lane & 7)) * b_stride + k0 + ((lane >> 3) & 1) * 8);
  for (u32 s = 0; s < steps; ++s) {
    u32 fa[4], fb[2];
    mla_ldsm_x4(fa, a_addr + 32 * s);
    mla_ldsm_x2(fb, b_addr + 32 * s);
    mla_mma_bf16(d, fa, fb);
  }
  mla_store_acc(lane, d, store);
#else
  for (u32 e = lane; e < 128; e += MONO_WAVE) {
    const u32 t = e / 8, q = e % 8;
    const u16* x = a + (t0 + t) * a_stride + k0;
    const u16* y = b + (q0 + q) * b_stride + k0;
    float acc = 0.f;
    for (u32 k = 0; k < 16 * steps; ++k) acc += mono_bf16_to_f32(x[k]) * mono_bf16_to_f32(y[k]);
    store(t, q, acc);
  }
#endif
}

// Values: out(d, q) for d < 16, q < 8 is the sum over t < 16 * steps of
// v[t * v_stride + d0 + d] * p[(q0 + q) * p_stride + t] (latent dims in M, queries in N).
template <class Store>
MONO_DEV void mla_tile_cols_dot(u32 lane, const u16* v, u32 v_stride, const u16* p, u32 p_stride, u32 d0, u32 q0,
                                u32 steps, Store store) {
#if MONO_NVIDIA
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  const u32 m = lane >> 3;
  const u32 v_addr = mono_lds_address(v + ((lane & 7) + (m >> 1) * 8) * v_stride + d0 + (m & 1) * 8);
  const u32 p_addr = mono_lds_address(p + (q0 + (lane & 7)) * p_stride + ((lane >> 3) & 1) * 8);
  for (u32 s = 0; s < steps; ++s) {
    u32 fa[4], fb[2];
    mla_ldsm_x4_trans(fa, v_addr + 32 * s * v_stride);
    mla_ldsm_x2(fb, p_addr + 32 * s);
    mla_mma_bf16(d, fa, fb);
  }
  mla_store_acc(lane, d, store);
#else
  for (u32 e = lane; e < 128; e += MONO_WAVE) {
    const u32 dd = e / 8, q = e % 8;
    const u16* y = p + (q0 + q) * p_stride;
    float acc = 0.f;
    for (u32 t = 0; t < 16 * steps; ++t) acc += mono_bf16_to_f32(v[t * v_stride + d0 + dd]) * mono_bf16_to_f32(y[t]);
    store(dd, q, acc);
  }
#endif
}

// Two floats rounded to bf16 (nearest even), lo in the low half.
MONO_DEV u32 mla_bf16x2(float lo, float hi) {
#if MONO_NVIDIA
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (u32)mono_f32_to_bf16(lo) | ((u32)mono_f32_to_bf16(hi) << 16);
#endif
}

// Two E4M3 codes (low byte first) as floats; exact on every path.
MONO_DEV void mla_e4m3x2_to_f32(u32 pair, float& lo, float& hi) {
#if MONO_NVIDIA
  u32 h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((u16)pair));
  float a, b;
  asm("cvt.f32.f16 %0, %1;" : "=f"(a) : "h"((u16)h2));
  asm("cvt.f32.f16 %0, %1;" : "=f"(b) : "h"((u16)(h2 >> 16)));
  lo = a;
  hi = b;
#else
  lo = mono_e4m3_to_f32((u8)pair);
  hi = mono_e4m3_to_f32((u8)(pair >> 8));
#endif
}
