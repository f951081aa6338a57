// The select stage's task functions and its decoder (ARCHITECTURE.md, "Tasks, teams and
// placement"): what the standalone entry (select.hip) and the fused kernel call for a task of the
// select stage. A task decides its work from its descriptor alone:
//   args[0]  the row: of the scores, the output, the flags, the page table and the stage's boxes
//   args[1]  the row's keys (its length)
//   args[2]  SEL_KIND_SLICE: the slice, me | count << 16 (src/layout.rs Slices); 0 otherwise
//   in[...]  boxes the task waits on before it reads the row's scores: the completion boxes of the
//            runs that wrote them, each put after a release (mbx_publish); none, no wait. A range
//            is slots of sel_args::in_stride boxes whose first box is the one written (a run's
//            completion box and its line's padding), so one range covers consecutive runs.
//            Slice 0 of a row of several slices that publishes its list (out below) lists last
//            the row's gang boxes of slices 1.. (slots of sel_args::gang_stride boxes), waited on
//            after its own part, before it puts the list box (sel_gang_waits)
//   out      the slot (a line) whose first box tells the list's readers it is written (SelectPlan::publish):
//            a one-task kind's, and slice 0's, is the row's list box, put once the whole list is
//            in out (the row's SEL_K entries), after a release; slice s > 0 puts the row's gang box
//            s once its part is written. None (a plan that publishes nothing): no box. The slices'
//            exchange goes to the row's boxes in the SelectBoxes regions (hist_offset, cand_offset)
// Every select task takes the whole CTA as its team (its block scans and barriers are the CTA's).
// A task returns false only when a debug wait gave up (the CTA then stops); other errors are
// flagged on the row (SEL_FLAG_*). Part of select.h.
#pragma once
#include "select_regs.h"
#include "ops/team.h"
#include "ops/paging.h"

#define SEL_KIND_ONE_CTA 1u
#define SEL_KIND_REGISTERS 2u
#define SEL_KIND_SLICE 3u

// What a select task reads and writes besides its descriptor (src/gpu.rs SelArgs, same order, no
// padding), passed by value as a kernel argument.
// The page table is the one the indexer reads (ops/paging.h): row r's entries are cache slots of
// the pages of its request, rows[r].request.
struct sel_args {
  const float* scores;                    // [rows][stride]: a row's scores at positions 0 .. its length
  const u32* page_list;                   // every request's pages, or null: entries are positions
  const mono_page_row* page_rows;         // [rows]: each row's request
  const mono_page_request* page_requests; // each request's page offset
  i32* out;                               // [rows][SEL_K] entries: cache slots (or positions), then -1
  u32* flags;                             // [rows][SEL_FLAGS] error words, zeroed by the host
  u64* trace;                             // SEL_TRACE builds: 2 * SEL_TRACE_MARKS words, or null
  u32 stride;                             // a multiple of 4
  u32 hist_offset;  // SelectBoxes::hist: row r's boxes from hist_offset + r * SEL_ROW_HIST_BOXES
  u32 cand_offset;  // SelectBoxes::cand: row r's from cand_offset + r * cand_stride
  u32 cand_stride;
  u32 in_stride;  // input ranges are slots of this many boxes, the first written (0 or 1: every box)
  u32 gang_stride;  // SelectBoxes::gang's slots: a gang range is slots of this many boxes, the first written
};
#define SEL_ROW_HIST_BOXES (SEL_ROUNDS * SEL_MAX_SLICES * SEL_HIST_BOXES)

// A task makes its row before it waits on its inputs: the row's pages (two loads, which do not
// depend on the hand-off) are then on their way during the wait.
MONO_DEV sel_row sel_row_of(const sel_args& a, u32 row, u32 len) {
  sel_row r;
  r.scores = a.scores + (u64)row * a.stride;
  r.len = len;
  r.stride = a.stride;
  r.out = a.out + (u64)row * SEL_K;
  r.pages = a.page_list ? mono_row_pages(a.page_list, a.page_rows, a.page_requests, row) : nullptr;
  r.flags = a.flags + row * SEL_FLAGS;
  return r;
}

// Input ranges at the end of a task's list that it waits on only after its part of the list:
// slice 0's gang range (1 when it has one).
MONO_DEV u32 sel_gang_waits(const mbx_task& task) {
  const u32 me = task.args[2] & 0xffffu, count = task.args[2] >> 16;
  return mbx_own_kind(task.kind) == SEL_KIND_SLICE && me == 0 && count > 1 && task.out.len != 0 && task.n_inputs > 0;
}

// Waits on every box of input ranges first..end (slots of `stride` boxes, the first written; a
// thread per box), then makes what their writers published before them visible (mbx_acquire in
// every thread before the barrier that ends the wait). Block-wide; false (flagged) when a debug
// wait gave up.
MONO_DEV bool sel_wait_ranges(const mbx_ctx& c, const mbx_task& task, u32 first, u32 end, u32 stride, const sel_row& r) {
  const u32 step = stride > 1u ? stride : 1u;
  bool ok = true;
  for (u32 in = first; in < end; ++in) {
    const mbx_range range = task.in[in];
    for (u32 i = mono_thread() * step; i < range.len && ok; i += SEL_BLOCK * step) {
      u32 value;
      ok = mbx_poll(c, range.first + i, &value);
    }
  }
  mbx_acquire();
  if (mbx_block_agree(c, ok)) return true;
  sel_flag(r, SEL_FLAG_STALLED);
  return false;
}

