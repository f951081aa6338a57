// Runs one launch of head_tasks from its own source on CPU threads (tests/host_emulation.rs),
// through the shared launcher (kernels/host/launch.h): every CTA a forked process of
// MONO_CTA_THREADS threads, device memory in shared mappings.
//   driver <input> <output>
// input (little-endian u32 words): ctas, tasks, embeds, norms, argmaxes, picks, scratch boxes,
// arena bytes; the tasks (16 words each), the offsets (ctas + 1), the four descriptor lists (their
// pointers given as byte offsets into the arena), then the arena. output: the arena after the
// launch. Exit status: emu_launch's (kernels/host/launch.h), or 4 when a debug wait gave up.
#include <cstdio>

#include "head.hip"
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

template <class T>
static T* relocate(u8* arena, T* offset) {
  return (T*)(arena + (u64)offset);
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 2;
  u32 h[8];
  read_bytes(f, h, sizeof h);
  const u32 ctas = h[0], n_tasks = h[1], scratch_boxes = h[6], arena_bytes = h[7];
  static_assert(sizeof(head_embed) == 40 && sizeof(head_norm) == 40 && sizeof(head_argmax) == 40 &&
                    sizeof(head_pick) == 32 && sizeof(head_args) == 48,
                "the head's descriptors must match src/gpu.rs");
  auto* tasks = read_list<mbx_task>(f, n_tasks);
  auto* offsets = read_list<u32>(f, ctas + 1);
  auto* embeds = read_list<head_embed>(f, h[2]);
  auto* norms = read_list<head_norm>(f, h[3]);
  auto* argmaxes = read_list<head_argmax>(f, h[4]);
  auto* picks = read_list<head_pick>(f, h[5]);
  auto* arena = read_list<u8>(f, arena_bytes);
  fclose(f);
  for (u32 i = 0; i < h[2]; ++i) {
    embeds[i].table = relocate(arena, embeds[i].table);
    embeds[i].tokens = relocate(arena, embeds[i].tokens);
    embeds[i].y = relocate(arena, embeds[i].y);
  }
  for (u32 i = 0; i < h[3]; ++i) {
    norms[i].x = relocate(arena, norms[i].x);
    norms[i].weight = relocate(arena, norms[i].weight);
    norms[i].y = relocate(arena, norms[i].y);
  }
  for (u32 i = 0; i < h[4]; ++i) {
    argmaxes[i].logits = relocate(arena, argmaxes[i].logits);
    argmaxes[i].pairs = relocate(arena, argmaxes[i].pairs);
  }
  for (u32 i = 0; i < h[5]; ++i) {
    picks[i].pairs = relocate(arena, picks[i].pairs);
    picks[i].tokens = relocate(arena, picks[i].tokens);
  }
  auto* scratch = emu_device_alloc<u64>(scratch_boxes);
  auto* epoch = emu_device_alloc<u32>(1);
  auto* diag = emu_device_alloc<u32>(MBX_DIAG_WORDS);
  const mbx_launch l = {tasks, offsets, scratch, epoch, diag, nullptr, ctas, 1, 0, 0};
  const head_args a = {embeds, norms, argmaxes, picks, h[2], h[3], h[4], h[5]};
  const int status = emu_launch(ctas, MONO_CTA_THREADS, [&] { head_tasks(l, a); });
  if (diag[0]) fprintf(stderr, "stall: task %u box %u cta %u\n", diag[1], diag[2], diag[3]);
  FILE* o = fopen(argv[2], "wb");
  fwrite(arena, 1, arena_bytes, o);
  fclose(o);
  return status != 0 ? status : diag[0] ? 4 : 0;
}
