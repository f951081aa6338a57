// Runs the RMSNorm prologue probe (kernels/norm_probe.hip) on CPU threads, one CTA
// (tests/host_emulation.rs).
//   driver <input> <output>
// input (little-endian): u32 rows, row_len, k0, k, flags (LIN_RMSNORM, or 0: the negative
// control); f32 eps; then the source rows [rows][row_len]
// and the weight [row_len], bf16. output: normed [rows][row_len], then staged [rows][k], bf16.
#include <cstdio>
#include <vector>

#include "norm_probe.hip"
#include "launch.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 2;
  u32 h[5];
  float eps;
  if (fread(h, 4, 5, f) != 5 || fread(&eps, 4, 1, f) != 1) return 2;
  const u32 rows = h[0], n = h[1], k0 = h[2], k = h[3];
  u16* src = emu_device_alloc<u16>((size_t)rows * n);
  u16* w = emu_device_alloc<u16>(n);
  u16* normed = emu_device_alloc<u16>((size_t)rows * n);
  u16* staged = emu_device_alloc<u16>((size_t)rows * k);
  if (fread(src, 2, (size_t)rows * n, f) != (size_t)rows * n || fread(w, 2, n, f) != n) return 2;
  fclose(f);
  lin_matrix m = {};
  m.x = src + k0;
  m.norm_w = w;
  m.k = k;
  m.rows = rows;
  m.x_stride = n;
  m.flags = h[4];
  m.row_len = n;
  m.row_at = k0;
  m.norm_eps = eps;
  const int status = emu_launch(1, MONO_CTA_THREADS, [&] { lin_norm_probe(m, normed, staged); });
  FILE* o = fopen(argv[2], "wb");
  fwrite(normed, 2, (size_t)rows * n, o);
  fwrite(staged, 2, (size_t)rows * k, o);
  fclose(o);
  return status;
}
