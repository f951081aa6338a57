// Runs one launch of the select stage from its own source on CPU threads (tests/host_emulation.rs)
// through kernels/host/launch.h: the standalone entry's task-list loop over the table the test
// built. Besides select's kinds it runs a producer (stage MBX_STAGE_SYNTHETIC, own kind 1) that
// stands in for the indexer's scoring: after a delay it copies the fresh scores of row args[0]
// over the stale ones, publishes them and puts its one output box, which the row's select tasks
// wait on.
//   driver <input> <output>
// input (little-endian u32 words): rows, stride, n_pages (0: no page table), n_ctas, n_tasks,
// scratch_boxes, hist_offset, cand_offset, cand_stride, fresh (1: fresh scores follow the stale
// ones), delay_ms (the producer's), n_requests; then offsets [n_ctas + 1], tasks [n_tasks][16],
// lens, scores [rows, stride], the fresh scores when given, and with a page table its device form
// (ops/paging.h): the page list [n_pages], the requests [n_requests][4], the rows [rows][2].
// output: flags [rows, SEL_FLAGS], then the lists [rows, SEL_K]. Exit status: launch.h's
// (EMU_STALLED: the launch hung).
#include "select.hip"
#include "launch.h"

#define PRODUCER_KIND ((MBX_STAGE_SYNTHETIC << MBX_STAGE_SHIFT) | 1u)
// Seconds of CPU time spent, or of every thread asleep, with no barrier passed: a hang.
#define STALL_SECONDS 10

static void read_words(FILE* f, void* dst, size_t n) {
  if (fread(dst, 4, n, f) != n) {
    fprintf(stderr, "short input\n");
    exit(2);
  }
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 2;
  u32 h[12];
  read_words(f, h, 12);
  const u32 rows = h[0], stride = h[1], n_pages = h[2], n_ctas = h[3], n_tasks = h[4], scratch_boxes = h[5];
  const u32 fresh = h[9], delay_ms = h[10], n_requests = h[11];
  u32* offsets = emu_device_alloc<u32>(n_ctas + 1);
  read_words(f, offsets, n_ctas + 1);
  mbx_task* tasks = emu_device_alloc<mbx_task>(n_tasks);
  read_words(f, tasks, (size_t)n_tasks * 16);
  u32* lens = emu_device_alloc<u32>(rows);
  read_words(f, lens, rows);
  float* scores = emu_device_alloc<float>((size_t)rows * stride);
  read_words(f, scores, (size_t)rows * stride);
  float* fresh_scores = nullptr;
  if (fresh) {
    fresh_scores = emu_device_alloc<float>((size_t)rows * stride);
    read_words(f, fresh_scores, (size_t)rows * stride);
  }
  u32* page_list = nullptr;
  mono_page_request* page_requests = nullptr;
  mono_page_row* page_rows = nullptr;
  if (n_pages) {
    page_list = emu_device_alloc<u32>(n_pages);
    read_words(f, page_list, n_pages);
    page_requests = emu_device_alloc<mono_page_request>(n_requests);
    read_words(f, page_requests, (size_t)n_requests * 4);
    page_rows = emu_device_alloc<mono_page_row>(rows);
    read_words(f, page_rows, (size_t)rows * 2);
  }
  fclose(f);
  i32* out = emu_device_alloc<i32>((size_t)rows * SEL_K);
  for (size_t i = 0; i < (size_t)rows * SEL_K; ++i) out[i] = (i32)0x80000000;  // never a task's entry
  u32* flags = emu_device_alloc<u32>(rows * SEL_FLAGS);
  u64* scratch = emu_device_alloc<u64>(scratch_boxes);
  u32* epoch = emu_device_alloc<u32>(1);
  u32* diag = emu_device_alloc<u32>(8);
  const mbx_launch l{tasks, offsets, scratch, epoch, diag, nullptr, n_ctas, 1, 0, 0};
  const sel_args a{scores, page_list, page_rows, page_requests, out, flags, nullptr, stride, h[6], h[7], h[8], 0, 0};
  const int status = emu_launch(n_ctas, MONO_CTA_THREADS, [&] {
    const auto team = mono_cta_team<MONO_CTA_THREADS>();
    mbx_run_launch(l, [&](mbx_ctx& c, const mbx_task& t) {
      if (t.kind != PRODUCER_KIND) return sel_decode(team, t, c, a, sel_lds);
      const u64 row = t.args[0];
      if (mono_thread() == 0) usleep(delay_ms * 1000);
      mono_sync_block();
      for (u32 i = mono_thread(); i < stride; i += MONO_CTA_THREADS) scores[row * stride + i] = fresh_scores[row * stride + i];
      mono_sync_block();
      if (mono_thread() == 0) {
        mbx_publish();
        mbx_put(c, t.out.first, 1);
      }
      return true;
    });
  }, STALL_SECONDS);
  if (diag[0]) fprintf(stderr, "stall: task %u box %u cta %u\n", diag[1], diag[2], diag[3]);
  FILE* o = fopen(argv[2], "wb");
  fwrite(flags, 4, rows * SEL_FLAGS, o);
  fwrite(out, 4, (size_t)rows * SEL_K, o);
  fclose(o);
  return status;
}
