// Tagged-pair hand-offs between the CTAs of a persistent launch (ARCHITECTURE.md sections 4 and 5).
// The host side of every formula here is crates/mailbox/src/layout.rs; the CPU twin of the
// protocol is src/protocol.rs. Keep the three in step.
//
// A box is one 64-bit word: tag in the high 32 bits, value in the low 32. A box is ready when
// its tag is this launch's tag, so boxes are never cleared between launches.
//
// Defines:
//   MBX_POLL_ACQUIRE  0: relaxed polls, mbx_acquire() a fence (default); 1: acquire polls.
//   MBX_DEBUG         1: every poll is bounded by MBX_POLL_LIMIT tries; the first poller to give
//                     up writes who waited on what to the diagnostics area (layout in
//                     src/diag.rs) and, with MBX_DEBUG_TRAP=1 (default), traps.
//   MBX_DEBUG_TRAP    0: give up without trapping: every CTA stops at its next wait and the launch
//                     ends normally, so the host can read the diagnostics (a trap can leave the
//                     context unusable, diagnostics included).
//   MBX_EPOCH_CLEAR   0: the epoch node skips clearing the scratch on wrap (only for the test that
//                     shows why it must).
//   MBX_TRACE         1: the task loop stamps every task's start and end into the launch's trace
//                     buffer (mbx_launch.trace; a null pointer traces nothing). 0 (default): no
//                     stamps, no code.
#pragma once
#include "prelude.h"

#ifndef MBX_POLL_ACQUIRE
#define MBX_POLL_ACQUIRE 0
#endif
#ifndef MBX_DEBUG
#define MBX_DEBUG 0
#endif
#ifndef MBX_DEBUG_TRAP
#define MBX_DEBUG_TRAP 1
#endif
#ifndef MBX_POLL_LIMIT
#define MBX_POLL_LIMIT (1u << 30)
#endif
#ifndef MBX_EPOCH_CLEAR
#define MBX_EPOCH_CLEAR 1
#endif
#ifndef MBX_TRACE
#define MBX_TRACE 0
#endif

#define MBX_DIAG_WORDS 8
#define MBX_MAX_INPUTS 4
#define MBX_TASK_ARGS 3
// Boxes a 128-byte line holds (src/layout.rs BOXES_PER_LINE): boxes of different CTAs never share one.
#define MBX_BOXES_PER_LINE 16u

// ---- task descriptor (src/task.rs `Task`, 64 bytes) ----------------------------------------------
struct mbx_range {
  u32 first;
  u32 len;
};
struct mbx_task {
  u32 kind;
  u32 order;  // rank in the launch's global topological order; tasks sharing one form a gang
  u32 n_inputs;
  u32 args[MBX_TASK_ARGS];
  mbx_range out;
  mbx_range in[MBX_MAX_INPUTS];
};
static_assert(sizeof(mbx_task) == 64, "mbx_task must match the Rust Task");

// A task's kind names its stage in the high bits and the stage's own kind in the low 8
// (src/task.rs `Stage`, `Task::kind_of`): the fused kernel's switch goes by stage, each stage's
// decoder by its own kinds.
#define MBX_STAGE_SHIFT 8u
#define MBX_STAGE_SYNTHETIC 0u
#define MBX_STAGE_INDEXER 1u
#define MBX_STAGE_SELECT 2u
#define MBX_STAGE_LINEAR 3u
#define MBX_STAGE_MOE 4u
#define MBX_STAGE_MLA 5u
#define MBX_STAGE_HEAD 6u
MONO_DEV u32 mbx_stage_of(u32 kind) { return kind >> MBX_STAGE_SHIFT; }
MONO_DEV u32 mbx_own_kind(u32 kind) { return kind & ((1u << MBX_STAGE_SHIFT) - 1u); }

// ---- box words and tags --------------------------------------------------------------------------
MONO_DEV u64 mbx_pack(u32 tag, u32 value) { return ((u64)tag << 32) | (u64)value; }
MONO_DEV u32 mbx_tag_of(u64 word) { return (u32)(word >> 32); }
MONO_DEV u32 mbx_value_of(u64 word) { return (u32)word; }
MONO_DEV u32 mbx_min(u32 a, u32 b) { return a < b ? a : b; }

