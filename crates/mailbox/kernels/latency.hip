// Hand-off latency: a token runs around a ring of CTAs (one per SM at grid = SM count). Hop h is
// made by CTA h % grid: it waits for hop h-1 in the previous CTA's slot, checks the values, and
// writes its own slot with the next tag. Tags grow by one a hop, so slots are reused uncleared.
#include "prelude.h"
#include "mailbox.h"

// Longest row. A row of 1 without payload is the bare hand-off (thread 0 waits and puts); with a
// payload, thread 0 puts and the block waits; longer rows use mbx_put_row and mbx_wait_all.
#ifndef MBX_LAT_ROW_MAX
#define MBX_LAT_ROW_MAX 64
#endif

// boxes: grid slots of `stride` boxes (a multiple of 16, so slots sit on their own lines).
// times[0]: CTA 0 starting hop `grid` (every CTA has started by then); times[1]: the last hop done.
// errors: words that arrived with a wrong value. payload_words > 0 (1-box rows only): each hop also
// writes that many plain words beside its box, mbx_publish() before its put, and the next hop
// checks them after mbx_acquire(), so the test covers data published outside the boxes.
MONO_KERNEL void mailbox_latency_ring(u64* boxes, u32 row_words, u32 stride, u32 rounds, u32 tag_base,
                                      u64* times, u32* errors, u32* sm_ids, u32* payload, u32 payload_words,
                                      u32* diag) {
  __shared__ u32 got[MBX_LAT_ROW_MAX];
  __shared__ u32 put[MBX_LAT_ROW_MAX];
  const u32 n = mono_grid_dim();
  const u32 cta = mono_block();
  const u32 total = rounds * n;
  const u32 words = mbx_min(row_words, MBX_LAT_ROW_MAX);
  const u32 prev = (cta + n - 1u) % n;
  if (mono_thread() == 0) sm_ids[cta] = mono_sm_id();
  mbx_ctx c = mbx_begin(boxes, 0, diag);
  if (words == 1 && payload_words == 0) {
    // One box that one thread consumes: the bare hand-off, no barrier and no shared memory.
    if (mono_thread() != 0) return;
    for (u32 r = 0; r < rounds; ++r) {
      const u32 h = r * n + cta;
      if (h > 0) {
        c.tag = tag_base + h;
        u32 v;
        if (!mbx_wait(c, prev * stride, &v)) return;
        if (v != (h - 1u) * MBX_LAT_ROW_MAX) mono_atomic_add_u32(errors, 1);
      }
      if (h == n) times[0] = mono_timer_ns();
      c.tag = tag_base + h + 1u;
      mbx_put(c, cta * stride, h * MBX_LAT_ROW_MAX);
      if (h == total - 1u) times[1] = mono_timer_ns();
    }
    return;
  }
  for (u32 r = 0; r < rounds; ++r) {
    const u32 h = r * n + cta;
    if (h > 0) {
      c.tag = tag_base + h;  // hop h-1 wrote tag_base + (h-1) + 1
      if (!mbx_wait_all(c, prev * stride, words, got)) return;
      u32 bad = 0;
      for (u32 i = mono_thread(); i < words; i += mono_block_dim()) bad += got[i] != (h - 1u) * MBX_LAT_ROW_MAX + i;
      if (payload_words > 0) mbx_acquire();
      if (payload_words > 0 && mono_thread() == 0)
        for (u32 j = 0; j < payload_words; ++j) bad += payload[prev * payload_words + j] != (h - 1u) * payload_words + j;
      if (bad) mono_atomic_add_u32(errors, bad);
    }
    if (h == n && mono_thread() == 0) times[0] = mono_timer_ns();
    c.tag = tag_base + h + 1u;
    if (words == 1) {
      if (mono_thread() == 0) {
        for (u32 j = 0; j < payload_words; ++j) payload[cta * payload_words + j] = h * payload_words + j;
        if (payload_words > 0) mbx_publish();
        mbx_put(c, cta * stride, h * MBX_LAT_ROW_MAX);
      }
    } else {
      for (u32 i = mono_thread(); i < words; i += mono_block_dim()) put[i] = h * MBX_LAT_ROW_MAX + i;
      mbx_put_row(c, cta * stride, put, words);
    }
    if (h == total - 1u && mono_thread() == 0) times[1] = mono_timer_ns();
  }
}
