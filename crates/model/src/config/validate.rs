//! Checks that a config is one this project can run, each naming the field and the reason.
//!
//! [`ModelConfig::validate`] holds the model's own rules: what the math needs, and the features
//! the references do not implement. A rule that belongs to a storage format or a kernel (the FP8
//! MLA cache's tiles, the Hadamard rotation's width) is not among them: a config transformers runs
//! is a valid model without it. Such rules are checked where the format or kernel is chosen
//! ([`ModelConfig::check_mla_cache`], [`ModelConfig::check_index_hadamard`]), and their errors
//! name the option that asked for it.

use super::ModelConfig;
use crate::error::{invalid, unsuited, Result};
use crate::format::{CacheFormat, MLA_CACHE_TILE};

impl ModelConfig {
    /// The first problem found, or Ok. Sharding checks live in [`crate::RankShapes::new`]; the
    /// rules of a cache format or a kernel in the `check_*` methods, for the runs that ask for it.
    pub fn validate(&self) -> Result<()> {
        self.validate_sizes()?;
        self.validate_attention()?;
        self.validate_indexer()?;
        self.validate_moe()?;
        self.validate_rope_and_norms()
    }

    fn validate_sizes(&self) -> Result<()> {
        let nonzero = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("q_lora_rank", self.q_lora_rank),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
            ("v_head_dim", self.v_head_dim),
            ("index_n_heads", self.index_n_heads),
            ("index_head_dim", self.index_head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, value) in nonzero {
            if value == 0 {
                return Err(invalid(field, "is 0; it must be at least 1"));
            }
        }
        if self.first_k_dense_replace > self.num_hidden_layers {
            return Err(invalid(
                "first_k_dense_replace",
                format!(
                    "is {} but there are only {} layers (num_hidden_layers)",
                    self.first_k_dense_replace, self.num_hidden_layers
                ),
            ));
        }
        if self.first_k_dense_replace > 0 && self.intermediate_size == 0 {
            return Err(invalid(
                "intermediate_size",
                "is 0 but there are dense layers (first_k_dense_replace > 0)",
            ));
        }
        Ok(())
    }

    fn validate_attention(&self) -> Result<()> {
        if self.qk_rope_head_dim % 2 != 0 {
            return Err(invalid(
                "qk_rope_head_dim",
                format!(
                    "is {}; rope rotates pairs, so it must be even",
                    self.qk_rope_head_dim
                ),
            ));
        }
        Ok(())
    }

    fn validate_indexer(&self) -> Result<()> {
        if self.index_head_dim < self.qk_rope_head_dim {
            return Err(invalid(
                "index_head_dim",
                format!(
                    "is {} but the indexer ropes its first qk_rope_head_dim = {} dims",
                    self.index_head_dim, self.qk_rope_head_dim
                ),
            ));
        }
        if self.index_topk == 0 {
            return Err(invalid(
                "index_topk",
                "is 0; attention would select no token",
            ));
        }
        if self.index_topk_freq == 0 {
            return Err(invalid(
                "index_topk_freq",
                "is 0; use 1 for an indexer on every layer",
            ));
        }
        // Also checks the explicit list's length and that a shared layer has a source.
        self.layer_plan().map(|_| ())
    }

    fn validate_moe(&self) -> Result<()> {
        let has_moe = self.first_k_dense_replace < self.num_hidden_layers;
        if !has_moe {
            return Ok(());
        }
        let nonzero = [
            ("n_routed_experts", self.n_routed_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("moe_intermediate_size", self.moe_intermediate_size),
        ];
        for (field, value) in nonzero {
            if value == 0 {
                return Err(invalid(field, "is 0 but there are MoE layers"));
            }
        }
        if self.num_experts_per_tok > self.n_routed_experts {
            return Err(invalid(
                "num_experts_per_tok",
                format!(
                    "is {} but there are only {} routed experts (n_routed_experts)",
                    self.num_experts_per_tok, self.n_routed_experts
                ),
            ));
        }
        if self.n_group != 1 {
            return Err(invalid(
                "n_group",
                format!(
                    "is {}; group-limited routing is not supported, only n_group = 1 \
                     (GLM-5's value, where it is a no-op)",
                    self.n_group
                ),
            ));
        }
        if self.topk_group != 1 {
            return Err(invalid(
                "topk_group",
                format!(
                    "is {}; only 1 is supported (with n_group = 1)",
                    self.topk_group
                ),
            ));
        }
        if !(self.routed_scaling_factor.is_finite() && self.routed_scaling_factor > 0.0) {
            return Err(invalid(
                "routed_scaling_factor",
                format!("is {}; it must be positive", self.routed_scaling_factor),
            ));
        }
        Ok(())
    }

    fn validate_rope_and_norms(&self) -> Result<()> {
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(invalid(
                "rope_theta",
                format!("is {}; it must be positive", self.rope_theta),
            ));
        }
        if self.rope_type != "default" {
            return Err(invalid(
                "rope_parameters.rope_type",
                format!(
                    "is `{}`; only plain rope (`default`, no YaRN scaling) is supported",
                    self.rope_type
                ),
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(invalid(
                "rms_norm_eps",
                format!("is {}; it must be positive", self.rms_norm_eps),
            ));
        }
        if self.hidden_act != "silu" {
            return Err(invalid(
                "hidden_act",
                format!(
                    "is `{}`; only `silu` (SwiGLU) is supported",
                    self.hidden_act
                ),
            ));
        }
        Ok(())
    }
}

impl ModelConfig {
    /// The rules of an MLA cache in `format`: the FP8 cache keeps one scale per
    /// [`MLA_CACHE_TILE`] latent elements, so `kv_lora_rank` must be a multiple of it; bf16 takes
    /// any width. `asked_by` names the option that chose the format (a flag, a field), for the
    /// error.
    pub fn check_mla_cache(&self, format: CacheFormat, asked_by: &str) -> Result<()> {
        if format == CacheFormat::Fp8 && self.kv_lora_rank % MLA_CACHE_TILE != 0 {
            return Err(unsuited(
                "the FP8 MLA cache",
                asked_by,
                "kv_lora_rank",
                format!(
                    "is {}; it keeps one scale per {MLA_CACHE_TILE} latent elements, so \
                     it must be a multiple of {MLA_CACHE_TILE}",
                    self.kv_lora_rank
                ),
            ));
        }
        Ok(())
    }

    /// The rule of the indexer's Hadamard rotation (spec §3.3): a Sylvester matrix exists for
    /// powers of two only, so `index_head_dim` must be one. Exact scores do not depend on the
    /// rotation; only runs that ask for it (FP8 index keys as DeepSeek and our kernels store
    /// them) need this. `asked_by` names the option that asked, for the error.
    pub fn check_index_hadamard(&self, asked_by: &str) -> Result<()> {
        if !self.index_head_dim.is_power_of_two() {
            return Err(unsuited(
                "the indexer's Hadamard rotation",
                asked_by,
                "index_head_dim",
                format!("is {}; it needs a power of two", self.index_head_dim),
            ));
        }
        Ok(())
    }
}
