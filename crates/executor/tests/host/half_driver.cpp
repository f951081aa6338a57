// Runs one launch of the attention half's fused kernel (the generated source, both stages' own
// headers) on CPU threads (tests/half_host.rs), through kernels/host/launch.h: the slot lists
// published into the scratch as select would, then mono_layer over the task table.
//   driver <input> <output>
// input (little-endian): 8 header words (ctas, tasks, matrices, scratch boxes, image bytes, slot
// entries, slots' first box, entries a row), then 8 words of slots' box stride and padding; the
// tasks (64 bytes each), the offsets (ctas + 1 words), the matrices (lin_matrix, 80 bytes each),
// mla_args, the slot entries (i32), then the image. Every pointer of the matrices and of mla_args
// is a byte offset into the image (0: none).
// output: the diagnostics words, then the image after the launch. Exit status: emu_launch's, or 4
// when a debug wait gave up.
#include <cstdio>

#include "fused_attention.hip"
#include "launch.h"

static void read_bytes(FILE* f, void* dst, size_t n) {
  if (fread(dst, 1, n, f) != n) {
    fprintf(stderr, "short input\n");
    exit(2);
  }
}

template <class T>
static void relocate(u8* image, T*& p) {
  p = (u64)p == 0 ? nullptr : (T*)(image + (u64)p);
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 2;
  u32 h[16];
  read_bytes(f, h, sizeof h);
  const u32 ctas = h[0], n_tasks = h[1], n_mats = h[2], boxes = h[3], image_bytes = h[4], n_slots = h[5];
  const u32 slot_first = h[6], per_row = h[7], slot_stride = h[8];
  static_assert(sizeof(lin_matrix) == 80, "lin_matrix must match the Rust LinMatrix");
  auto* tasks = emu_device_alloc<mbx_task>(n_tasks + 1);
  read_bytes(f, tasks, sizeof(mbx_task) * n_tasks);
  auto* offsets = emu_device_alloc<u32>(ctas + 1);
  read_bytes(f, offsets, 4 * (ctas + 1));
  auto* mats = emu_device_alloc<lin_matrix>(n_mats);
  read_bytes(f, mats, sizeof(lin_matrix) * n_mats);
  mla_args a;
  read_bytes(f, &a, sizeof a);
  auto* slots = emu_device_alloc<i32>(n_slots + 1);
  read_bytes(f, slots, 4 * n_slots);
  auto* image = emu_device_alloc<u8>(image_bytes);
  read_bytes(f, image, image_bytes);
  fclose(f);
  for (u32 i = 0; i < n_mats; ++i) {
    lin_matrix& m = mats[i];
    relocate(image, m.w);
    relocate(image, m.scales);
    relocate(image, m.x);
    relocate(image, m.y);
    relocate(image, m.residual);
    relocate(image, m.row_scale);
  }
  relocate(image, a.q_abs);
  relocate(image, a.q_pe);
  relocate(image, a.new_latent);
  relocate(image, a.new_rope);
  relocate(image, a.new_slots);
  relocate(image, a.cache);
  relocate(image, a.part_o);
  relocate(image, a.part_ml);
  relocate(image, a.out);
  relocate(image, a.hidden);
  relocate(image, a.hidden_normed);
  relocate(image, a.hidden_norm);
  relocate(image, a.q_a);
  relocate(image, a.q_latent);
  relocate(image, a.q_a_norm);
  relocate(image, a.kv_a);
  relocate(image, a.kv_a_norm);
  relocate(image, a.q);
  relocate(image, a.positions);
  relocate(image, a.inv_freq);
  a.trace = nullptr;
  auto* scratch = emu_device_alloc<u64>(boxes);
  auto* epoch = emu_device_alloc<u32>(1);
  auto* diag = emu_device_alloc<u32>(MBX_DIAG_WORDS);
  // The slot lists as select publishes them: tagged pairs of this launch.
  mbx_ctx c = {};
  c.scratch = scratch;
  c.tag = mbx_launch_tag(epoch, 1, 0);
  for (u32 i = 0; i < n_slots; ++i) mbx_put(c, slot_first + (i / per_row) * slot_stride + i % per_row, (u32)slots[i]);
  const mbx_launch l = {tasks, offsets, scratch, epoch, diag, nullptr, ctas, 1, 0, 0};
  const lin_args la = {mats, n_mats, 0};
  const int status = emu_launch(ctas, MONO_CTA_THREADS, [&] { mono_layer(l, la, a); });
  if (diag[0]) fprintf(stderr, "stall: task %u box %u cta %u\n", diag[1], diag[2], diag[3]);
  FILE* o = fopen(argv[2], "wb");
  fwrite(diag, 4, MBX_DIAG_WORDS, o);
  fwrite(image, 1, image_bytes, o);
  fclose(o);
  return status != 0 ? status : diag[0] ? 4 : 0;
}
