//! CPU numerics that every stage's reference shares, so that two references never disagree on
//! how a value is rounded, normalised or rotated. Plain and exact rather than fast.

mod activation;
mod bf16;
mod fp8;
mod hadamard;
mod norm;
mod rope;

pub use activation::{sigmoid, silu};
pub use bf16::{bf16_round, bf16_round_slice};
pub use fp8::{
    dequantise_block_e4m3, e4m3_decode, e4m3_encode, e4m3_round, quantise_block_e4m3,
    quantise_block_e4m3_with_scale, ue8m0_scale, QuantisedBlock, FP8_AMAX_FLOOR,
};
pub use hadamard::{hadamard, hadamard_scaled, sylvester_entry};
pub use norm::{layer_norm, rms_norm};
pub use rope::{apply_rope, rope_inv_freq, RopeStyle};
