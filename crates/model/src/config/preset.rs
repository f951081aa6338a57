//! Built-in configs: the two released shapes and a tiny one for CPU runs and tests.

use std::fmt;
use std::str::FromStr;

use super::ModelConfig;
use crate::error::ModelError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Preset {
    /// GLM-5 / GLM-5.1 (spec §1.1): an indexer on every layer.
    Glm5,
    /// GLM-5.2 (spec §1.2): GLM-5's shapes, longer rope, full indexer on 21 of 78 layers.
    Glm52,
    /// GLM-5's structure at small width; see [`Preset::config`] for why each value.
    Tiny,
}

impl Preset {
    pub const ALL: [Preset; 3] = [Preset::Glm5, Preset::Glm52, Preset::Tiny];

    pub fn name(self) -> &'static str {
        match self {
            Preset::Glm5 => "glm-5",
            Preset::Glm52 => "glm-5.2",
            Preset::Tiny => "tiny",
        }
    }

    pub fn config(self) -> ModelConfig {
        match self {
            Preset::Glm5 => glm5(),
            Preset::Glm52 => ModelConfig {
                rope_theta: 8e6,
                max_position_embeddings: 1_048_576,
                index_topk_freq: 4,
                index_skip_topk_offset: 3,
                ..glm5()
            },
            Preset::Tiny => tiny(),
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Preset {
    type Err = ModelError;

    fn from_str(name: &str) -> Result<Self, ModelError> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| ModelError::UnknownPreset {
                name: name.to_owned(),
                valid: Preset::ALL.map(Preset::name).join(", "),
            })
    }
}

fn glm5() -> ModelConfig {
    ModelConfig {
        vocab_size: 154_880,
        hidden_size: 6144,
        num_hidden_layers: 78,
        first_k_dense_replace: 3,
        intermediate_size: 12_288,
        moe_intermediate_size: 2048,
        n_routed_experts: 256,
        num_experts_per_tok: 8,
        n_shared_experts: 1,
        n_group: 1,
        topk_group: 1,
        routed_scaling_factor: 2.5,
        norm_topk_prob: true,
        num_attention_heads: 64,
        num_key_value_heads: 64,
        q_lora_rank: 2048,
        kv_lora_rank: 512,
        qk_nope_head_dim: 192,
        qk_rope_head_dim: 64,
        v_head_dim: 256,
        index_n_heads: 32,
        index_head_dim: 128,
        index_topk: 2048,
        // GLM-5's config has neither key; these are transformers' defaults (every layer full).
        index_topk_freq: 1,
        index_skip_topk_offset: 2,
        indexer_types: None,
        rope_theta: 1e6,
        rope_type: "default".to_owned(),
        rope_interleave: true,
        indexer_rope_interleave: true,
        rms_norm_eps: 1e-5,
        max_position_embeddings: 202_752,
        tie_word_embeddings: false,
        hidden_act: "silu".to_owned(),
    }
}

/// Small enough that a whole decode step runs on a CPU in milliseconds (about 15M parameters),
/// while every structural feature of GLM-5.2 is still there:
/// * 2 dense layers then 4 MoE layers; indexer freq 3 / offset 2 gives F F S S F S, so there are
///   shared layers whose source is dense (2, 3: two in a row) and one whose source is MoE (5).
/// * Every dimension differs from the others where cheap (nope 48, rope 32, v 64, index 64,
///   q_lora 128, kv_lora 256), so a mixed-up dimension shows up as a shape error, not a silent pass.
/// * kv_lora_rank 256 = two 128-element FP8 tiles, so the MLA cache keeps several scales per token.
/// * index_head_dim 64: a power of two for the Hadamard, with a 32-wide rope part and a 32-wide
///   no-rope part as in GLM-5 (half and half).
/// * index_topk 16: selection drops tokens from the 17th on, so a ~64-token context tests it.
/// * 16 experts, top 4, and everything divisible by 8 so TP 1, 2, 4 and 8 all shard.
/// * rope_theta 1e4 instead of 1e6 so that positions below 64 turn more than the first pair or two.
fn tiny() -> ModelConfig {
    ModelConfig {
        vocab_size: 2048,
        hidden_size: 256,
        num_hidden_layers: 6,
        first_k_dense_replace: 2,
        intermediate_size: 512,
        moe_intermediate_size: 128,
        n_routed_experts: 16,
        num_experts_per_tok: 4,
        n_shared_experts: 1,
        n_group: 1,
        topk_group: 1,
        routed_scaling_factor: 2.5,
        norm_topk_prob: true,
        num_attention_heads: 16,
        num_key_value_heads: 16,
        q_lora_rank: 128,
        kv_lora_rank: 256,
        qk_nope_head_dim: 48,
        qk_rope_head_dim: 32,
        v_head_dim: 64,
        index_n_heads: 8,
        index_head_dim: 64,
        index_topk: 16,
        index_topk_freq: 3,
        index_skip_topk_offset: 2,
        indexer_types: None,
        rope_theta: 1e4,
        rope_type: "default".to_owned(),
        rope_interleave: true,
        indexer_rope_interleave: true,
        rms_norm_eps: 1e-5,
        max_position_embeddings: 4096,
        tie_word_embeddings: false,
        hidden_act: "silu".to_owned(),
    }
}
