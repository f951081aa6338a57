//! Per-rank tensor shapes under tensor parallelism, as one table of weights.
//!
//! Split as SGLang does (ARCHITECTURE.md section 1): attention heads (q_b_proj and kv_b_proj rows, o_proj input
//! columns) and every MLP intermediate (dense, shared expert, each routed expert) are divided by
//! TP; q_a_proj, kv_a_proj_with_mqa, the whole indexer, the norms, the router and the embedding
//! are replicated. lm_head is split by vocabulary rows (SGLang's ParallelLMHead): replicated it
//! would be the single largest read of the step (1.9 GB for GLM-5), sharded each rank reads 1/TP
//! and the tail only has to combine TP (max, index) pairs for the argmax.

use crate::config::{IndexerKind, LayerPlan, MlpKind, ModelConfig};
use crate::error::{ModelError, Result};
use crate::format::{Storage, WeightFormat};

/// The tensor-parallel degrees this project builds shapes for.
pub const SUPPORTED_TP: [usize; 4] = [1, 2, 4, 8];

/// How a weight is spread over the TP ranks, and so how its reads scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightClass {
    /// Every rank holds and reads all of it.
    Replicated,
    /// Each rank holds 1/TP of it and reads its part every step.
    Sharded,
    /// The shared expert (1/TP of its intermediate per rank), read every MoE step.
    SharedExpert,
    /// One routed expert's 1/TP slice; read only when a row routes to that expert.
    RoutedExpert,
}

/// One weight tensor as one rank holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightSpec {
    /// The checkpoint's tensor name, after `model.layers.{i}.` for layer weights. In routed-expert
    /// names `*` stands for the expert index.
    pub name: &'static str,
    /// `[out, in]` on this rank; vectors are `[n, 1]`.
    pub shape: [usize; 2],
    pub class: WeightClass,
    pub storage: Storage,
    /// Identical tensors of this shape: `n_routed_experts` for routed experts, otherwise 1.
    pub count: usize,
}

impl WeightSpec {
    /// Bytes of one copy, block scales included.
    pub fn bytes(&self, format: WeightFormat) -> u64 {
        self.storage.bytes(self.shape[0], self.shape[1], format)
    }

    /// Bytes of all `count` copies.
    pub fn total_bytes(&self, format: WeightFormat) -> u64 {
        self.bytes(format) * self.count as u64
    }
}

/// One rank's share of the model. Dimensions not listed are the config's (replicated).
#[derive(Debug, Clone, PartialEq)]
pub struct RankShapes {
    pub config: ModelConfig,
    pub tp: usize,
    /// Attention heads on this rank.
    pub heads: usize,
    /// heads x (qk_nope_head_dim + qk_rope_head_dim).
    pub q_b_rows: usize,
    /// heads x (qk_nope_head_dim + v_head_dim): per head W_UK then W_UV (spec §2.7).
    pub kv_b_rows: usize,
    /// heads x v_head_dim.
    pub o_proj_cols: usize,
    pub dense_intermediate: usize,
    /// One routed expert's intermediate on this rank.
    pub expert_intermediate: usize,
    /// The shared experts, fused into one MLP as transformers does, on this rank.
    pub shared_intermediate: usize,
    /// lm_head rows on this rank.
    pub vocab_rows: usize,
}

impl RankShapes {
    /// Fails on an invalid config, a TP outside [`SUPPORTED_TP`], or a split that does not divide.
    pub fn new(cfg: &ModelConfig, tp: usize) -> Result<Self> {
        cfg.validate()?;
        if !SUPPORTED_TP.contains(&tp) {
            return Err(ModelError::Sharding {
                tp,
                reason: format!("supported TP degrees are {SUPPORTED_TP:?}"),
            });
        }
        let has_dense = cfg.first_k_dense_replace > 0;
        let has_moe = cfg.first_k_dense_replace < cfg.num_hidden_layers;
        let split = |field: &str, value: usize, needed: bool| -> Result<usize> {
            if needed && value % tp != 0 {
                return Err(ModelError::Sharding {
                    tp,
                    reason: format!("{field} = {value} is not divisible by {tp}"),
                });
            }
            Ok(value / tp)
        };
        let heads = split("num_attention_heads", cfg.num_attention_heads, true)?;
        let shared_total = cfg.n_shared_experts * cfg.moe_intermediate_size;
        Ok(RankShapes {
            tp,
            heads,
            q_b_rows: heads * cfg.qk_head_dim(),
            kv_b_rows: heads * (cfg.qk_nope_head_dim + cfg.v_head_dim),
            o_proj_cols: heads * cfg.v_head_dim,
            dense_intermediate: split("intermediate_size", cfg.intermediate_size, has_dense)?,
            expert_intermediate: split(
                "moe_intermediate_size",
                cfg.moe_intermediate_size,
                has_moe,
            )?,
            shared_intermediate: split(
                "n_shared_experts x moe_intermediate_size",
                shared_total,
                has_moe,
            )?,
            vocab_rows: split("vocab_size", cfg.vocab_size, true)?,
            config: cfg.clone(),
        })
    }

    /// The weights of one decoder layer on this rank, attention first, in the checkpoint's order.
    pub fn layer_weights(&self, layer: &LayerPlan) -> Vec<WeightSpec> {
        let mut table = self.attention_weights();
        if layer.indexer == IndexerKind::Full {
            table.extend(self.indexer_weights());
        }
        table.push(vector(
            "post_attention_layernorm.weight",
            self.config.hidden_size,
        ));
        match layer.mlp {
            MlpKind::Dense => table.extend(self.dense_mlp_weights()),
            MlpKind::Moe => table.extend(self.moe_weights()),
        }
        table
    }