// The largest epoch whose tags all fit below 2^32 (launches_per_step >= 1, checked by the host).
MONO_DEV u32 mbx_last_epoch(u32 launches_per_step) { return 0xffffffffu / launches_per_step - 1u; }
// Never 0, one more every launch of a step and every step.
MONO_DEV u32 mbx_tag(u32 epoch, u32 launches_per_step, u32 launch_index) {
  return epoch * launches_per_step + launch_index + 1u;
}
// The tag of this launch. The epoch word is read, not passed: a replayed graph freezes arguments,
// and the epoch node advanced the word before this launch (stream order), so every CTA reads the same.
MONO_DEV u32 mbx_launch_tag(const u32* epoch_word, u32 launches_per_step, u32 launch_index) {
  return mbx_tag(mono_ld_relaxed_u32(epoch_word), launches_per_step, launch_index);
}

// The epoch node's body. Launch it with one CTA, stream-ordered before the launches it tags.
// It advances the epoch once; at the last epoch it zeroes the scratch and restarts at 0, since the
// restarted tags were used before and old boxes could otherwise look ready.
MONO_DEV void mbx_advance_epoch(u32* epoch_word, u64* scratch, u32 n_boxes, u32 launches_per_step) {
  if (mono_block() != 0 || launches_per_step == 0) return;
  const u32 epoch = mono_ld_relaxed_u32(epoch_word);
  const bool wrap = epoch >= mbx_last_epoch(launches_per_step);
#if MBX_EPOCH_CLEAR
  if (wrap)
    for (u32 i = mono_thread(); i < n_boxes; i += mono_block_dim()) mono_st_relaxed_u64(scratch + i, 0);
#endif
  // Every thread has read the old epoch before thread 0 replaces it.
  mono_sync_block();
  if (mono_thread() == 0) mono_st_relaxed_u32(epoch_word, wrap ? 0u : epoch + 1u);
}

// ---- the per-launch context ----------------------------------------------------------------------
struct mbx_ctx {
  u64* scratch;  // box 0; box indices are relative to it
  u32 tag;       // this launch's tag (what a ready box holds)
  u32 task;      // global order of the running task, for reports
  u32* diag;     // MBX_DIAG_WORDS words zeroed by the host; written only by debug builds
  u32* fail;     // shared flag: a wait of this CTA gave up (debug builds)
};

// Block-wide: every thread of the CTA calls it once, before any wait.
MONO_DEV mbx_ctx mbx_begin(u64* scratch, u32 tag, u32* diag) {
  mbx_ctx c;
  c.scratch = scratch;
  c.tag = tag;
  c.task = 0xffffffffu;
  c.diag = diag;
  c.fail = nullptr;
#if MBX_DEBUG
  __shared__ u32 fail;
  c.fail = &fail;
  if (mono_thread() == 0) fail = 0;
  mono_sync_block();
#endif
  return c;
}

// ---- producer ------------------------------------------------------------------------------------
// A pair carries its value in the same word as its tag, so a waiter that reads only box values
// needs no fence and no release: stores are relaxed. Data published beside boxes (a buffer the
// consumer reads directly) is the exception: mbx_publish() before the puts, mbx_acquire() after
// the waits.

// One store of (tag, value).
MONO_DEV void mbx_put(const mbx_ctx& c, u32 box, u32 value) {
  mono_st_relaxed_u64(c.scratch + box, mbx_pack(c.tag, value));
}

// Block-wide: vals[0..n) to boxes first.. as tagged pairs, box i by thread i % block_dim (the same
// thread that mbx_wait_all gives box i, so a caller may pass values it computed itself without a
// barrier). No flag, no drain: the consumer polls the data itself.
MONO_DEV void mbx_put_row(const mbx_ctx& c, u32 first, const u32* vals, u32 n) {
  for (u32 i = mono_thread(); i < n; i += mono_block_dim())
    mono_st_relaxed_u64(c.scratch + first + i, mbx_pack(c.tag, vals[i]));
}

