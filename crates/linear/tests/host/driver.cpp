// Runs one launch of linear_tasks from its own source on CPU threads (tests/host_emulation.rs),
// through the shared launcher (kernels/host/launch.h): every CTA a forked process of
// MONO_CTA_THREADS threads, device memory in shared mappings.
//   driver <input> <output>
// input (little-endian u32 words): ctas, tasks, matrices, scratch boxes, arena bytes; the tasks
// (16 words each), the offsets (ctas + 1), the matrices (24 words each, their pointers given as
// byte offsets into the arena, all ones for none), then the arena (weights, scales, x, y, ...).
// output: the arena after the launch. Exit status: emu_launch's (kernels/host/launch.h), or 4 when
// a debug wait gave up.
#include <cstdio>

#include "linear.hip"
#include "launch.h"

static void* device_alloc(size_t bytes) { return emu_device_alloc<u8>(bytes); }

static void read_bytes(FILE* f, void* dst, size_t n) {
  if (fread(dst, 1, n, f) != n) {
    fprintf(stderr, "short input\n");
    exit(2);
  }
}

template <class T>
static T* relocate(u8* arena, const T* offset) {
  const u64 off = (u64)offset;
  return off == ~0ull ? nullptr : (T*)(arena + off);
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 2;
  u32 h[5];
  read_bytes(f, h, sizeof h);
  const u32 ctas = h[0], n_tasks = h[1], n_mats = h[2], scratch_boxes = h[3], arena_bytes = h[4];
  static_assert(sizeof(lin_matrix) == 96, "lin_matrix must match the Rust LinMatrix");
  auto* tasks = (mbx_task*)device_alloc(sizeof(mbx_task) * (n_tasks + 1));
  read_bytes(f, tasks, sizeof(mbx_task) * n_tasks);
  auto* offsets = (u32*)device_alloc(4 * (ctas + 1));
  read_bytes(f, offsets, 4 * (ctas + 1));
  auto* mats = (lin_matrix*)device_alloc(sizeof(lin_matrix) * n_mats);
  read_bytes(f, mats, sizeof(lin_matrix) * n_mats);
  auto* arena = (u8*)device_alloc(arena_bytes);
  read_bytes(f, arena, arena_bytes);
  fclose(f);
  for (u32 i = 0; i < n_mats; ++i) {
    lin_matrix& m = mats[i];
    m.w = relocate(arena, m.w);
    m.scales = relocate(arena, m.scales);
    m.x = relocate(arena, m.x);
    m.y = relocate(arena, (u8*)m.y);
    m.residual = relocate(arena, m.residual);
    m.row_scale = relocate(arena, m.row_scale);
    m.norm_w = relocate(arena, m.norm_w);
  }
  auto* scratch = (u64*)device_alloc(8 * scratch_boxes);
  auto* epoch = (u32*)device_alloc(4);
  auto* diag = (u32*)device_alloc(4 * MBX_DIAG_WORDS);
  const mbx_launch l = {tasks, offsets, scratch, epoch, diag, nullptr, ctas, 1, 0, 0};
  const lin_args a = {mats, nullptr, n_mats, 0};
  const int status = emu_launch(ctas, MONO_CTA_THREADS, [&] { linear_tasks(l, a); });
  if (diag[0]) fprintf(stderr, "stall: task %u box %u cta %u\n", diag[1], diag[2], diag[3]);
  FILE* o = fopen(argv[2], "wb");
  fwrite(arena, 1, arena_bytes, o);
  fclose(o);
  return status != 0 ? status : diag[0] ? 4 : 0;
}
