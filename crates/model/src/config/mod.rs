//! The model's hyper-parameters, read from a Hugging Face `config.json` of `glm_moe_dsa`.

mod json;
mod layers;
mod preset;
mod validate;

use std::path::Path;

use serde::Deserialize;

use crate::error::{ModelError, Result};

pub use layers::{IndexerKind, IndexerType, LayerPlan, MlpKind};
pub use preset::Preset;

/// Field names and meanings are Hugging Face's (`GlmMoeDsaConfig`), so a reader can check a value
/// against a `config.json` by eye. Shapes are in elements. Deserialising through serde reads the
/// same spellings but does not validate; [`ModelConfig::from_json_str`] does both.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "json::RawConfig")]
pub struct ModelConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    /// Layers `0..first_k_dense_replace` use the dense MLP, the rest the MoE block.
    pub first_k_dense_replace: usize,
    /// Dense MLP width.
    pub intermediate_size: usize,
    /// Width of one routed expert and of one shared expert.
    pub moe_intermediate_size: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_shared_experts: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub routed_scaling_factor: f64,
    pub norm_topk_prob: bool,
    pub num_attention_heads: usize,
    /// Unused by MLA (one latent serves every head); kept so an exported config stays complete.
    pub num_key_value_heads: usize,
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    /// With `index_skip_topk_offset`, decides which layers run their own indexer (spec §1.2).
    pub index_topk_freq: usize,
    /// Signed because Hugging Face's rule `max(i - offset + 1, 0)` accepts any integer.
    pub index_skip_topk_offset: i64,
    /// An explicit per-layer list overrides the freq/offset rule, as in Hugging Face.
    pub indexer_types: Option<Vec<IndexerType>>,
    pub rope_theta: f64,
    /// Only `"default"` (plain rope, no YaRN) is supported; kept to reject the others loudly.
    pub rope_type: String,
    pub rope_interleave: bool,
    pub indexer_rope_interleave: bool,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub hidden_act: String,
}

impl ModelConfig {
    /// The indexer's k_norm LayerNorm eps: fixed in every implementation, not in config.json
    /// (spec §3.1).
    pub const INDEX_K_NORM_EPS: f64 = 1e-6;

    /// Parses and validates a `config.json`. Unknown fields are ignored.
    pub fn from_json_str(text: &str) -> Result<Self> {
        // Through the raw form rather than `Deserialize`, so that a bad value keeps its typed
        // error (field and reason) instead of becoming a serde message.
        let raw: json::RawConfig = serde_json::from_str(text)?;
        let cfg = ModelConfig::try_from(raw)?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_str(&text)
    }

    /// `"glm-5"`, `"glm-5.2"` or `"tiny"`; see [`Preset`].
    pub fn preset(name: &str) -> Result<Self> {
        Ok(name.parse::<Preset>()?.config())
    }

    /// The model's first `layers` layers and its head: the same shapes and layer kinds in a
    /// fraction of the memory (a whole GLM-5 TP8 rank's weights do not fit an 80 GB GPU).
    pub fn first_layers(&self, layers: usize) -> Result<Self> {
        if layers == 0 || layers > self.num_hidden_layers {
            return Err(crate::error::invalid(
                "num_hidden_layers",
                format!(
                    "{layers} layers asked of a model of {}",
                    self.num_hidden_layers
                ),
            ));
        }
        let mut cfg = self.clone();
        cfg.num_hidden_layers = layers;
        if let Some(types) = cfg.indexer_types.as_mut() {
            types.truncate(layers);
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// A `config.json` that both this crate and transformers' `GlmMoeDsaConfig` load.
    pub fn to_json(&self) -> Result<String> {
        Ok(serde_json::to_string_pretty(&json::HfConfig::from_model(
            self,
        ))?)
    }

    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
}
