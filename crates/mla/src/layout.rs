//! Pure placement math of MLA, shared by the reference, the kernels and the executor.

use std::ops::Range;

use model::{mla_cache_bytes_per_token, CacheFormat, ModelConfig, MLA_CACHE_TILE};

use crate::error::{invalid, Result};

const BF16_BYTES: usize = 2;
const F32_BYTES: usize = 4;

/// One cached token's record (spec §3.10, scaled to the config): the latent (E4M3 codes, or bf16),
/// then in FP8 one fp32 scale per 128 latent elements, then the bf16 rope key. GLM-5's FP8 record
/// is 512 + 16 + 128 = 656 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheLayout {
    pub format: CacheFormat,
    pub latent: usize,
    pub rope: usize,
}

impl CacheLayout {
    pub fn new(cfg: &ModelConfig, format: CacheFormat) -> Result<Self> {
        if format == CacheFormat::Fp8 && cfg.kv_lora_rank % MLA_CACHE_TILE != 0 {
            return Err(invalid(
                "MLA cache layout",
                format!(
                    "kv_lora_rank {} is not a multiple of the {MLA_CACHE_TILE}-element FP8 tile",
                    cfg.kv_lora_rank
                ),
            ));
        }
        Ok(CacheLayout {
            format,
            latent: cfg.kv_lora_rank,
            rope: cfg.qk_rope_head_dim,
        })
    }

    /// FP8 scale tiles of the latent (0 for bf16).
    pub fn tiles(&self) -> usize {
        match self.format {
            CacheFormat::Fp8 => self.latent / MLA_CACHE_TILE,
            CacheFormat::Bf16 => 0,
        }
    }

    pub fn latent_bytes(&self) -> Range<usize> {
        let width = match self.format {
            CacheFormat::Fp8 => 1,
            CacheFormat::Bf16 => BF16_BYTES,
        };
        0..self.latent * width
    }

    /// The fp32 scales (empty for bf16).
    pub fn scale_bytes(&self) -> Range<usize> {
        let start = self.latent_bytes().end;
        start..start + self.tiles() * F32_BYTES
    }

    pub fn rope_bytes(&self) -> Range<usize> {
        let start = self.scale_bytes().end;
        start..start + self.rope * BF16_BYTES
    }

    pub fn bytes_per_token(&self) -> usize {
        self.rope_bytes().end
    }

    /// Agrees with the byte counts of `model` (which the traffic figures use).
    pub fn matches_model(&self, cfg: &ModelConfig) -> bool {
        mla_cache_bytes_per_token(cfg, self.format) == self.bytes_per_token() as u64
    }
}

/// Where one head's slices sit in q_b_proj, kv_b_proj and o_proj (spec §1.5, §2.7): per head,
/// q_b rows are nope then rope; kv_b rows are W_UK (nope rows) then W_UV (v rows); o_proj columns
/// are the head's v block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeadLayout {
    pub heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
}

impl HeadLayout {
    pub fn new(cfg: &ModelConfig) -> Self {
        HeadLayout {
            heads: cfg.num_attention_heads,
            nope: cfg.qk_nope_head_dim,
            rope: cfg.qk_rope_head_dim,
            v: cfg.v_head_dim,
        }
    }

    pub fn qk_dim(&self) -> usize {
        self.nope + self.rope
    }

    pub fn q_b_rows(&self) -> usize {
        self.heads * self.qk_dim()
    }

    pub fn kv_b_rows(&self) -> usize {
        self.heads * (self.nope + self.v)
    }

    pub fn o_cols(&self) -> usize {
        self.heads * self.v
    }

    pub fn q_nope_rows(&self, head: usize) -> Range<usize> {
        let start = head * self.qk_dim();
        start..start + self.nope
    }

    pub fn q_rope_rows(&self, head: usize) -> Range<usize> {
        let start = head * self.qk_dim() + self.nope;
        start..start + self.rope
    }

    /// W_UK\[head\]: maps the latent to the head's nope key.
    pub fn uk_rows(&self, head: usize) -> Range<usize> {
        let start = head * (self.nope + self.v);
        start..start + self.nope
    }

    /// W_UV\[head\]: maps the latent to the head's value.
    pub fn uv_rows(&self, head: usize) -> Range<usize> {
        let start = head * (self.nope + self.v) + self.nope;
        start..start + self.v
    }

    /// The head's block of o_proj's input (and of the concatenated attention output).
    pub fn o_block(&self, head: usize) -> Range<usize> {
        head * self.v..(head + 1) * self.v
    }
}
