// Bandwidth probe and launch-overhead probe.
#include "prelude.h"

#ifndef COPY_UNROLL
#define COPY_UNROLL 4
#endif

// Grid-stride copy with 16-byte accesses, COPY_UNROLL loads in flight per thread before the first
// store: the kernel-side ceiling for streaming stages.
MONO_KERNEL void copy_16b(const mono_u32x4* src, mono_u32x4* dst, u64 count) {
  const u64 stride = (u64)mono_grid_dim() * mono_block_dim();
  u64 i = (u64)mono_block() * mono_block_dim() + mono_thread();
  for (; i + (COPY_UNROLL - 1) * stride < count; i += COPY_UNROLL * stride) {
    mono_u32x4 v[COPY_UNROLL];
#pragma unroll
    for (u32 u = 0; u < COPY_UNROLL; ++u) v[u] = src[i + u * stride];
#pragma unroll
    for (u32 u = 0; u < COPY_UNROLL; ++u) dst[i + u * stride] = v[u];
  }
  for (; i < count; i += stride) dst[i] = src[i];
}

// One thread adds one: N launches leave N, so direct and graph-replayed launches can be checked.
MONO_KERNEL void bump(u32* counter) {
  if (mono_block() == 0 && mono_thread() == 0) counter[0] += 1;
}
