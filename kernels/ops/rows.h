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

// A team's sum in two steps, so that many sums can share one barrier: mono_wave_sum_to writes the
// wave's sum of this thread's `v` to sums[wave]; once the team has passed a barrier,
// mono_waves_total adds the waves' sums in wave order from zero. mono_team_sum is these two steps
// around its barrier, so a caller that sums many rows this way (the linear tile's x prologue) gets
// a row's bits by construction. A row's sums take Team::waves floats.
template <class Team>
MONO_DEV void mono_wave_sum_to(const Team& team, float v, float* sums) {
  v = mono_wave_sum(v);
  if (team.lane() == 0) sums[Team::size <= MONO_WAVE ? 0u : team.wave()] = v;
}
template <class Team>
MONO_DEV float mono_waves_total(const Team&, const float* sums) {
  if (Team::size <= MONO_WAVE) return sums[0];
  float total = 0.0f;
  for (u32 w = 0; w < Team::waves; ++w) total += sums[w];
  return total;
}

// The sum of every thread's `v` over the team, returned to every thread. `scratch` is the team's
// own shared memory (at least Team::waves floats); it may be reused after the call returns.
template <class Team>
MONO_DEV float mono_team_sum(const Team& team, float v, float* scratch) {
  static_assert(Team::waves <= MONO_ROWS_SCRATCH_FLOATS, "one scratch float a wave");
  if (Team::size <= MONO_WAVE) return mono_wave_sum(v);
  mono_wave_sum_to(team, v, scratch);
  team.sync();
  const float total = mono_waves_total(team, scratch);
  team.sync();
  return total;
}

// The pieces of the RMSNorm, shared by mono_rmsnorm_rows and every other place that normalises
// rows (the linear tile's x prologue, ops/linear.h): a row's inverse RMS is
// mono_inv_rms(mono_team_sum(team, mono_row_squares(team, row, n), scratch), n, eps), and element
// i of the normed row mono_rmsnorm_value(x[i], inv_rms, w[i]). Whoever computes it so with a team
// of the same size gets the bits the norm task writes.
//
// This thread's part of the row's sum of squares: its elements i = thread, thread + size, ... in
// index order.
template <class Team>
MONO_DEV float mono_row_squares(const Team& team, const u16* xr, u32 n) {
  float squares = 0.0f;
  for (u32 i = team.thread(); i < n; i += Team::size) {
    const float v = mono_bf16_to_f32(xr[i]);
    squares += v * v;
  }
  return squares;
}

// 1 / sqrt(mean of the squares + eps), from the team's total of a row of n.
MONO_DEV float mono_inv_rms(float total_squares, u32 n, float eps) {
  return 1.0f / mono_sqrtf(total_squares / (float)n + eps);
}

// One element of the normed row: bf16(x * inv_rms * w).
MONO_DEV u16 mono_rmsnorm_value(u16 x, float inv_rms, u16 w) {
  return mono_f32_to_bf16(mono_bf16_to_f32(x) * inv_rms * mono_bf16_to_f32(w));
}

// y[r][i] = bf16(x[r][i] * inv_rms_r * w[i]), inv_rms_r = 1 / sqrt(mean_i(x[r][i]^2) + eps), fp32
// throughout; the reference (model::numerics::rms_norm) computes the same in f64, so the two
// differ by the bf16 rounding of the output at most a unit. `x` and `y` may be the same rows.
template <class Team>
MONO_DEV void mono_rmsnorm_rows(const Team& team, const u16* x, u32 x_stride, const u16* w, u32 n, u32 rows,
                                float eps, u16* y, u32 y_stride, float* scratch) {
  for (u32 r = 0; r < rows; ++r) {
    const u16* xr = x + (u64)r * x_stride;
    const float inv_rms = mono_inv_rms(mono_team_sum(team, mono_row_squares(team, xr, n), scratch), n, eps);
    u16* yr = y + (u64)r * y_stride;
    for (u32 i = team.thread(); i < n; i += Team::size) yr[i] = mono_rmsnorm_value(xr[i], inv_rms, w[i]);
  }
}
