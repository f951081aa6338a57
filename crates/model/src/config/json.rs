//! The two JSON faces of [`ModelConfig`]: what Hugging Face files may contain (several spellings of
//! the same fact) and what we write back (one spelling transformers accepts).

use serde::{Deserialize, Serialize};

use super::{IndexerType, ModelConfig};
use crate::error::{invalid, ModelError};

const MODEL_TYPE: &str = "glm_moe_dsa";
const ARCHITECTURE: &str = "GlmMoeDsaForCausalLM";

/// Hugging Face's defaults for the behavioural fields. Shape fields have no default on purpose: a
/// truncated file should fail loudly rather than silently become GLM-5.
mod hf_default {
    pub fn one() -> usize {
        1
    }
    pub fn yes() -> bool {
        true
    }
    pub fn index_skip_topk_offset() -> i64 {
        2
    }
    pub fn routed_scaling_factor() -> f64 {
        2.5
    }
    pub fn rms_norm_eps() -> f64 {
        1e-5
    }
    pub fn max_position_embeddings() -> usize {
        202_752
    }
    pub fn hidden_act() -> String {
        "silu".to_owned()
    }
}

#[derive(Deserialize)]
struct RopeParameters {
    rope_theta: Option<f64>,
    #[serde(alias = "type")]
    rope_type: Option<String>,
}

/// Hugging Face accepts the pattern as `"FSSF..."` or as a list of `"full"`/`"shared"`.
#[derive(Deserialize)]
#[serde(untagged)]
enum IndexerPattern {
    Letters(String),
    Names(Vec<IndexerType>),
}

#[derive(Deserialize)]
pub(super) struct RawConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    first_k_dense_replace: usize,
    intermediate_size: usize,
    moe_intermediate_size: usize,
    n_routed_experts: usize,
    num_experts_per_tok: usize,
    n_shared_experts: usize,
    #[serde(default = "hf_default::one")]
    n_group: usize,
    #[serde(default = "hf_default::one")]
    topk_group: usize,
    #[serde(default = "hf_default::routed_scaling_factor")]
    routed_scaling_factor: f64,
    #[serde(default = "hf_default::yes")]
    norm_topk_prob: bool,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    q_lora_rank: usize,
    kv_lora_rank: usize,
    qk_nope_head_dim: usize,
    qk_rope_head_dim: usize,
    v_head_dim: usize,
    index_n_heads: usize,
    index_head_dim: usize,
    index_topk: usize,
    #[serde(default = "hf_default::one")]
    index_topk_freq: usize,
    #[serde(default = "hf_default::index_skip_topk_offset")]
    index_skip_topk_offset: i64,
    indexer_types: Option<Vec<IndexerType>>,
    index_topk_pattern: Option<IndexerPattern>,
    rope_parameters: Option<RopeParameters>,
    rope_theta: Option<f64>,
    /// The pre-transformers-5 spelling; read only to refuse YaRN and friends.
    rope_scaling: Option<RopeParameters>,
    // transformers' modeling for glm_moe_dsa always interleaves both ropes, so a file without
    // these keys means interleaved.
    #[serde(default = "hf_default::yes")]
    rope_interleave: bool,
    #[serde(default = "hf_default::yes")]
    indexer_rope_interleave: bool,
    #[serde(default = "hf_default::rms_norm_eps")]
    rms_norm_eps: f64,
    #[serde(default = "hf_default::max_position_embeddings")]
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "hf_default::hidden_act")]
    hidden_act: String,
}

impl TryFrom<RawConfig> for ModelConfig {
    type Error = ModelError;

    fn try_from(raw: RawConfig) -> Result<Self, ModelError> {
        if let Some(model_type) = &raw.model_type {
            if model_type != MODEL_TYPE {
                return Err(invalid(
                    "model_type",
                    format!("is `{model_type}`, this crate reads only `{MODEL_TYPE}`"),
                ));
            }
        }
        let (rope_theta, rope_type) = resolve_rope(&raw)?;
        // Same precedence as transformers: an explicit list, then a pattern, then freq/offset.
        let indexer_types = match (raw.indexer_types, raw.index_topk_pattern) {
            (Some(list), _) => Some(list),
            (None, Some(IndexerPattern::Names(list))) => Some(list),
            (None, Some(IndexerPattern::Letters(letters))) => Some(parse_letters(&letters)?),
            (None, None) => None,
        };
        let mut cfg = ModelConfig {
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            num_hidden_layers: raw.num_hidden_layers,
            first_k_dense_replace: raw.first_k_dense_replace,
            intermediate_size: raw.intermediate_size,
            moe_intermediate_size: raw.moe_intermediate_size,
            n_routed_experts: raw.n_routed_experts,
            num_experts_per_tok: raw.num_experts_per_tok,
            n_shared_experts: raw.n_shared_experts,
            n_group: raw.n_group,
            topk_group: raw.topk_group,
            routed_scaling_factor: raw.routed_scaling_factor,
            norm_topk_prob: raw.norm_topk_prob,
            num_attention_heads: raw.num_attention_heads,
            num_key_value_heads: raw.num_key_value_heads.unwrap_or(raw.num_attention_heads),
            q_lora_rank: raw.q_lora_rank,
            kv_lora_rank: raw.kv_lora_rank,
            qk_nope_head_dim: raw.qk_nope_head_dim,
            qk_rope_head_dim: raw.qk_rope_head_dim,
            v_head_dim: raw.v_head_dim,
            index_n_heads: raw.index_n_heads,
            index_head_dim: raw.index_head_dim,
            index_topk: raw.index_topk,
            index_topk_freq: raw.index_topk_freq,
            index_skip_topk_offset: raw.index_skip_topk_offset,
            indexer_types,
            rope_theta,
            rope_type,
            rope_interleave: raw.rope_interleave,
            indexer_rope_interleave: raw.indexer_rope_interleave,
            rms_norm_eps: raw.rms_norm_eps,
            max_position_embeddings: raw.max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings,
            hidden_act: raw.hidden_act,
        };
        // A list that only spells out the freq/offset rule (as our own export does) is stored as
        // the rule, so that export then import gives back an equal config.
        if cfg.indexer_types.as_deref() == Some(cfg.indexer_types_from_rule().as_slice()) {
            cfg.indexer_types = None;
        }
        Ok(cfg)
    }
}

