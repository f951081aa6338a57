//! The CPU reference of one decode step (spec §2–4), composed from the stage references: the
//! oracle the fused launch will be compared with, itself checked against Hugging Face
//! transformers' `glm_moe_dsa` (`tests/goldens.rs`).
//!
//! A step takes T rows, each (request, token, position). A request's rows sit at consecutive
//! positions right after what its caches hold (a decode row, MTP verify rows, or a whole prompt:
//! prefill is the same function fed the prompt as rows), and each row sees keys up to its own
//! position. Per layer: input norm; MLA projections; every row's latent and index key are written
//! to the caches first (spec §2.5); then per row the indexer's top-k (or, on a shared layer, the
//! top-k its source layer chose in this step), absorbed attention over it, the residual, the post
//! norm, the dense MLP or the MoE block, the residual. Then the tail: final norm, lm_head, argmax.
//! Caches live in [`DecodeState`] and persist across steps. TP 1.
//!
//! Sums run in f64. With `bf16_activations` values are rounded to bf16 wherever a bf16 model
//! stores them (each stage reference says where); without, they stay f32, as in an fp32 run.
//!
//! # Differences on purpose
//!
//! Where implementations differ, [`ReferenceOptions`] has a switch. Its
//! [`ReferenceOptions::transformers`] setting is transformers' choice for each, and with it the
//! goldens comparison holds; [`ReferenceOptions::engines`] is what SGLang/vLLM and our kernels do.
//!
//! | switch | transformers | engines | spec |
//! |---|---|---|---|
//! | `bf16_activations` | the run's dtype; the goldens run fp32 (see `tools/goldens/README.md`) | bf16 | §2.13 |
//! | `mla_cache` | the run's dtype (it caches the expanded K/V): f32 for the goldens | FP8: latent E4M3 + fp32 scale per 128, bf16 rope key | §3.10 |
//! | `indexer.query` / `indexer.key` | exact (fp32) scores of q and k | FP8 with a power-of-two scale per head / token (q bf16 in our kernels) | §3.4 |
//! | `indexer.hadamard` | off | on in DeepSeek's reference and our kernels, off in SGLang's fused GLM-5 path and vLLM | §3.3 |
//! | `mla.latent_norm_eps` | 1e-6 (class default of q_a/kv_a_layernorm) | `rms_norm_eps` (1e-5) | §2.12 |
//!
//! Not switches, because they only matter in bf16 and have no engine to match: the RMSNorm weight
//! is multiplied in before the one bf16 rounding (transformers rounds the normalised value to bf16
//! first), rope angles are f64 (transformers uses cos/sin tables in the run's dtype), and attention
//! is the absorbed form with an f64 softmax (transformers expands K/V and, in bf16, rounds the
//! scores and probabilities). In fp32 none of these shows: the goldens agree to about 2e-6.

pub mod cli;
mod model_weights;
mod state;
mod step;

pub use model_weights::{LayerWeights, MlpBlock, ReferenceModel};
pub use state::DecodeState;
pub use step::{Choices, LayerProgress, Row, StepOutput};

use indexer::reference::IndexerOptions;
use mla::reference::{CacheStore, MlaOptions};
use model::{CacheFormat, ModelConfig};

/// The switches of the "differences on purpose" table above.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReferenceOptions {
    pub mla_cache: CacheStore,
    /// Rope style and theta, the latent norms' eps, and whether MLA rounds to bf16.
    pub mla: MlaOptions,
    pub indexer: IndexerOptions,
    /// Round activations to bf16 wherever a bf16 model stores them (norm outputs, residual
    /// stream, MLP and attention outputs, logits); else keep them f32. The MLA and indexer
    /// options carry the same choice for their own stages.
    pub bf16_activations: bool,
}

impl ReferenceOptions {
    /// Every switch at transformers' choice, for a model run in bf16 (`bf16_activations`) or in
    /// fp32, as the goldens are.
    pub fn transformers(cfg: &ModelConfig, bf16_activations: bool) -> Self {
        ReferenceOptions {
            mla_cache: if bf16_activations {
                CacheStore::Format(CacheFormat::Bf16)
            } else {
                CacheStore::F32
            },
            mla: MlaOptions::transformers(cfg, bf16_activations),
            indexer: IndexerOptions {
                bf16_projections: bf16_activations,
                ..IndexerOptions::transformers(cfg)
            },
            bf16_activations,
        }
    }

    /// SGLang/vLLM-style serving with our kernels' indexer: bf16 activations, FP8 MLA cache, FP8
    /// index keys with the Hadamard rotation, latent norms with rms_norm_eps.
    pub fn engines(cfg: &ModelConfig) -> Self {
        ReferenceOptions {
            mla_cache: CacheStore::Format(CacheFormat::Fp8),
            mla: MlaOptions::engines(cfg),
            indexer: IndexerOptions::kernels(cfg),
            bf16_activations: true,
        }
    }
}

impl ReferenceOptions {
    /// The rules of the formats and kernels these options ask for (the FP8 MLA cache's tiles, the
    /// Hadamard rotation's width), which a config transformers runs need not meet. `chosen_by`
    /// names where the options came from (a flag such as `--numerics engines`), for the error.
    pub fn check(&self, cfg: &ModelConfig, chosen_by: &str) -> Result<()> {
        if let CacheStore::Format(format) = self.mla_cache {
            cfg.check_mla_cache(format, &format!("`mla_cache` of {chosen_by}"))?;
        }
        if self.indexer.hadamard {
            cfg.check_index_hadamard(&format!("`indexer.hadamard` of {chosen_by}"))?;
        }
        Ok(())
    }
}

/// What can go wrong in a reference step.
#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error(transparent)]
    Weights(#[from] model::weights::WeightError),
    #[error(transparent)]
    Mla(#[from] mla::MlaError),
    #[error(transparent)]
    Moe(#[from] moe::MoeError),
    #[error(transparent)]
    Indexer(#[from] indexer::IndexerError),
    #[error("top-k: {0}")]
    Select(String),
}

pub type Result<T, E = ReferenceError> = std::result::Result<T, E>;
