// A reader of select's lists inside the fused front half's launch: the stand-in for the attention
// tasks, which wait on a row's list the same way (src/fused/front.rs says how), so that the GPU
// check shows a reader that waits sees this launch's list. Stage MBX_STAGE_SYNTHETIC, own kind
// LIST_READER_KIND_COPY: args[0] = the row, in[0] = the row's list box. It waits on the box, makes
// the list visible (mbx_acquire in every thread, then a barrier), then copies the row's k entries
// to copy[row * k..]. A LIST_READER_FAULT=1 build skips the wait: the negative control, which
// reads whatever the list held before this launch's select wrote it.
#pragma once
#include "mailbox.h"

#ifndef LIST_READER_FAULT
#define LIST_READER_FAULT 0
#endif
#define LIST_READER_KIND_COPY 1u

// The reader's buffers (src/fused/front_gpu.rs ReaderArgs, same order, no padding).
struct list_reader_args {
  const i32* lists;  // [rows][k]: select's output
  i32* copy;         // [rows][k]: what the readers saw
  u32 k;
  u32 pad;
};

template <class Team>
MONO_DEV bool list_reader_decode(const Team& team, const mbx_task& task, mbx_ctx& c, const list_reader_args& a, u8*) {
  if (mbx_own_kind(task.kind) != LIST_READER_KIND_COPY) return true;
  bool ok = true;
  if (!LIST_READER_FAULT && task.n_inputs > 0 && team.leader()) {
    u32 value;
    ok = mbx_poll(c, task.in[0].first, &value);
  }
  mbx_acquire();
  if (!mbx_block_agree(c, ok)) return false;
  const u64 base = (u64)task.args[0] * a.k;
  for (u32 i = team.thread(); i < a.k; i += Team::size) a.copy[base + i] = a.lists[base + i];
  return true;
}
