// Bandwidth probe and launch-overhead probe.
#include "prelude.h"

// Grid-stride copy with 16-byte accesses, four loads in flight per thread before the first store:
// the kernel-side ceiling for streaming stages. (Named values, not an array: clang would move a
// private array into LDS on AMD.)
MONO_KERNEL void copy_16b(const mono_u32x4* src, mono_u32x4* dst, u64 count) {
  const u64 stride = (u64)mono_grid_dim() * mono_block_dim();
  u64 i = (u64)mono_block() * mono_block_dim() + mono_thread();
  for (; i + 3 * stride < count; i += 4 * stride) {
    const mono_u32x4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < count; i += stride) dst[i] = src[i];
}

// One thread adds one: N launches leave N, so direct and graph-replayed launches can be checked.
MONO_KERNEL void bump(u32* counter) {
  if (mono_block() == 0 && mono_thread() == 0) counter[0] += 1;
}

// 16 KiB of static shared memory beside `dynamic_words` of dynamic shared memory: with both, the
// driver's default dynamic limit is 32 KiB, so a launch with more must raise it first.
MONO_KERNEL void shared_sum(const u32* in, u32* out, u32 dynamic_words) {
  __shared__ u32 fixed[4096];
  extern __shared__ u32 dynamic[];
  for (u32 i = mono_thread(); i < 4096; i += mono_block_dim()) fixed[i] = in[i];
  for (u32 i = mono_thread(); i < dynamic_words; i += mono_block_dim()) dynamic[i] = in[4096 + i];
  mono_sync_block();
  if (mono_thread() == 0) {
    u32 sum = 0;
    for (u32 i = 0; i < 4096; ++i) sum += fixed[i];
    for (u32 i = 0; i < dynamic_words; ++i) sum += dynamic[i];
    out[0] = sum;
  }
}

// A chain of dependent reads: the floor of a launch whose links each stream their bytes and then
// hand off to the next through the whole grid, as a fused layer's linear links do. One CTA an SM
// (the fused launches' shape). Link l reads link_words[l] 16-byte words (a contiguous run a CTA,
// 4 or 8 loads a thread in flight, summed so the loads stay live), then its CTA counts itself on
// counters[l]; link l + 1 issues its first loads, then waits until every CTA has counted on link l.
// The host zeroes the counters before each launch. CTA 0 stamps the shared clock at its start
// (stamps[0]) and when it sees each link complete (stamps[1 + l]; the last link waited for at the
// end): the chain's timeline.
template <u32 DEPTH>
MONO_DEV void read_chain(const mono_u32x4* src, const u64* link_words, u32 links, u32* counters, u32* sink,
                         u64* stamps) {
  const u32 grid = mono_grid_dim(), threads = mono_block_dim(), t = mono_thread();
  const bool stamping = mono_block() == 0 && t == 0;
  if (stamping) stamps[0] = mono_timer_ns();
  u32 acc = 0;
  u64 base = 0;
  for (u32 l = 0; l < links; ++l) {
    const u64 words = link_words[l], share = (words + grid - 1) / grid;
    const u64 lo = share * mono_block(), hi = share * (mono_block() + 1);
    const u64 begin = base + (lo < words ? lo : words), end = base + (hi < words ? hi : words);
    mono_u32x4 v[DEPTH];
#pragma unroll
    for (u32 b = 0; b < DEPTH; ++b)
      if (begin + t + b * threads < end) v[b] = src[begin + t + b * threads];
    if (l > 0) {
      if (t == 0) {
        while (mono_ld_acquire_u32(counters + l - 1) < grid) {
        }
        if (stamping) stamps[l] = mono_timer_ns();
      }
      mono_sync_block();
    }
    for (u64 i = begin + t; i < end; i += DEPTH * threads) {
#pragma unroll
      for (u32 b = 0; b < DEPTH; ++b)
        if (i + b * threads < end) acc += v[b].x ^ v[b].y ^ v[b].z ^ v[b].w;
#pragma unroll
      for (u32 b = 0; b < DEPTH; ++b)
        if (i + (DEPTH + b) * threads < end) v[b] = src[i + (DEPTH + b) * threads];
    }
    mono_sync_block();
    if (t == 0) {
      mono_fence_release();
      mono_atomic_add_u32(counters + l, 1u);
    }
    base += words;
  }
  if (stamping) {
    while (mono_ld_acquire_u32(counters + links - 1) < grid) {
    }
    stamps[links] = mono_timer_ns();
  }
  // Never true for the zeroed sources the benches read; it keeps the loads from being dropped.
  if (acc == 0xdeadbeefu) sink[0] = acc;
}

MONO_KERNEL void read_chain4(const mono_u32x4* src, const u64* link_words, u32 links, u32* counters, u32* sink,
                             u64* stamps) {
  read_chain<4>(src, link_words, links, counters, sink, stamps);
}
MONO_KERNEL void read_chain8(const mono_u32x4* src, const u64* link_words, u32 links, u32* counters, u32* sink,
                             u64* stamps) {
  read_chain<8>(src, link_words, links, counters, sink, stamps);
}
