// Runs one launch of the head's fused kernel (the generated source, written beside this driver as
// fused_head.hip) on CPU threads for tests/fused_head.rs, through the shared launcher
// (kernels/host/launch.h): every CTA a forked process, device memory in shared mappings.
//   head_driver <input> <output>
// input (little-endian u32 words): ctas, tasks, matrices, embeds, norms, argmaxes, picks, scratch
// boxes, arena bytes; the tasks, the offsets (ctas + 1), the matrices and the four descriptor lists
// (every pointer a byte offset into the arena), then the arena (weights, inputs, activations).
// output: the arena after the launch. Exit status: emu_launch's, or 4 when a debug wait gave up.
#include <cstdio>

#include "fused_head.hip"
#include "launch.h"

static void read_bytes(FILE* f, void* dst, size_t n) {
  if (fread(dst, 1, n, f) != n) {
    fprintf(stderr, "short input\n");
    exit(2);
  }
}

template <class T>
static T* read_list(FILE* f, u32 n) {
  auto* p = emu_device_alloc<T>(n + 1);
  read_bytes(f, p, sizeof(T) * n);
  return p;
}

// Every pointer of the launch is an offset into the arena.
template <class T>
static void at(u8* arena, T*& p) {
  p = (T*)(arena + (u64)p);
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 2;
  u32 h[9];
  read_bytes(f, h, sizeof h);
  const u32 ctas = h[0], n_tasks = h[1], n_mats = h[2], scratch_boxes = h[7], arena_bytes = h[8];
  static_assert(sizeof(lin_matrix) == 80 && sizeof(head_embed) == 40 && sizeof(head_norm) == 40 &&
                    sizeof(head_argmax) == 40 && sizeof(head_pick) == 24,
                "descriptors must match their Rust twins");
  auto* tasks = read_list<mbx_task>(f, n_tasks);
  auto* offsets = read_list<u32>(f, ctas + 1);
  auto* mats = read_list<lin_matrix>(f, n_mats);
  auto* embeds = read_list<head_embed>(f, h[3]);
  auto* norms = read_list<head_norm>(f, h[4]);
  auto* argmaxes = read_list<head_argmax>(f, h[5]);
  auto* picks = read_list<head_pick>(f, h[6]);
  auto* arena = read_list<u8>(f, arena_bytes);
  fclose(f);
  for (u32 i = 0; i < n_mats; ++i) {
    lin_matrix& m = mats[i];
    at(arena, m.w), at(arena, m.scales), at(arena, m.x), at(arena, m.y), at(arena, m.residual),
        at(arena, m.row_scale);
  }
  for (u32 i = 0; i < h[3]; ++i) at(arena, embeds[i].table), at(arena, embeds[i].tokens), at(arena, embeds[i].y);
  for (u32 i = 0; i < h[4]; ++i) at(arena, norms[i].x), at(arena, norms[i].weight), at(arena, norms[i].y);
  for (u32 i = 0; i < h[5]; ++i) at(arena, argmaxes[i].logits), at(arena, argmaxes[i].pairs);
  for (u32 i = 0; i < h[6]; ++i) at(arena, picks[i].pairs), at(arena, picks[i].tokens);
  auto* scratch = emu_device_alloc<u64>(scratch_boxes);
  auto* epoch = emu_device_alloc<u32>(1);
  auto* diag = emu_device_alloc<u32>(MBX_DIAG_WORDS);
  const mbx_launch l = {tasks, offsets, scratch, epoch, diag, nullptr, ctas, 1, 0, 0};
  const lin_args lin = {mats, n_mats, 0};
  const head_args head = {embeds, norms, argmaxes, picks, h[3], h[4], h[5], h[6]};
  const int status = emu_launch(ctas, MONO_CTA_THREADS, [&] { mono_layer(l, lin, head); });
  if (diag[0]) fprintf(stderr, "stall: task %u box %u cta %u\n", diag[1], diag[2], diag[3]);
  FILE* o = fopen(argv[2], "wb");
  fwrite(arena, 1, arena_bytes, o);
  fclose(o);
  return status != 0 ? status : diag[0] ? 4 : 0;
}