    /// The token embedding (replicated; a step reads only the rows of its tokens).
    pub fn embedding(&self) -> WeightSpec {
        let c = &self.config;
        WeightSpec {
            name: "model.embed_tokens.weight",
            shape: [c.vocab_size, c.hidden_size],
            class: WeightClass::Replicated,
            storage: Storage::Bf16,
            count: 1,
        }
    }

    /// What the tail launch reads: the final norm and this rank's lm_head rows.
    pub fn tail_weights(&self) -> Vec<WeightSpec> {
        let hidden = self.config.hidden_size;
        vec![
            vector("model.norm.weight", hidden),
            WeightSpec {
                name: "lm_head.weight",
                shape: [self.vocab_rows, hidden],
                class: WeightClass::Sharded,
                storage: Storage::Bf16,
                count: 1,
            },
        ]
    }

    fn attention_weights(&self) -> Vec<WeightSpec> {
        let c = &self.config;
        let kv_a_rows = c.kv_lora_rank + c.qk_rope_head_dim;
        vec![
            vector("input_layernorm.weight", c.hidden_size),
            replicated("self_attn.q_a_proj.weight", [c.q_lora_rank, c.hidden_size]),
            vector("self_attn.q_a_layernorm.weight", c.q_lora_rank),
            sharded("self_attn.q_b_proj.weight", [self.q_b_rows, c.q_lora_rank]),
            replicated(
                "self_attn.kv_a_proj_with_mqa.weight",
                [kv_a_rows, c.hidden_size],
            ),
            vector("self_attn.kv_a_layernorm.weight", c.kv_lora_rank),
            // Counted as FP8 in the FP8 format, as sglang-jax reads GLM-5.1-FP8; SGLang says GLM
            // ships it bf16 (spec §1.4 [U]). At GLM-5 width the difference is 14 MB/layer at TP1.
            sharded(
                "self_attn.kv_b_proj.weight",
                [self.kv_b_rows, c.kv_lora_rank],
            ),
            sharded("self_attn.o_proj.weight", [c.hidden_size, self.o_proj_cols]),
        ]
    }

    fn indexer_weights(&self) -> Vec<WeightSpec> {
        let c = &self.config;
        let q_rows = c.index_n_heads * c.index_head_dim;
        vec![
            replicated("self_attn.indexer.wq_b.weight", [q_rows, c.q_lora_rank]),
            replicated(
                "self_attn.indexer.wk.weight",
                [c.index_head_dim, c.hidden_size],
            ),
            vector("self_attn.indexer.k_norm.weight", c.index_head_dim),
            vector("self_attn.indexer.k_norm.bias", c.index_head_dim),
            WeightSpec {
                storage: Storage::Bf16,
                ..replicated(
                    "self_attn.indexer.weights_proj.weight",
                    [c.index_n_heads, c.hidden_size],
                )
            },
        ]
    }

    fn dense_mlp_weights(&self) -> Vec<WeightSpec> {
        let hidden = self.config.hidden_size;
        let inter = self.dense_intermediate;
        vec![
            sharded("mlp.gate_proj.weight", [inter, hidden]),
            sharded("mlp.up_proj.weight", [inter, hidden]),
            sharded("mlp.down_proj.weight", [hidden, inter]),
        ]
    }

    fn moe_weights(&self) -> Vec<WeightSpec> {
        let c = &self.config;
        let hidden = c.hidden_size;
        let mut table = vec![
            WeightSpec {
                storage: Storage::Bf16,
                ..replicated("mlp.gate.weight", [c.n_routed_experts, hidden])
            },
            WeightSpec {
                storage: Storage::F32,
                ..replicated("mlp.gate.e_score_correction_bias", [c.n_routed_experts, 1])
            },
        ];
        if self.shared_intermediate > 0 {
            let inter = self.shared_intermediate;
            let shared = |name, shape| WeightSpec {
                class: WeightClass::SharedExpert,
                ..sharded(name, shape)
            };
            table.extend([
                shared("mlp.shared_experts.gate_proj.weight", [inter, hidden]),
                shared("mlp.shared_experts.up_proj.weight", [inter, hidden]),
                shared("mlp.shared_experts.down_proj.weight", [hidden, inter]),
            ]);
        }
        let inter = self.expert_intermediate;
        let routed = |name, shape| WeightSpec {
            class: WeightClass::RoutedExpert,
            count: c.n_routed_experts,
            ..sharded(name, shape)
        };
        table.extend([
            routed("mlp.experts.*.gate_proj.weight", [inter, hidden]),
            routed("mlp.experts.*.up_proj.weight", [inter, hidden]),
            routed("mlp.experts.*.down_proj.weight", [hidden, inter]),
        ]);
        table
    }
}

fn replicated(name: &'static str, shape: [usize; 2]) -> WeightSpec {
    WeightSpec {
        name,
        shape,
        class: WeightClass::Replicated,
        storage: Storage::Quantisable,
        count: 1,
    }
}

fn sharded(name: &'static str, shape: [usize; 2]) -> WeightSpec {
    WeightSpec {
        class: WeightClass::Sharded,
        ..replicated(name, shape)
    }
}

/// Norm weights and biases: replicated, never quantised.
fn vector(name: &'static str, len: usize) -> WeightSpec {
    WeightSpec {
        storage: Storage::Bf16,
        ..replicated(name, [len, 1])
    }
}
