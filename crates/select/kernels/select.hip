// Standalone entry points of the select stage (task functions in select.h). Scores are
// [rows, stride] fp32 with stride a multiple of 4 and per-row lengths; the output is [rows, SEL_K]
// int32 positions, or cache slots when a page table [rows, pages_stride] is given; flags is
// [rows, SEL_FLAGS] error words, zeroed by the host; trace: 2 * SEL_TRACE_MARKS words, written
// only by SEL_TRACE builds. Launch with SEL_BLOCK threads and SEL_LDS_WORDS * 4 bytes of dynamic
// shared memory (select_in_registers: SEL_REG_BLOCK threads, no dynamic shared memory). Every
// entry may be launched to overlap the kernel before it (Launch::overlap_prior): it lets the next
// launch's CTAs in at once, and waits for the last one before any global access.
#include "prelude.h"
#include "mailbox.h"
#include "select.h"

extern __shared__ __attribute__((aligned(16))) u32 sel_lds[];

MONO_DEV sel_row sel_row_of(const float* scores, u32 stride, const u32* lens, const i32* pages, u32 pages_stride, i32* out,
                            u32* flags, u32 row) {
  sel_row r;
  r.scores = scores + (u64)row * stride;
  r.len = lens[row];
  r.stride = stride;
  r.out = out + (u64)row * SEL_K;
  r.pages = pages ? pages + (u64)row * pages_stride : nullptr;
  r.flags = flags + row * SEL_FLAGS;
  return r;
}

// One CTA per row.
MONO_KERNEL void __launch_bounds__(SEL_BLOCK, 2)
    select_one_cta(const float* scores, u32 stride, const u32* lens, u32 rows, const i32* pages, u32 pages_stride,
                   i32* out, u32* flags, u64* trace) {
  __shared__ sel_smem sm;
  mono_release_next();
  mono_wait_prior();
  const u32 row = mono_block();
  if (row >= rows) return;
  sel_trace_begin(sm, trace, row == 0);
  sel_one_cta_task(sm, sel_lds, sel_row_of(scores, stride, lens, pages, pages_stride, out, flags, row));
}

// One CTA of SEL_REG_BLOCK threads per row of at most SEL_REG_KEYS * SEL_REG_BLOCK keys, held in
// registers; no dynamic shared memory.
MONO_KERNEL void __launch_bounds__(SEL_REG_BLOCK, 1)
    select_in_registers(const float* scores, u32 stride, const u32* lens, u32 rows, const i32* pages, u32 pages_stride,
                        i32* out, u32* flags, u64* trace) {
  __shared__ sel_reg_smem sm;
  mono_release_next();
  sel_regs_clear(sm);
  mono_wait_prior();
  const u32 row = mono_block();
  if (row >= rows) return;
  sel_trace_begin(sm, trace, row == 0);
  sel_regs_task(sm, sel_row_of(scores, stride, lens, pages, pages_stride, out, flags, row));
}

// One CTA per task; task -> (row, slice) by src/layout.rs SlicePlacement: runs == 0 interleaved
// (slice c of row s is task c * rows + s), runs == 1 a run of SEL_MAX_SLICES tasks per row. Every
// CTA must be resident at once (a cooperative launch). The tag comes from the epoch word;
// hist_offset / cand_offset / cand_stride place this launch's rows in the scratch (SelectBoxes).
MONO_KERNEL void __launch_bounds__(SEL_BLOCK, 2)
    select_multi_slice(const float* scores, u32 stride, const u32* lens, u32 rows, u32 runs, const i32* pages,
                       u32 pages_stride, i32* out, u32* flags, u64* scratch, const u32* epoch, u32 launches_per_step,
                       u32 launch_index, u32 hist_offset, u32 cand_offset, u32 cand_stride, u32* diag,
                       u64* trace) {
  __shared__ sel_smem sm;
  mono_release_next();
  mono_wait_prior();
  const u32 task = mono_block();
  const u32 row = runs ? task / SEL_MAX_SLICES : task % rows;
  const u32 me = runs ? task % SEL_MAX_SLICES : task / rows;
  if (row >= rows) return;
  mbx_ctx c = mbx_begin(scratch, mbx_launch_tag(epoch, launches_per_step, launch_index), diag);
  c.task = task;
  sel_trace_begin(sm, trace, row == 0 && me == 0);
  const u32 hist_box = hist_offset + row * (SEL_ROUNDS * SEL_MAX_SLICES * SEL_HIST_BOXES);
  sel_slice_task(sm, sel_lds, c, sel_row_of(scores, stride, lens, pages, pages_stride, out, flags, row), me, hist_box,
                 cand_offset + row * cand_stride);
}
