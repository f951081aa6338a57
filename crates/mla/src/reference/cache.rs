//! The MLA cache of the reference: one request's tokens of one layer, in a byte format the kernels
//! use ([`CacheLayout`]: bf16, or FP8 latent + scales + bf16 rope key) or as computed (f32).

use half::bf16;
use model::numerics::{e4m3_decode, quantise_block_e4m3_with_scale};
use model::{CacheFormat, ModelConfig, E4M3_MAX, MLA_CACHE_TILE};

use crate::error::{invalid, Result};
use crate::layout::CacheLayout;

/// How a reference MLA cache keeps its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheStore {
    /// Records in one of the byte formats kernels use ([`CacheLayout`]).
    Format(CacheFormat),
    /// The f32 values as computed, as an fp32 run caches them.
    F32,
}

/// One request's MLA cache of one layer: a record per position.
#[derive(Debug, Clone)]
pub struct MlaCache {
    records: Records,
}

#[derive(Debug, Clone)]
enum Records {
    Encoded {
        layout: CacheLayout,
        bytes: Vec<u8>,
    },
    Exact {
        latent: usize,
        rope: usize,
        values: Vec<f32>,
    },
}

/// A cached token read back: the latent (dequantised in FP8) and the rope key.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedToken {
    pub latent: Vec<f32>,
    pub k_pe: Vec<f32>,
}

impl MlaCache {
    pub fn new(cfg: &ModelConfig, store: CacheStore) -> Result<Self> {
        let records = match store {
            CacheStore::Format(format) => Records::Encoded {
                layout: CacheLayout::new(cfg, format)?,
                bytes: Vec::new(),
            },
            CacheStore::F32 => Records::Exact {
                latent: cfg.kv_lora_rank,
                rope: cfg.qk_rope_head_dim,
                values: Vec::new(),
            },
        };
        Ok(MlaCache { records })
    }

    /// (latent, rope) elements per token.
    pub fn widths(&self) -> (usize, usize) {
        match &self.records {
            Records::Encoded { layout, .. } => (layout.latent, layout.rope),
            Records::Exact { latent, rope, .. } => (*latent, *rope),
        }
    }

    /// Tokens cached (positions 0..len).
    pub fn len(&self) -> usize {
        match &self.records {
            Records::Encoded { layout, bytes } => bytes.len() / layout.bytes_per_token(),
            Records::Exact {
                latent,
                rope,
                values,
            } => values.len() / (latent + rope),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the token at position `len()`. In FP8 each 128-element tile gets the scale
    /// amax / 448 (as SGLang's and vLLM's cache writers store it), floored at the smallest normal
    /// float so an all-zero tile stays finite.
    pub fn push(&mut self, latent: &[f32], k_pe: &[f32]) -> Result<()> {
        let (latent_len, rope_len) = self.widths();
        if latent.len() != latent_len || k_pe.len() != rope_len {
            return Err(invalid(
                "MLA cache write",
                format!(
                    "latent {} and rope {} values, the cache holds {latent_len} and {rope_len}",
                    latent.len(),
                    k_pe.len(),
                ),
            ));
        }
        match &mut self.records {
            Records::Exact { values, .. } => {
                values.extend_from_slice(latent);
                values.extend_from_slice(k_pe);
            }
            Records::Encoded { layout, bytes } => {
                let l = *layout;
                let mut record = vec![0u8; l.bytes_per_token()];
                match l.format {
                    CacheFormat::Bf16 => write_bf16(&mut record[l.latent_bytes()], latent),
                    CacheFormat::Fp8 => {
                        let scales = &mut record[l.scale_bytes()];
                        let mut codes = Vec::with_capacity(l.latent);
                        for (tile, chunk) in latent.chunks_exact(MLA_CACHE_TILE).enumerate() {
                            let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
                            let scale = (amax / E4M3_MAX).max(f32::MIN_POSITIVE);
                            codes.extend(quantise_block_e4m3_with_scale(chunk, scale));
                            scales[tile * 4..tile * 4 + 4].copy_from_slice(&scale.to_le_bytes());
                        }
                        record[l.latent_bytes()].copy_from_slice(&codes);
                    }
                }
                write_bf16(&mut record[l.rope_bytes()], k_pe);
                bytes.extend(record);
            }
        }
        Ok(())
    }

    /// The records as bytes, positions in order (`None` for the f32 store).
    pub fn bytes(&self) -> Option<&[u8]> {
        match &self.records {
            Records::Encoded { bytes, .. } => Some(bytes),
            Records::Exact { .. } => None,
        }
    }

    /// The token at `position`, as attention reads it.
    pub fn read(&self, position: usize) -> Result<CachedToken> {
        if position >= self.len() {
            return Err(invalid(
                "MLA cache read",
                format!("position {position}, but {} tokens are cached", self.len()),
            ));
        }
        match &self.records {
            Records::Exact {
                latent,
                rope,
                values,
            } => {
                let record = &values[position * (latent + rope)..(position + 1) * (latent + rope)];
                Ok(CachedToken {
                    latent: record[..*latent].to_vec(),
                    k_pe: record[*latent..].to_vec(),
                })
            }
            Records::Encoded { layout: l, bytes } => {
                let record = &bytes[position * l.bytes_per_token()..][..l.bytes_per_token()];
                let latent = match l.format {
                    CacheFormat::Bf16 => read_bf16(&record[l.latent_bytes()]),
                    CacheFormat::Fp8 => {
                        let scales: Vec<f32> = record[l.scale_bytes()]
                            .chunks_exact(4)
                            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                            .collect();
                        record[l.latent_bytes()]
                            .iter()
                            .enumerate()
                            .map(|(j, &code)| e4m3_decode(code) * scales[j / MLA_CACHE_TILE])
                            .collect()
                    }
                };
                Ok(CachedToken {
                    latent,
                    k_pe: read_bf16(&record[l.rope_bytes()]),
                })
            }
        }
    }
}

fn write_bf16(out: &mut [u8], values: &[f32]) {
    for (chunk, &v) in out.chunks_exact_mut(2).zip(values) {
        chunk.copy_from_slice(&bf16::from_f32(v).to_le_bytes());
    }
}

fn read_bf16(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}
