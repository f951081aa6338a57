//! The matrices one GLM-5.2 TP-8 rank streams through the linear task, from `model`'s per-rank
//! shapes: what the GPU test checks and the benchmark times.

use crate::cases::Finish;
use model::weights::packed::Pairing;
use model::{ModelConfig, RankShapes, WeightFormat};

/// One matrix as a rank runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankMatrix {
    pub name: &'static str,
    pub format: WeightFormat,
    pub pairing: Pairing,
    /// Rows of each source (`out`).
    pub n: usize,
    pub k: usize,
    pub finish: Finish,
}

/// q_a (replicated), the o_proj shard (+ the residual), an expert's gate/up and down slices
/// (down scaled by the routed weight, + the residual), the router's fp32 logits and the lm_head
/// shard (bf16, as checkpoints keep them).
pub fn rank_matrices(preset: &str, tp: usize) -> model::Result<Vec<RankMatrix>> {
    let cfg = ModelConfig::preset(preset)?;
    let s = RankShapes::new(&cfg, tp)?;
    let m = |name, format, pairing, n, k, finish| RankMatrix {
        name,
        format,
        pairing,
        n,
        k,
        finish,
    };
    use WeightFormat::{Bf16, Fp8};
    Ok(vec![
        m(
            "q_a",
            Fp8,
            Pairing::Plain,
            cfg.q_lora_rank,
            cfg.hidden_size,
            Finish::Rounded,
        ),
        m(
            "o_proj",
            Fp8,
            Pairing::Plain,
            cfg.hidden_size,
            s.o_proj_cols,
            Finish::Residual,
        ),
        m(
            "expert gate/up",
            Fp8,
            Pairing::GateUp,
            s.expert_intermediate,
            cfg.hidden_size,
            Finish::Rounded,
        ),
        m(
            "expert down",
            Fp8,
            Pairing::Plain,
            cfg.hidden_size,
            s.expert_intermediate,
            Finish::RowScaleResidual,
        ),
        m(
            "router",
            Bf16,
            Pairing::Plain,
            cfg.n_routed_experts,
            cfg.hidden_size,
            Finish::Fp32,
        ),
        m(
            "lm_head",
            Bf16,
            Pairing::Plain,
            s.vocab_rows,
            cfg.hidden_size,
            Finish::Rounded,
        ),
    ])
}