// Orders this thread's earlier writes (after a block barrier: its CTA's) before its later box stores.
MONO_DEV void mbx_publish() { mono_fence_release(); }

// ---- consumer ------------------------------------------------------------------------------------
MONO_DEV u64 mbx_load(const u64* p) {
#if MBX_POLL_ACQUIRE
  return mono_ld_acquire_u64(p);
#else
  return mono_ld_relaxed_u64(p);
#endif
}

// After the waits and before reading data published beside the boxes (mbx_publish). Not needed
// to read the boxes' own values.
MONO_DEV void mbx_acquire() {
#if !MBX_POLL_ACQUIRE
  mono_fence_acquire();
#endif
}

#if MBX_DEBUG
// The first poller to give up fills the diagnostics area (src/diag.rs reads it).
MONO_DEV void mbx_report(const mbx_ctx& c, u32 box, u64 seen) {
  if (mono_atomic_add_u32(c.diag, 1) == 0) {
    mono_st_relaxed_u32(c.diag + 1, c.task);
    mono_st_relaxed_u32(c.diag + 2, box);
    mono_st_relaxed_u32(c.diag + 3, mono_block());
    mono_st_relaxed_u32(c.diag + 4, c.tag);
    mono_st_relaxed_u32(c.diag + 5, mbx_tag_of(seen));
    mono_st_relaxed_u32(c.diag + 6, mbx_value_of(seen));
    mono_st_relaxed_u32(c.diag + 7, mono_thread());
    mono_fence_release();
  }
#if MBX_DEBUG_TRAP
  mono_trap();
#endif
}
#endif

#if MBX_DEBUG
// A bounded wait's `polls` are enough to give up: MBX_POLL_LIMIT of them, or, on CPU threads (the
// host prelude), 10000 once the launcher has seen the launch stall (no barrier passed in any CTA
// for its stall time). There polls back off to sleeps, so the default count (2^30) would take
// hours on its own; a smaller MBX_POLL_LIMIT stays a backstop for a stall the launcher misses.
MONO_DEV bool mbx_bound_expired(u32 polls) {
#if MONO_HOST
  if (polls >= 10000u && emu_launch_stalled()) return true;
#endif
  return polls >= (u32)MBX_POLL_LIMIT;
}
#endif

// Polls one box until it holds c.tag. Returns false only in debug builds:
// the bound expired (reported), or another poller already gave up.
MONO_DEV bool mbx_poll(const mbx_ctx& c, u32 box, u32* value) {
  const u64* p = c.scratch + box;
  u64 word = mbx_load(p);
#if MBX_DEBUG
  u32 polls = 1;
#endif
  while (mbx_tag_of(word) != c.tag) {
#if MBX_DEBUG
    if (mbx_bound_expired(polls)) {
      mbx_report(c, box, word);
      return false;
    }
    // Once someone gave up, stop soon rather than after a full bound per waiter down the chain.
    if ((polls & 1023u) == 0 && mono_ld_relaxed_u32(c.diag) != 0) return false;
    ++polls;
#endif
    word = mbx_load(p);
  }
  *value = mbx_value_of(word);
  return true;
}

// One box, by the calling thread alone.
MONO_DEV bool mbx_wait(const mbx_ctx& c, u32 box, u32* value) { return mbx_poll(c, box, value); }

// A range that a task of the stages that wait by line (src/placement.rs `waits_by_line`: linear,
// MoE, MLA, head) waits on without reading the boxes' values, thread `thread` of `threads`. A range
// of whole lines is waited on by the last box of each line: its one writer (the placement check,
// `SplitLine`) puts that box after everything it publishes, so the line's other boxes say nothing
// more, and a thread polls one line rather than several one after another (a link's wait on 128
// producers was four dependent round trips a thread, about 2 us after the last had published).
MONO_DEV bool mbx_poll_range(const mbx_ctx& c, mbx_range in, u32 thread, u32 threads) {
  const bool lines = in.len != 0 && in.first % MBX_BOXES_PER_LINE == 0 && in.len % MBX_BOXES_PER_LINE == 0;
  const u32 step = lines ? MBX_BOXES_PER_LINE : 1u;
  bool ok = true;
  for (u32 i = thread * step + (step - 1u); i < in.len && ok; i += threads * step) {
    u32 v;
    ok = mbx_poll(c, in.first + i, &v);
  }
  return ok;
}

