// Address translation probes: how many pages the TLBs keep and what a page costs past them, and a
// sweep that pushes their entries out before a timed launch. A step reads about 7 GB a row spread
// over a rank's ~93 GB of weights, each link's bytes in pages no link before it touched; whether
// those translations are kept from one step to the next is what these measure.
#include "prelude.h"

// Element i of a page chain: in page i (pages `stride` bytes apart), moved along its page by i
// lines of 4224 bytes (33 lines of 128) so that the elements fall in different cache sets and
// channels rather than all at the page's first line. The stride is a power of two: a mask, not a
// 64-bit division, between two loads of the walk.
MONO_DEV u64 page_chain_offset(u32 i, u64 stride) { return (u64)i * stride + (((u64)i * 4224u) & (stride - 1u)); }

// The chain's order: i -> 5 i + 1 mod n visits all n elements in one cycle when n is a power of
// two (a multiplier of 1 mod 4 and an odd increment), so each step goes to a page that no
// prefetcher guesses from the last.
MONO_DEV u32 page_chain_next(u32 i, u32 n) { return (5u * i + 1u) & (n - 1u); }

// Writes the chain of n elements (n and the stride powers of two, the stride at least 8 KB).
MONO_KERNEL void page_chain_init(u8* base, u64 stride, u32 n) {
  for (u32 i = mono_block() * mono_block_dim() + mono_thread(); i < n; i += mono_grid_dim() * mono_block_dim())
    *(u32*)(base + page_chain_offset(i, stride)) = page_chain_next(i, n);
}

// One thread walks `steps` elements of the chain from element 0, each load waiting on the one
// before (loads at device scope: past L1, from L2 or memory). out[0]: ns on the shared clock,
// out[1]: the SM's cycles, out[2]: the element it ended on (the host checks it against the chain).
MONO_KERNEL void page_chase(const u8* base, u64 stride, u32 steps, u64* out) {
  if (mono_block() != 0 || mono_thread() != 0) return;
  u32 i = 0;
  const u64 t0 = mono_timer_ns(), c0 = mono_clock_cycles();
  for (u32 s = 0; s < steps; ++s) i = mono_ld_relaxed_u32((const u32*)(base + page_chain_offset(i, stride)));
  const u64 c1 = mono_clock_cycles(), t1 = mono_timer_ns();
  out[0] = t1 - t0;
  out[1] = c1 - c0;
  out[2] = i;
}

// One 4-byte load every `stride` bytes of [base, base + bytes), spread over the grid: every page
// of the range gets a translation, pushing older ones out of the TLBs, for a few hundred bytes of
// traffic a megabyte.
MONO_KERNEL void page_sweep(const u8* base, u64 bytes, u64 stride, u32* sink) {
  const u64 pages = bytes / stride;
  u32 acc = 0;
  for (u64 p = (u64)mono_block() * mono_block_dim() + mono_thread(); p < pages;
       p += (u64)mono_grid_dim() * mono_block_dim())
    acc ^= mono_ld_relaxed_u32((const u32*)(base + p * stride));
  // Never true for the zeroed range the probes sweep; it keeps the loads from being dropped.
  if (acc == 0xdeadbeefu) sink[0] = acc;
}