/// transformers 5 nests rope in `rope_parameters`; older files put `rope_theta` at the top level and
/// scaling in `rope_scaling`. Accept both, preferring the nested form.
fn resolve_rope(raw: &RawConfig) -> Result<(f64, String), ModelError> {
    let nested = raw.rope_parameters.as_ref();
    let theta = nested
        .and_then(|p| p.rope_theta)
        .or(raw.rope_theta)
        .ok_or_else(|| {
            invalid(
                "rope_theta",
                "is missing (neither `rope_parameters.rope_theta` nor a top-level `rope_theta`)",
            )
        })?;
    let rope_type = nested
        .and_then(|p| p.rope_type.clone())
        .or_else(|| raw.rope_scaling.as_ref().and_then(|p| p.rope_type.clone()))
        .unwrap_or_else(|| "default".to_owned());
    Ok((theta, rope_type))
}

fn parse_letters(letters: &str) -> Result<Vec<IndexerType>, ModelError> {
    letters
        .chars()
        .map(|c| match c {
            'F' => Ok(IndexerType::Full),
            'S' => Ok(IndexerType::Shared),
            other => Err(invalid(
                "index_topk_pattern",
                format!("has `{other}`; only `F` (full) and `S` (shared) are allowed"),
            )),
        })
        .collect()
}

#[derive(Serialize)]
struct RopeOut {
    rope_theta: f64,
    rope_type: String,
}

/// What [`ModelConfig::to_json`] writes: every field transformers needs, the per-layer indexer list
/// spelled out (so no reader has to agree with us on the freq/offset rule), and the rule's inputs too.
#[derive(Serialize)]
pub(super) struct HfConfig {
    architectures: [&'static str; 1],
    model_type: &'static str,
    dtype: &'static str,
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    first_k_dense_replace: usize,
    intermediate_size: usize,
    moe_intermediate_size: usize,
    n_routed_experts: usize,
    num_experts_per_tok: usize,
    n_shared_experts: usize,
    n_group: usize,
    topk_group: usize,
    routed_scaling_factor: f64,
    norm_topk_prob: bool,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    q_lora_rank: usize,
    kv_lora_rank: usize,
    qk_nope_head_dim: usize,
    qk_rope_head_dim: usize,
    /// transformers points `head_dim` at the rope slice; writing it avoids relying on that.
    head_dim: usize,
    v_head_dim: usize,
    index_n_heads: usize,
    index_head_dim: usize,
    index_topk: usize,
    index_topk_freq: usize,
    index_skip_topk_offset: i64,
    indexer_types: Vec<IndexerType>,
    rope_parameters: RopeOut,
    rope_interleave: bool,
    indexer_rope_interleave: bool,
    rms_norm_eps: f64,
    max_position_embeddings: usize,
    tie_word_embeddings: bool,
    hidden_act: String,
    attention_bias: bool,
}

impl HfConfig {
    pub(super) fn from_model(cfg: &ModelConfig) -> Self {
        HfConfig {
            architectures: [ARCHITECTURE],
            model_type: MODEL_TYPE,
            dtype: "bfloat16",
            vocab_size: cfg.vocab_size,
            hidden_size: cfg.hidden_size,
            num_hidden_layers: cfg.num_hidden_layers,
            first_k_dense_replace: cfg.first_k_dense_replace,
            intermediate_size: cfg.intermediate_size,
            moe_intermediate_size: cfg.moe_intermediate_size,
            n_routed_experts: cfg.n_routed_experts,
            num_experts_per_tok: cfg.num_experts_per_tok,
            n_shared_experts: cfg.n_shared_experts,
            n_group: cfg.n_group,
            topk_group: cfg.topk_group,
            routed_scaling_factor: cfg.routed_scaling_factor,
            norm_topk_prob: cfg.norm_topk_prob,
            num_attention_heads: cfg.num_attention_heads,
            num_key_value_heads: cfg.num_key_value_heads,
            q_lora_rank: cfg.q_lora_rank,
            kv_lora_rank: cfg.kv_lora_rank,
            qk_nope_head_dim: cfg.qk_nope_head_dim,
            qk_rope_head_dim: cfg.qk_rope_head_dim,
            head_dim: cfg.qk_rope_head_dim,
            v_head_dim: cfg.v_head_dim,
            index_n_heads: cfg.index_n_heads,
            index_head_dim: cfg.index_head_dim,
            index_topk: cfg.index_topk,
            index_topk_freq: cfg.index_topk_freq,
            index_skip_topk_offset: cfg.index_skip_topk_offset,
            indexer_types: cfg.indexer_types(),
            rope_parameters: RopeOut {
                rope_theta: cfg.rope_theta,
                rope_type: cfg.rope_type.clone(),
            },
            rope_interleave: cfg.rope_interleave,
            indexer_rope_interleave: cfg.indexer_rope_interleave,
            rms_norm_eps: cfg.rms_norm_eps,
            max_position_embeddings: cfg.max_position_embeddings,
            tie_word_embeddings: cfg.tie_word_embeddings,
            hidden_act: cfg.hidden_act.clone(),
            attention_bias: false,
        }
    }
}
