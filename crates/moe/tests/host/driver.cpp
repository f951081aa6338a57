// Runs one launch of moe_layer_tasks from its own source on CPU threads (tests/host_emulation.rs),
// through the shared launcher (kernels/host/launch.h): every CTA a forked process of
// MONO_CTA_THREADS threads, device memory in shared mappings.
//   driver <input> <output>
// input (little-endian): u32 words ctas, tasks, matrices, expert banks, scratch boxes, then the
// arena's bytes as a u64; the tasks (64 bytes each), the offsets (ctas + 1 words), the matrices
// (96 bytes each), the banks (144 bytes each), the moe_args (128 bytes), then the arena. Every
// pointer is an offset into the arena. output: the arena after the launch. Exit status:
// emu_launch's, or 4 when a debug wait gave up.
#include <cstdio>

#include "moe.hip"
#include "launch.h"

static void read_bytes(FILE* f, void* dst, size_t n) {
  if (fread(dst, 1, n, f) != n) {
    fprintf(stderr, "short input\n");
    exit(2);
  }
}

template <class T>
static void relocate(u8* arena, T*& p) {
  p = (T*)(arena + (u64)p);
}

static void relocate(u8* arena, lin_matrix& m) {
  relocate(arena, m.w);
  relocate(arena, m.scales);
  relocate(arena, m.x);
  relocate(arena, m.y);
  relocate(arena, m.residual);
  relocate(arena, m.row_scale);
  relocate(arena, m.norm_w);
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 2;
  u32 h[5];
  u64 arena_bytes;
  read_bytes(f, h, sizeof h);
  read_bytes(f, &arena_bytes, sizeof arena_bytes);
  const u32 ctas = h[0], n_tasks = h[1], n_mats = h[2], n_banks = h[3], scratch_boxes = h[4];
  static_assert(sizeof(lin_matrix) == 96 && sizeof(lin_expert) == 144 && sizeof(moe_args) == 128,
                "the argument structs must match their Rust twins");
  auto* tasks = emu_device_alloc<mbx_task>(n_tasks + 1);
  read_bytes(f, tasks, sizeof(mbx_task) * n_tasks);
  auto* offsets = emu_device_alloc<u32>(ctas + 1);
  read_bytes(f, offsets, 4 * (ctas + 1));
  auto* mats = emu_device_alloc<lin_matrix>(n_mats);
  read_bytes(f, mats, sizeof(lin_matrix) * n_mats);
  auto* banks = emu_device_alloc<lin_expert>(n_banks);
  read_bytes(f, banks, sizeof(lin_expert) * n_banks);
  moe_args a;
  read_bytes(f, &a, sizeof a);
  auto* arena = emu_device_alloc<u8>(arena_bytes);
  read_bytes(f, arena, arena_bytes);
  fclose(f);
  for (u32 i = 0; i < n_mats; ++i) relocate(arena, mats[i]);
  for (u32 i = 0; i < n_banks; ++i) relocate(arena, banks[i].m);
  relocate(arena, a.logits);
  relocate(arena, a.bias);
  relocate(arena, a.row_slots);
  relocate(arena, a.row_experts);
  relocate(arena, a.row_weights);
  relocate(arena, a.slot_scale);
  relocate(arena, a.residual);
  relocate(arena, a.shared);
  relocate(arena, a.routed);
  relocate(arena, a.out);
  auto* scratch = emu_device_alloc<u64>(scratch_boxes);
  auto* epoch = emu_device_alloc<u32>(1);
  auto* diag = emu_device_alloc<u32>(MBX_DIAG_WORDS);
  const mbx_launch l = {tasks, offsets, scratch, epoch, diag, nullptr, ctas, 1, 0, 0};
  const lin_args la = {mats, banks, n_mats, n_banks};
  const int status = emu_launch(ctas, MONO_CTA_THREADS, [&] { moe_layer_tasks(l, la, a); });
  if (diag[0]) fprintf(stderr, "stall: task %u box %u cta %u\n", diag[1], diag[2], diag[3]);
  FILE* o = fopen(argv[2], "wb");
  fwrite(arena, 1, arena_bytes, o);
  fclose(o);
  return status != 0 ? status : diag[0] ? 4 : 0;
}
