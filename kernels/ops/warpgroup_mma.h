// Warpgroup-scope matrix operations (NVIDIA sm_90a): wgmma, the shared-memory matrix descriptors
// it reads its B (and optionally A) operand through, and the 128-byte swizzle those tiles are laid
// out in. A warpgroup is four consecutive warps (128 threads, the first a multiple of 128): a
// mono_team<128, CTA> from team.split<128>(). Every thread of the warpgroup calls each function.
//
// The shapes here are m64nNk16 with f16 inputs and f32 accumulators, A from registers ("rs"): the
// form the indexer's scorer uses. Other shapes and types are added beside them as a stage needs
// them. AMD (gfx950) has no warpgroup scope: its stages use the wave-scope MFMA of warp_mma.h.
#pragma once
#include "prelude.h"
#include "ops/copy.h"

#if MONO_NVIDIA
// ---- shared-memory tiles with the 128-byte swizzle ---------------------------------------------
// A K-major tile of `rows` rows: each row's K is cut into 128-byte blocks (64 f16), the tile holds
// the first K block of every row, then the second, ...; within a block, 16-byte chunk c of row r
// sits at chunk c ^ (r % 8). Byte offset of 16-byte chunk `chunk` (counted over the row's whole K)
// of row `row`. The tile's base must be 1024-byte aligned (the swizzle repeats every 8 rows).
MONO_DEV u32 mono_sw128_offset(u32 rows, u32 row, u32 chunk) {
  return (chunk / 8u) * rows * 128u + row * 128u + 16u * ((chunk % 8u) ^ (row % 8u));
}

// The start-address field of a matrix descriptor (PTX ISA, "Matrix Descriptor Format"): the tile's
// LDS byte address / 16. A tile at a known offset from another is then a 32-bit add to it.
MONO_DEV u32 mono_smem_desc_start(const void* lds) { return (mono_lds_address(lds) & 0x3ffffu) >> 4; }
// The descriptor of a 128-byte-swizzled K-major tile whose start field is `start`: leading
// dimension offset unused (swizzled K-major), stride offset 1024 bytes (8 rows of 128 bytes). The
// start field is the descriptor's low word alone, so a loop can step it without rebuilding the rest.
MONO_DEV u64 mono_smem_desc_sw128(u32 start) { return (u64)start | ((u64)(1024u >> 4) << 32) | (1ull << 62); }

// ---- the asynchronous region ---------------------------------------------------------------------
// fence: before the first wgmma that reads registers or LDS written since the last one; commit:
// closes a group of issued wgmmas; wait<N>: until at most N groups are in flight.
MONO_DEV void mono_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
MONO_DEV void mono_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <u32 N>
MONO_DEV void mono_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of these registers across the asynchronous region
// (call on the accumulators and the A fragments before the fence and after the wait): ptxas would
// otherwise have to serialise the wgmmas, which it reports.
template <u32 K>
MONO_DEV void mono_wgmma_hold(float (&d)[K]) {
#pragma unroll
  for (u32 i = 0; i < K; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <u32 K>
MONO_DEV void mono_wgmma_hold(u32 (&a)[K]) {
#pragma unroll
  for (u32 i = 0; i < K; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// ---- wgmma.m64nNk16, f16 x f16 -> f32, A from registers, B from a descriptor ---------------------
// d (+)= A B: A is 64 x 16 in registers (a[0..4), two f16 each, the PTX ISA's "register fragment"
// order), B is 16 x N K-major in LDS (descriptor b); d[4 i + 2 h + e] is the accumulator of row
// 16 w + g + 8 h (warp w of the warpgroup, g = lane / 4) and column 8 i + 2 (lane % 4) + e.
// accumulate = false starts from zero. N: 32, 64, 96 or 128.
template <u32 N>
MONO_DEV void mono_wgmma_f16_rs(float (&d)[N / 2], const u32 (&a)[4], u64 b, bool accumulate);
template <>
MONO_DEV void mono_wgmma_f16_rs<32>(float (&d)[16], const u32 (&a)[4], u64 b, bool accumulate) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0; }"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"((u32)accumulate));
}

template <>
MONO_DEV void mono_wgmma_f16_rs<64>(float (&d)[32], const u32 (&a)[4], u64 b, bool accumulate) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0; }"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"((u32)accumulate));
}

template <>
MONO_DEV void mono_wgmma_f16_rs<96>(float (&d)[48], const u32 (&a)[4], u64 b, bool accumulate) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %53, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
      "}, {%48, %49, %50, %51}, %52, p, 1, 1, 0; }"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"((u32)accumulate));
}

template <>
MONO_DEV void mono_wgmma_f16_rs<128>(float (&d)[64], const u32 (&a)[4], u64 b, bool accumulate) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0; }"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
        "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"((u32)accumulate));
}
#endif
