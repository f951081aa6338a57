// Rotary position embedding at f64, as the CPU reference (model::numerics::apply_rope) computes it:
// the angle position * theta^(-2i/d) in f64 (the frequencies come from the host, made by the same
// f64 formula), its sine and cosine in f64, the rotation of the f32 pair in f64, rounded once to
// f32. fp32 angles would be off by up to position * 2^-24 radians, 0.01 at position 2e5.
#pragma once
#include "prelude.h"

// sin and cos of x >= 0 (an angle position * frequency) without libm: Cody-Waite reduction by
// pi/2 (its first 33 bits, so k * PIO2_HI is exact for k < 2^20: angles to about 1.6e6), then
// Taylor polynomials on |r| <= pi/4 whose first omitted term is below 2^-55.
MONO_DEV void mono_sincos_f64(double x, double* s, double* c) {
  const double pio2_hi = 1.57079632673412561417e+00;
  const double pio2_lo = 6.07710050650619224932e-11;
  const i64 k = (i64)(x * 0.63661977236758134308 + 0.5);
  const double kd = (double)k;
  const double r = (x - kd * pio2_hi) - kd * pio2_lo;
  const double r2 = r * r;
  double sp = 1.0 / 355687428096000.0;  // 1/17!
  sp = sp * -r2 + 1.0 / 1307674368000.0;
  sp = sp * -r2 + 1.0 / 6227020800.0;
  sp = sp * -r2 + 1.0 / 39916800.0;
  sp = sp * -r2 + 1.0 / 362880.0;
  sp = sp * -r2 + 1.0 / 5040.0;
  sp = sp * -r2 + 1.0 / 120.0;
  sp = sp * -r2 + 1.0 / 6.0;
  const double sin_r = r - r * r2 * sp;
  double cp = 1.0 / 20922789888000.0;  // 1/16!
  cp = cp * -r2 + 1.0 / 87178291200.0;
  cp = cp * -r2 + 1.0 / 479001600.0;
  cp = cp * -r2 + 1.0 / 3628800.0;
  cp = cp * -r2 + 1.0 / 40320.0;
  cp = cp * -r2 + 1.0 / 720.0;
  cp = cp * -r2 + 1.0 / 24.0;
  cp = cp * -r2 + 0.5;
  const double cos_r = 1.0 - r2 * cp;
  switch (k & 3) {
    case 0: *s = sin_r; *c = cos_r; break;
    case 1: *s = cos_r; *c = -sin_r; break;
    case 2: *s = -sin_r; *c = -cos_r; break;
    default: *s = -cos_r; *c = sin_r; break;
  }
}

// Elements (first, second) of rope pair i of a d-vector: GPT-J pairs (2i, 2i + 1) when
// interleaved, NeoX pairs (i, i + d / 2) otherwise.
MONO_DEV void mono_rope_pair_of(u32 i, u32 d, bool interleaved, u32* first, u32* second) {
  *first = interleaved ? 2u * i : i;
  *second = interleaved ? 2u * i + 1u : i + d / 2u;
}

// Pair (x, y) turned by `position` at frequency `inv_freq`: (x cos - y sin, y cos + x sin).
MONO_DEV void mono_rope_turn(float& x, float& y, u32 position, double inv_freq) {
  double s, c;
  mono_sincos_f64((double)position * inv_freq, &s, &c);
  const double a = x, b = y;
  x = (float)(a * c - b * s);
  y = (float)(b * c + a * s);
}
