//! Storage formats and their byte sizes: the one place that knows how many bytes an element, a
//! scale or a cached token takes.

use crate::config::ModelConfig;

/// FP8 weights carry one fp32 scale per 128 x 128 block (spec §1.4).
pub const WEIGHT_BLOCK: usize = 128;
/// The FP8 MLA cache carries one fp32 scale per 128 latent elements (spec §3.10).
pub const MLA_CACHE_TILE: usize = 128;
/// Largest finite E4M3 (OCP) magnitude.
pub const E4M3_MAX: f32 = 448.0;

const FP8_BYTES: u64 = 1;
const BF16_BYTES: u64 = 2;
const F32_BYTES: u64 = 4;

/// How the matrices that may be quantised are stored. Tensors the checkpoint never quantises
/// (spec §1.4) stay bf16 or fp32 in either format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// E4M3 plus an fp32 scale per 128 x 128 block.
    Fp8,
    Bf16,
}

/// How the MLA latent cache is stored. The index-key cache is always FP8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheFormat {
    /// Latent as E4M3 with an fp32 scale per 128 elements, rope part bf16 (656 B for GLM-5).
    Fp8,
    /// Latent and rope part bf16 (1152 B for GLM-5).
    Bf16,
}

/// What a tensor is stored as, given the weight format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Storage {
    /// FP8 with block scales in the FP8 format, bf16 otherwise.
    Quantisable,
    /// Kept bf16 in every format (embeddings, lm_head, norms, router, indexer.weights_proj).
    Bf16,
    /// Kept fp32 in every format (the router's e_score_correction_bias).
    F32,
}

impl Storage {
    /// Bytes of one `[rows, cols]` tensor, scales included.
    pub fn bytes(self, rows: usize, cols: usize, format: WeightFormat) -> u64 {
        let elements = rows as u64 * cols as u64;
        match (self, format) {
            (Storage::Quantisable, WeightFormat::Fp8) => {
                let blocks =
                    rows.div_ceil(WEIGHT_BLOCK) as u64 * cols.div_ceil(WEIGHT_BLOCK) as u64;
                elements * FP8_BYTES + blocks * F32_BYTES
            }
            (Storage::Quantisable, WeightFormat::Bf16) | (Storage::Bf16, _) => {
                elements * BF16_BYTES
            }
            (Storage::F32, _) => elements * F32_BYTES,
        }
    }
}

/// Bytes of one token in one layer's MLA cache: latent (+ its scales) then the bf16 rope key.
pub fn mla_cache_bytes_per_token(cfg: &ModelConfig, format: CacheFormat) -> u64 {
    let latent = cfg.kv_lora_rank as u64;
    let rope = cfg.qk_rope_head_dim as u64 * BF16_BYTES;
    match format {
        CacheFormat::Fp8 => {
            let scales = cfg.kv_lora_rank.div_ceil(MLA_CACHE_TILE) as u64 * F32_BYTES;
            latent * FP8_BYTES + scales + rope
        }
        CacheFormat::Bf16 => latent * BF16_BYTES + rope,
    }
}

/// Bytes of one token in one layer's index-key cache: E4M3 key plus one fp32 scale.
pub fn index_cache_bytes_per_token(cfg: &ModelConfig) -> u64 {
    cfg.index_head_dim as u64 * FP8_BYTES + F32_BYTES
}