// The waits before the task reads the row's scores: every input range but the gang's. A
// SEL_FAULT_SKIP_WAIT build skips them: the negative control of the scores' hand-off.
MONO_DEV bool sel_wait_inputs(const mbx_ctx& c, const mbx_task& task, const sel_args& a, const sel_row& r) {
  const u32 inputs = mbx_min(task.n_inputs, MBX_MAX_INPUTS) - sel_gang_waits(task);
  if (inputs == 0 || SEL_FAULT == SEL_FAULT_SKIP_WAIT) return true;
  return sel_wait_ranges(c, task, 0, inputs, a.in_stride, r);
}

// Tells the readers of the task's output box that what it wrote is visible: every thread's
// entries (the barrier), then a release and one tagged box valued with the row. Block-wide; nothing
// when the task has no output box.
MONO_DEV void sel_publish(const mbx_ctx& c, const mbx_task& task, u32 row) {
  if (task.out.len == 0) return;
  mono_sync_block();
  if (mono_thread() == 0) {
    mbx_publish();
    mbx_put(c, task.out.first, row);
  }
}

template <class Team>
MONO_DEV void sel_team_check(const Team&) {
  static_assert(Team::size == SEL_BLOCK, "a select task takes the whole CTA");
}

// The one CTA over a row (in LDS up to SEL_SLICE_KEYS keys, streamed past that).
template <class Team>
MONO_DEV bool sel_one_cta_task(const Team& team, const mbx_task& task, mbx_ctx& c, const sel_args& a, u8* smem) {
  sel_team_check(team);
  sel_smem& sm = *(sel_smem*)smem;
  const sel_row r = sel_row_of(a, task.args[0], task.args[1]);
  if (!sel_wait_inputs(c, task, a, r)) return false;
  sel_trace_begin(sm, a.trace, task.args[0] == 0);
  sel_one_cta_run(sm, (u32*)smem + SEL_SMEM_WORDS, r);
  sel_publish(c, task, task.args[0]);
  return true;
}

// The one CTA over a row of at most SEL_REG_KEYS * SEL_BLOCK keys, held in registers.
template <class Team>
MONO_DEV bool sel_registers_task(const Team& team, const mbx_task& task, mbx_ctx& c, const sel_args& a, u8* smem) {
  sel_team_check(team);
  sel_reg_smem& sm = *(sel_reg_smem*)smem;
  const sel_row r = sel_row_of(a, task.args[0], task.args[1]);
  sel_regs_clear(sm);
  if (!sel_wait_inputs(c, task, a, r)) return false;
  sel_trace_begin(sm, a.trace, task.args[0] == 0);
  sel_regs_run(sm, r);
  sel_publish(c, task, task.args[0]);
  return true;
}

// Slice args[2] & 0xffff of the row's args[2] >> 16 (a gang: every slice of the row runs at once).
template <class Team>
MONO_DEV bool sel_slice_task(const Team& team, const mbx_task& task, mbx_ctx& c, const sel_args& a, u8* smem) {
  sel_team_check(team);
  sel_smem& sm = *(sel_smem*)smem;
  const u32 row = task.args[0], me = task.args[2] & 0xffffu, count = task.args[2] >> 16;
  const sel_row r = sel_row_of(a, row, task.args[1]);
  if (!sel_wait_inputs(c, task, a, r)) return false;
  sel_trace_begin(sm, a.trace, row == 0 && me == 0);
  if (!sel_slice_run(sm, (u32*)smem + SEL_SMEM_WORDS, c, r, me, count, a.hist_offset + row * SEL_ROW_HIST_BOXES,
                     a.cand_offset + row * a.cand_stride))
    return false;
  // The row's list is whole once every slice's part is: slice 0 publishes it after the others'.
  const u32 inputs = mbx_min(task.n_inputs, MBX_MAX_INPUTS);
  if (sel_gang_waits(task) && !sel_wait_ranges(c, task, inputs - 1, inputs, a.gang_stride, r)) return false;
  sel_publish(c, task, row);
  return true;
}

// The select stage's decoder. A kind it does not know is skipped (the host makes no others).
template <class Team>
MONO_DEV bool sel_decode(const Team& team, const mbx_task& task, mbx_ctx& c, const sel_args& a, u8* smem) {
  switch (mbx_own_kind(task.kind)) {
    case SEL_KIND_ONE_CTA:
      return sel_one_cta_task(team, task, c, a, smem);
    case SEL_KIND_REGISTERS:
      return sel_registers_task(team, task, c, a, smem);
    case SEL_KIND_SLICE:
      return sel_slice_task(team, task, c, a, smem);
    default:
      return true;
  }
}
