// The tests' probe of the tile's RMSNorm prologue (tests/host_emulation.rs, tests/gpu.rs). One CTA
// norms the source rows of `m` (LIN_RMSNORM set: m.x at element m.row_at of rows of m.row_len)
// whole by mono_rmsnorm_rows, the function every norm task runs, into `normed` ([rows][row_len]);
// then stages m's x by the tile's own staging (lin_stage, the prologue when the flag is set) and
// copies the staged k-range out to `staged` ([rows][k]). The two must agree bit for bit.
// LDS: PROBE_SCRATCH_BYTES of scratch (the host's NORM_PROBE_SCRATCH: the prologue's
// lin_norm_scratch_floats), then the staged rows (lin_x_stride(k) elements each).
#include "prelude.h"
#include "ops/linear.h"

extern __shared__ __attribute__((aligned(16))) u8 probe_lds[];

MONO_KERNEL void __launch_bounds__(MONO_CTA_THREADS, 1) lin_norm_probe(lin_matrix m, u16* normed, u16* staged) {
  const auto team = mono_cta_team<MONO_CTA_THREADS>();
  float* scratch = (float*)probe_lds;
  const u16* rows = m.x - m.row_at;
  mono_rmsnorm_rows(team, rows, m.x_stride, m.norm_w, m.row_len, m.rows, m.norm_eps, normed, m.row_len, scratch);
  team.sync();
  static_assert(lin_norm_scratch_floats<decltype(team)>() * 4 <= PROBE_SCRATCH_BYTES, "the prologue's scratch");
  u16* xs = (u16*)(probe_lds + PROBE_SCRATCH_BYTES);
  const u32 xstride = lin_x_stride(m.k);
  lin_stage(team, m, xs, xstride, scratch);
  for (u32 i = team.thread(); i < m.rows * m.k; i += MONO_CTA_THREADS)
    staged[(u64)(i / m.k) * m.k + i % m.k] = xs[(i / m.k) * xstride + i % m.k];
}