// Block-wide agreement on a wait's outcome; ends with every thread past a barrier.
MONO_DEV bool mbx_block_agree(const mbx_ctx& c, bool ok) {
#if MBX_DEBUG
  if (!ok) *c.fail = 1;
  mono_sync_block();
  const bool all_ok = *(volatile u32*)c.fail == 0;
  // No thread may set the flag again before every thread has read it.
  mono_sync_block();
  return all_ok;
#else
  (void)c;
  (void)ok;
  mono_sync_block();
  return true;
#endif
}

// Block-wide: waits for boxes first..first+n, box i by thread i % block_dim (a lane per box, so a
// wave polls MONO_WAVE boxes at once), values to dst[0..n) (shared or global memory), then a block
// barrier. Returns the same in every thread: false only in debug
// builds when a wait gave up; the CTA should then stop.
MONO_DEV bool mbx_wait_all(const mbx_ctx& c, u32 first, u32 n, u32* dst) {
  bool ok = true;
  for (u32 i = mono_thread(); i < n && ok; i += mono_block_dim()) ok = mbx_poll(c, first + i, dst + i);
  return mbx_block_agree(c, ok);
}

// ---- the task trace (src/trace.rs `Record`) -------------------------------------------------------
// One record of MBX_TRACE_WORDS words per task position of the table (tasks[i] -> record i), by
// thread 0 after the task's closing barrier:
//   [0] start, [1] end: mono_timer_ns, one clock for every SM, so CTAs compare (in coarser steps)
//   [2] start, [3] end: mono_clock_cycles, fine but per SM, so only durations within a CTA
//   [4] the SM id, [5] the CTA, [6] (order << 32) | kind, [7] MBX_TRACE_MARK (the record was written)
#define MBX_TRACE_WORDS 8
#define MBX_TRACE_MARK 0x4d42585452414345ull

#if MBX_TRACE
MONO_DEV void mbx_trace_store(u64* record, const mbx_task& t, u32 cta, u32 sm, u64 start_ns, u64 start_cycles) {
  const u64 end_ns = mono_timer_ns();
  const u64 end_cycles = mono_clock_cycles();
  record[0] = start_ns;
  record[1] = end_ns;
  record[2] = start_cycles;
  record[3] = end_cycles;
  record[4] = sm;
  record[5] = cta;
  record[6] = ((u64)t.order << 32) | t.kind;
  record[7] = MBX_TRACE_MARK;
}
#endif

// ---- the persistent task loop --------------------------------------------------------------------
// What every task-list launch takes besides its stages' arguments (src/gpu.rs `LaunchTable`): the
// placement's table, the scratch, where the tag comes from, the diagnostics area, and the trace.
struct mbx_launch {
  const mbx_task* tasks;
  const u32* offsets;  // CTA c runs tasks[offsets[c] .. offsets[c + 1])
  u64* scratch;
  const u32* epoch;
  u32* diag;
  u64* trace;  // MBX_TRACE_WORDS words per task of `tasks`, or null; read only by MBX_TRACE builds
  u32 n_ctas;
  u32 launches_per_step;
  u32 launch_index;
  u32 pad;
};

