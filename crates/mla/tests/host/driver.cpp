// Runs one launch of the MLA tasks from their own source on CPU threads (tests/host_emulation.rs):
// the slot stand-in (mla_publish_slots), then the task list (mla_tasks), each through
// kernels/host/launch.h.
//   driver <input> <output>
// input: blobs, each a u32 byte length then its bytes padded to 4: the header words (ctas,
// topk, slots' first box, slots' box stride, scratch boxes, max_splits, the scale's bits), the
// task table, its offsets, q_abs, q_pe, new_latent, new_rope, new_slots, the cache, the slot lists
// [rows][topk], then the sizes in elements of part_o, part_ml and out as one blob of 3 words.
// output: the diagnostics words, out, then the cache after the launch. Exit status: launch.h's.
#include "mla.hip"
#include "launch.h"

struct blob {
  u8* data;
  u32 bytes;
};

static blob read_blob(FILE* f) {
  u32 bytes = 0;
  if (fread(&bytes, 4, 1, f) != 1) {
    fprintf(stderr, "short input\n");
    exit(2);
  }
  blob b{emu_device_alloc<u8>((bytes + 3) / 4 * 4), bytes};
  if (fread(b.data, 1, (bytes + 3) / 4 * 4, f) != (bytes + 3) / 4 * 4) {
    fprintf(stderr, "short input\n");
    exit(2);
  }
  return b;
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 2;
  const u32* h = (const u32*)read_blob(f).data;
  const u32 ctas = h[0], topk = h[1], slot_first = h[2], slot_stride = h[3], boxes = h[4];
  const blob tasks = read_blob(f), offsets = read_blob(f);
  const blob q_abs = read_blob(f), q_pe = read_blob(f), new_latent = read_blob(f), new_rope = read_blob(f);
  const blob new_slots = read_blob(f), cache = read_blob(f), slots = read_blob(f);
  const u32* sizes = (const u32*)read_blob(f).data;
  fclose(f);
  u64* scratch = emu_device_alloc<u64>(boxes);
  u32* epoch = emu_device_alloc<u32>(1);
  u32* diag = emu_device_alloc<u32>(MBX_DIAG_WORDS);
  mla_args a = {};
  a.q_abs = (const u16*)q_abs.data;
  a.q_pe = (u16*)q_pe.data;
  a.new_latent = (u16*)new_latent.data;
  a.new_rope = (u16*)new_rope.data;
  a.new_slots = (const u32*)new_slots.data;
  a.cache = cache.data;
  a.part_o = emu_device_alloc<float>(sizes[0]);
  a.part_ml = emu_device_alloc<float>(sizes[1]);
  a.out = emu_device_alloc<u16>(sizes[2]);
  a.scale = mono_bits_f32(h[6]);
  a.slot_stride = slot_stride;
  a.max_splits = h[5];
  a.pad = 0;
  a.trace = nullptr;
  const u32 n_slots = slots.bytes / 4;
  int status = emu_launch(1, 2 * MONO_WAVE, [&] {
    mla_publish_slots((const i32*)slots.data, n_slots, topk, scratch, slot_first, slot_stride, epoch, 1, 0);
  });
  if (status == EMU_OK) {
    const mbx_launch l{(const mbx_task*)tasks.data, (const u32*)offsets.data, scratch, epoch, diag, nullptr, ctas, 1, 0, 0};
    status = emu_launch(ctas, MONO_CTA_THREADS, [&] { mla_tasks(l, a); });
  }
  FILE* o = fopen(argv[2], "wb");
  fwrite(diag, 4, MBX_DIAG_WORDS, o);
  fwrite(a.out, 2, sizes[2], o);
  fwrite(cache.data, 1, cache.bytes, o);
  fclose(o);
  return status;
}
