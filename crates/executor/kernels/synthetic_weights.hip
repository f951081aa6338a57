// Synthetic weights made on the device, bit for bit the values of model::weights::synthetic_values
// (SyntheticRule: SplitMix64's output function over key + (i + 1) x golden gamma, i the element's
// row-major index in the whole TP 1 tensor), quantised to FP8 as Fp8Weight::quantise does (one
// power-of-two scale per 128 x 128 block of the whole tensor) and written in the layout a launch
// reads: the linear task's packed layout (model::weights::packed) or row-major.
#include "prelude.h"

#define SYN_GAMMA 0x9E3779B97F4A7C15ull
#define SYN_BLOCK 128u
#define SYN_E4M3_MAX 448.0f
#define SYN_AMAX_FLOOR 1e-4f

// What the host's SyntheticRule holds, and where a rank's shard sits in the whole tensor.
struct syn_source {
  u64 key;
  u64 full_cols;
  u32 row0, col0;
  u32 kind;  // SYN_KIND_*
  float factor;
};
#define SYN_KIND_MATRIX 0u
#define SYN_KIND_NORM_WEIGHT 1u
#define SYN_KIND_SCALED_BYTE 2u

MONO_DEV u64 syn_mix(u64 z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Row `row`, column `col` of the shard.
MONO_DEV float syn_value(const syn_source& s, u64 row, u64 col) {
  const u64 i = ((u64)s.row0 + row) * s.full_cols + s.col0 + col;
  const u64 u = syn_mix(s.key + (i + 1) * SYN_GAMMA);
  if (s.kind == SYN_KIND_NORM_WEIGHT) return 1.0f + (float)((i32)(u >> 59) - 16) / 128.0f;
  return (float)(signed char)(u8)(u >> 56) * s.factor;
}

// model::numerics::ue8m0_scale: 2^ceil(log2(max(amax, 1e-4) / 448)) from the float's bits.
MONO_DEV float syn_ue8m0(float amax) {
  const float ratio = mono_fmaxf(amax, SYN_AMAX_FLOOR) / SYN_E4M3_MAX;
  const u32 bits = mono_f32_bits(ratio);
  i32 e = (i32)((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0u ? 1 : 0);
  e = e < -126 ? -126 : (e > 127 ? 127 : e);
  return mono_bits_f32((u32)(e + 127) << 23);
}

MONO_DEV u8 syn_code(float v, float scale) {
  return mono_f32_to_e4m3(mono_fminf(mono_fmaxf(v / scale, -SYN_E4M3_MAX), SYN_E4M3_MAX));
}

// One CTA per 128 x 128 block of a [rows, cols] shard (blocks row-major): its scale. Shards of an
// FP8 tensor start on block boundaries (the host checks), so these are the whole tensor's blocks.
MONO_KERNEL void syn_block_scales(syn_source s, u32 rows, u32 cols, float* scales) {
  __shared__ float part[32];
  const u32 block_cols = (cols + SYN_BLOCK - 1) / SYN_BLOCK;
  const u32 br = mono_block() / block_cols, bc = mono_block() % block_cols;
  const u32 r_end = rows < (br + 1) * SYN_BLOCK ? rows : (br + 1) * SYN_BLOCK;
  const u32 c_end = cols < (bc + 1) * SYN_BLOCK ? cols : (bc + 1) * SYN_BLOCK;
  float amax = 0.0f;
  for (u32 e = mono_thread(); e < SYN_BLOCK * SYN_BLOCK; e += mono_block_dim()) {
    const u32 r = br * SYN_BLOCK + e / SYN_BLOCK, c = bc * SYN_BLOCK + e % SYN_BLOCK;
    if (r < r_end && c < c_end) {
      const float v = syn_value(s, r, c);
      amax = mono_fmaxf(amax, mono_fmaxf(v, -v));
    }
  }
  amax = mono_wave_max(amax);
  if (mono_lane() == 0) part[mono_wave()] = amax;
  mono_sync_block();
  if (mono_thread() == 0) {
    for (u32 w = 1; w < mono_waves_per_block(); ++w) amax = mono_fmaxf(amax, part[w]);
    scales[mono_block()] = syn_ue8m0(amax);
  }
}

// Row-major [rows, cols]: bf16 bits (format 0), f32 (1), or E4M3 codes with `scales` (2).
MONO_KERNEL void syn_row_major(syn_source s, u32 rows, u32 cols, u32 format, const float* scales,
                               u8* out) {
  const u64 count = (u64)rows * cols;
  const u32 block_cols = (cols + SYN_BLOCK - 1) / SYN_BLOCK;
  const u64 stride = (u64)mono_grid_dim() * mono_block_dim();
  for (u64 i = (u64)mono_block() * mono_block_dim() + mono_thread(); i < count; i += stride) {
    const u64 r = i / cols, c = i % cols;
    const float v = syn_value(s, r, c);
    if (format == 0u) {
      ((u16*)out)[i] = (u16)(mono_f32_bits(v) >> 16);  // the values are bf16-exact
    } else if (format == 1u) {
      ((float*)out)[i] = v;
    } else {
      out[i] = syn_code(v, scales[(r / SYN_BLOCK) * block_cols + c / SYN_BLOCK]);
    }
  }
}

// The packed layout of an [n, k] weight (or gate/up pair), one thread per lane load of 16 bytes:
// element `e` of lane `lane`'s load `j` of k-block `kb` of `tile` is row g + 8 (reg & 1) of the
// tile and k 128 kb + j k_per_load + 16 s + 2 t + 8 (reg >> 1) + (e % 2), with g = lane / 4,
// t = lane % 4, s = e / 8, reg = (e % 8) / 2 (packed.rs). FP8 (`fp8` = 1) also writes the packed
// scales [tile][kb][half] from the block scales of each source.
struct syn_packed_args {
  syn_source src[2];
  const float* block_scales[2];
  u8* out;
  float* packed_scales;
  u32 n, k, gate_up, fp8;
};

MONO_DEV float syn_packed_value(const syn_packed_args& a, u32 tile, u32 row_in_tile, u32 kk,
                                bool* real, u32* source, u32* row) {
  const u32 half = row_in_tile / 8u, within = row_in_tile % 8u;
  *source = a.gate_up ? half : 0u;
  *row = a.gate_up ? tile * 8u + within : tile * 16u + row_in_tile;
  *real = *row < a.n;
  return *real ? syn_value(*source ? a.src[1] : a.src[0], *row, kk) : 0.0f;
}

MONO_KERNEL void syn_packed(syn_packed_args a) {
  const u32 per_load = a.fp8 ? 16u : 8u;
  const u32 k_per_load = per_load * 2u;
  const u32 loads = SYN_BLOCK / k_per_load;
  const u32 k_blocks = a.k / SYN_BLOCK;
  const u32 tiles = (a.n + (a.gate_up ? 7u : 15u)) / (a.gate_up ? 8u : 16u);
  const u32 block_cols = k_blocks;
  const u64 count = (u64)tiles * k_blocks * loads * 32u;
  const u64 stride = (u64)mono_grid_dim() * mono_block_dim();
  for (u64 x = (u64)mono_block() * mono_block_dim() + mono_thread(); x < count; x += stride) {
    const u32 lane = (u32)(x % 32u), j = (u32)((x / 32u) % loads);
    const u64 tkb = x / (32u * loads);
    const u32 kb = (u32)(tkb % k_blocks), tile = (u32)(tkb / k_blocks);
    const u32 g = lane / 4u, t = lane % 4u;
    u32 words[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (u32 e = 0; e < 16u; ++e) {
      if (e >= per_load) break;
      const u32 s = e / 8u, reg = (e % 8u) / 2u;
      const u32 row_in_tile = g + 8u * (reg & 1u);
      const u32 kk = kb * SYN_BLOCK + j * k_per_load + 16u * s + 2u * t + 8u * (reg >> 1) + e % 2u;
      bool real;
      u32 source, row;
      const float v = syn_packed_value(a, tile, row_in_tile, kk, &real, &source, &row);
      u32 bits;
      if (a.fp8) {
        const float* scales = source ? a.block_scales[1] : a.block_scales[0];
        bits = real ? syn_code(v, scales[(row / SYN_BLOCK) * block_cols + kb]) : 0u;
        words[e / 4u] |= bits << (8u * (e % 4u));
      } else {
        bits = mono_f32_bits(v) >> 16;
        words[e / 2u] |= bits << (16u * (e % 2u));
      }
    }
    mono_u32x4 w;
    w.x = words[0];
    w.y = words[1];
    w.z = words[2];
    w.w = words[3];
    ((mono_u32x4*)a.out)[x] = w;
    // The packed scales: one per (tile, kb, half); 0 for a half made only of padding.
    if (a.fp8 && x < (u64)tiles * k_blocks * 2u) {
      const u32 half = (u32)(x % 2u);
      const u32 kb2 = (u32)((x / 2u) % k_blocks), tile2 = (u32)(x / 2u / k_blocks);
      const u32 source = a.gate_up ? half : 0u;
      const u32 row = a.gate_up ? tile2 * 8u : tile2 * 16u + 8u * half;
      const float* scales = source ? a.block_scales[1] : a.block_scales[0];
      a.packed_scales[x] = row < a.n ? scales[(row / SYN_BLOCK) * block_cols + kb2] : 0.0f;
    }
  }
}