// MBX_TASK_IN_LDS=1 (the fused kernels): mbx_run_list hands each task the CTA's copy of its
// descriptor in LDS. A standalone stage kernel keeps the table reference: the indexer's, at the
// fused shape's 128 registers, spills with the copy.
#ifndef MBX_TASK_IN_LDS
#define MBX_TASK_IN_LDS 0
#endif
#if MONO_NVIDIA && MBX_TASK_IN_LDS
// tasks[i] into held[i % 2] by the CTA's first four threads, 16 bytes each, asynchronously
// (`cp.async`): the copy lands while the task before runs. mbx_fetch_wait, then a block barrier,
// before anyone reads it.
MONO_DEV void mbx_fetch_task(mbx_task* held, const mbx_task* tasks, u32 i) {
  const u32 t = mono_thread();
  if (t >= sizeof(mbx_task) / 16) return;
  const u32 lds = mono_lds_address((const char*)(held + (i & 1u)) + 16 * t);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n\tcp.async.commit_group;" ::"r"(lds),
               "l"((const char*)(tasks + i) + 16 * t)
               : "memory");
}
MONO_DEV void mbx_fetch_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }
#endif

// Runs this CTA's list: tasks[offsets[cta] .. offsets[cta+1]) in order (src/placement.rs
// TaskTable). body(c, task) is called by every thread and returns false to stop the CTA (a debug
// wait gave up). A block barrier separates tasks, so a task may reuse the shared memory of the last.
// In MBX_TRACE builds with a non-null `trace`, every task that completes gets its record.
template <class Body>
MONO_DEV void mbx_run_list(mbx_ctx& c, const mbx_task* tasks, const u32* offsets, u32 n_ctas, u64* trace,
                           Body body) {
  const u32 cta = mono_block();
  if (cta >= n_ctas) return;
#if MBX_TRACE
  const bool stamps = trace != nullptr && mono_thread() == 0;
  const u32 sm = stamps ? mono_sm_id() : 0u;
#else
  (void)trace;
#endif
  const u32 end = offsets[cta + 1];
#if MONO_NVIDIA && MBX_TASK_IN_LDS
  // The task a CTA runs, in LDS, the next one copied in while this one runs: every wait's acquire
  // empties L1, so a field read from the table after it (the outputs at the publish, the next
  // task's kind) would be an L2 round trip on the chain. Aligned for the 16-byte copies, which
  // fault on a slot that the kernel's other shared variables left at 4 bytes.
  __shared__ alignas(16) mbx_task held[2];
  if (offsets[cta] < end) mbx_fetch_task(held, tasks, offsets[cta]);
  mbx_fetch_wait();
  mono_sync_block();
#endif
  for (u32 i = offsets[cta]; i < end; ++i) {
#if MONO_NVIDIA && MBX_TASK_IN_LDS
    if (i + 1 < end) mbx_fetch_task(held, tasks, i + 1);
    const mbx_task& task = held[i & 1u];
#else
    // A reference into the table, not a copy: on AMD a copy indexed by input number lands in
    // scratch memory, while uniform loads from the table stay in scalar registers.
    const mbx_task& task = tasks[i];
#endif
    c.task = task.order;
#if MBX_TRACE
    const u64 start_ns = stamps ? mono_timer_ns() : 0ull;
    const u64 start_cycles = stamps ? mono_clock_cycles() : 0ull;
#endif
    if (!body(c, task)) return;
#if MONO_NVIDIA && MBX_TASK_IN_LDS
    mbx_fetch_wait();
#endif
    mono_sync_block();
#if MBX_TRACE
    // Past the barrier the other threads may already copy task i + 2 into this slot; the record
    // reads only kind and order, the first 16 bytes, which thread 0 (this thread) copies itself.
    if (stamps) mbx_trace_store(trace + (u64)i * MBX_TRACE_WORDS, task, cta, sm, start_ns, start_cycles);
#endif
  }
}

// The same without a trace.
template <class Body>
MONO_DEV void mbx_run_list(mbx_ctx& c, const mbx_task* tasks, const u32* offsets, u32 n_ctas, Body body) {
  mbx_run_list(c, tasks, offsets, n_ctas, nullptr, body);
}

// The same, from a launch's arguments: every thread of the CTA calls it once.
template <class Body>
MONO_DEV void mbx_run_launch(const mbx_launch& l, Body body) {
  mbx_ctx c = mbx_begin(l.scratch, mbx_launch_tag(l.epoch, l.launches_per_step, l.launch_index), l.diag);
  mbx_run_list(c, l.tasks, l.offsets, l.n_ctas, l.trace, body);
}
