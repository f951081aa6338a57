// The synthetic persistent launch: one generic kernel runs each CTA's task list, dispatching on the
// task kind; the kinds combine their inputs with integer hashes, bit-identical to src/synth.rs.
#include "prelude.h"
#include "mailbox.h"

// Longest row a task writes or reads (src/synth.rs ROW_MAX); the host rejects longer ones.
#ifndef MBX_SYN_ROW_MAX
#define MBX_SYN_ROW_MAX 64
#endif

#define MBX_SYN_LEAF 1u
#define MBX_SYN_MIX 2u
#define MBX_SYN_NO_OUTPUT 0xffffffffu

MONO_DEV u32 syn_mix32(u32 x) {
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  return x ^ (x >> 16);
}
MONO_DEV u32 syn_rotl(u32 x, u32 r) {
  r &= 31u;
  return r == 0 ? x : (x << r) | (x >> (32u - r));
}
MONO_DEV u32 syn_sum(const u32* row, u32 len) {
  u32 s = 0;
  for (u32 k = 0; k < len; ++k) s += row[k];
  return s;
}
MONO_DEV u32 syn_seed(u32 salt, u32 i) { return syn_mix32(salt ^ (i * 0x9e3779b9u)); }

MONO_DEV u32 syn_leaf_word(u32 salt, u32 i, const u32* slice, u32 len, u32 step) {
  u32 h = syn_seed(salt, i);
  h = syn_mix32(h ^ slice[i % len]);
  h = syn_mix32(h + syn_sum(slice, len));
  return syn_mix32(h ^ (step * 0x27d4eb2fu));
}

// Input row r is staged at stage[r * MBX_SYN_ROW_MAX]; empty rows are skipped, as on the CPU.
MONO_DEV u32 syn_mix_word(u32 salt, u32 i, const u32* stage, const mbx_task& t, u32 n_in) {
  u32 h = syn_seed(salt, i);
  for (u32 r = 0; r < n_in; ++r) {
    const u32 len = t.in[r].len;
    if (len == 0) continue;
    const u32* row = stage + r * MBX_SYN_ROW_MAX;
    const u32 a = row[i % len];
    const u32 b = row[(i * 7u + 3u) % len];
    h = syn_mix32(h ^ a);
    h = syn_mix32(h + syn_rotl(b, 5u * r + 1u));
    h = syn_mix32(h ^ syn_sum(row, len));
  }
  return h;
}

// One launch. The tag comes from the epoch word; the step word (advanced by mailbox_step_counter
// after the launches of a step) salts the leaves, so replays of a graph compute new values, and
// picks the output slot: out[(step * launches_per_step + launch_index) * out_words ...]. `trace`
// (null: none) gets a record per task in MBX_TRACE builds.
MONO_KERNEL void mailbox_synthetic(const mbx_task* tasks, const u32* offsets, u32 n_ctas, u64* scratch,
                                   const u32* epoch_word, u32 launches_per_step, u32 launch_index,
                                   const u32* inputs, const u32* step_word, u32* out, u32 out_slots,
                                   u32 out_words, u32* diag, u64* trace) {
  __shared__ u32 stage[MBX_MAX_INPUTS * MBX_SYN_ROW_MAX];
  __shared__ u32 row[MBX_SYN_ROW_MAX];
  const u32 tag = mbx_launch_tag(epoch_word, launches_per_step, launch_index);
  const u32 step = mono_ld_relaxed_u32(step_word);
  const u32 slot = step * launches_per_step + launch_index;
  mbx_ctx ctx = mbx_begin(scratch, tag, diag);
  mbx_run_list(ctx, tasks, offsets, n_ctas, trace, [&](mbx_ctx& c, const mbx_task& t) -> bool {
    if (t.kind != MBX_SYN_LEAF && t.kind != MBX_SYN_MIX) return true;  // the host makes no others
    const u32 n_in = mbx_min(t.n_inputs, MBX_MAX_INPUTS);
    for (u32 r = 0; r < n_in; ++r) {
      if (!mbx_wait_all(c, t.in[r].first, mbx_min(t.in[r].len, MBX_SYN_ROW_MAX), stage + r * MBX_SYN_ROW_MAX))
        return false;
    }
    const u32 len = mbx_min(t.out.len, MBX_SYN_ROW_MAX);
    for (u32 i = mono_thread(); i < len; i += mono_block_dim()) {
      const u32 h = t.kind == MBX_SYN_LEAF ? syn_leaf_word(t.args[0], i, inputs + t.args[1], len, step)
                                           : syn_mix_word(t.args[0], i, stage, t, n_in);
      row[i] = h;
      if (t.args[2] != MBX_SYN_NO_OUTPUT && slot < out_slots) out[(u64)slot * out_words + t.args[2] + i] = h;
    }
    // row[i] is read back by the thread that wrote it (mbx_put_row's mapping): no barrier needed.
    mbx_put_row(c, t.out.first, row, len);
    return true;
  });
}

// Advances the step word once per replay (after the launches of the step).
MONO_KERNEL void mailbox_step_counter(u32* step_word) {
  if (mono_block() == 0 && mono_thread() == 0) mono_st_relaxed_u32(step_word, mono_ld_relaxed_u32(step_word) + 1u);
}
