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
