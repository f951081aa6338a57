// Exercises the prelude's conversions so the GPU test can compare them bit for bit with the CPU crates.
#include "prelude.h"

// All 256 E4M3 codes: decoded f32 bits, and the code that encoding the decoded value gives back.
MONO_KERNEL void e4m3_all_codes(u32* decoded_bits, u8* reencoded) {
  const u32 c = mono_block() * mono_block_dim() + mono_thread();
  if (c >= 256) return;
  const float v = mono_e4m3_to_f32((u8)c);
  decoded_bits[c] = mono_f32_bits(v);
  reencoded[c] = mono_f32_to_e4m3(v);
}

// f32 -> E4M3 by the fast path (hardware on NVIDIA) and the portable one, and f32 -> bf16.
MONO_KERNEL void encode_f32(const u32* input_bits, u8* e4m3_fast, u8* e4m3_soft, u16* bf16, u32 n) {
  const u32 i = mono_block() * mono_block_dim() + mono_thread();
  if (i >= n) return;
  const float v = mono_bits_f32(input_bits[i]);
  e4m3_fast[i] = mono_f32_to_e4m3(v);
  e4m3_soft[i] = mono_f32_to_e4m3_soft(v);
  bf16[i] = mono_f32_to_bf16(v);
}
