//! The CPU reference of the MLP side of a layer (spec §2.9–2.10): sums in f64. With
//! `bf16_activations` values are rounded to bf16 where a bf16 model stores them (every projection,
//! the activation, the gated product, each weighted expert output and the running sum), in
//! transformers' order, so it tracks a bf16 implementation step by step; without, they stay f32.
//! The router runs in fp32 on its (bf16 or f32) input, as transformers does.

use model::numerics::{bf16_round, silu};
use model::weights::{expert_tensor_name, layer_tensor_name, Matrix, WeightSource};
use model::ModelConfig;

use crate::error::{invalid, Result};
use crate::layout::{dispatch, Route};

/// A SwiGLU MLP: down(silu(gate x) ⊙ up x).
#[derive(Debug, Clone)]
pub struct MlpWeights {
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
}

impl MlpWeights {
    /// Loads `{prefix}.gate_proj.weight` etc. with intermediate width `inter`.
    pub fn load(
        source: &dyn WeightSource,
        prefix: &str,
        hidden: usize,
        inter: usize,
    ) -> Result<Self> {
        Ok(MlpWeights {
            gate: source.matrix(&format!("{prefix}.gate_proj.weight"), inter, hidden)?,
            up: source.matrix(&format!("{prefix}.up_proj.weight"), inter, hidden)?,
            down: source.matrix(&format!("{prefix}.down_proj.weight"), hidden, inter)?,
        })
    }

    fn load_expert(
        source: &dyn WeightSource,
        cfg: &ModelConfig,
        layer: usize,
        e: usize,
    ) -> Result<Self> {
        let (hidden, inter) = (cfg.hidden_size, cfg.moe_intermediate_size);
        Ok(MlpWeights {
            gate: source.matrix(&expert_tensor_name(layer, e, "gate_proj"), inter, hidden)?,
            up: source.matrix(&expert_tensor_name(layer, e, "up_proj"), inter, hidden)?,
            down: source.matrix(&expert_tensor_name(layer, e, "down_proj"), hidden, inter)?,
        })
    }
}

/// Rounds to bf16 when the model stores bf16, else keeps the f32 value.
fn store(x: f32, bf16_activations: bool) -> f32 {
    if bf16_activations {
        bf16_round(x)
    } else {
        x
    }
}

fn store_all(v: Vec<f32>, bf16_activations: bool) -> Vec<f32> {
    v.into_iter().map(|x| store(x, bf16_activations)).collect()
}

/// Spec §2.10 (and one expert of §2.9): y = W_down(silu(W_gate x) ⊙ W_up x).
pub fn mlp(w: &MlpWeights, x: &[f32], bf16_activations: bool) -> Result<Vec<f32>> {
    let gate = store_all(w.gate.matvec(x)?, bf16_activations);
    let up = store_all(w.up.matvec(x)?, bf16_activations);
    let hidden: Vec<f32> = gate
        .iter()
        .zip(&up)
        .map(|(&g, &u)| store(store(silu(g), bf16_activations) * u, bf16_activations))
        .collect();
    Ok(store_all(w.down.matvec(&hidden)?, bf16_activations))
}

/// The router's weights: logits `[experts, hidden]` and the selection bias (fp32).
#[derive(Debug, Clone)]
pub struct RouterWeights {
    pub gate: Matrix,
    pub bias: Vec<f32>,
}

/// The routing rule's parameters from the config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Routing {
    pub top_k: usize,
    pub norm_topk_prob: bool,
    pub scaling: f32,
}

impl Routing {
    pub fn new(cfg: &ModelConfig) -> Self {
        Routing {
            top_k: cfg.num_experts_per_tok,
            norm_topk_prob: cfg.norm_topk_prob,
            scaling: cfg.routed_scaling_factor as f32,
        }
    }
}

/// Spec §2.9 steps 1–5: fp32 logits, s = sigmoid, selection by s + bias (ties to the lower expert
/// index; group-limited routing with one group is a no-op), weights s / (Σ s + 1e-20) · scaling.
pub fn route(router: &RouterWeights, routing: &Routing, x: &[f32]) -> Result<Vec<Route>> {
    let experts = router.gate.rows();
    if routing.top_k == 0 || routing.top_k > experts || router.bias.len() != experts {
        return Err(invalid(
            "router",
            format!(
                "top {} of {experts} experts with {} biases",
                routing.top_k,
                router.bias.len()
            ),
        ));
    }
    let scores: Vec<f32> = router
        .gate
        .matvec(x)?
        .into_iter()
        .map(model::numerics::sigmoid)
        .collect();
    let mut order: Vec<usize> = (0..experts).collect();
    let biased = |e: usize| scores[e] + router.bias[e];
    // Stable sort: equal biased scores keep ascending expert order.
    order.sort_by(|&a, &b| biased(b).total_cmp(&biased(a)));
    order.truncate(routing.top_k);
    let total: f32 = order.iter().map(|&e| scores[e]).sum();
    let denominator = if routing.norm_topk_prob {
        total + 1e-20
    } else {
        1.0
    };
    Ok(order
        .into_iter()
        .map(|e| Route {
            expert: e,
            weight: scores[e] / denominator * routing.scaling,
        })
        .collect())
}

/// One MoE layer's weights.
#[derive(Debug, Clone)]
pub struct MoeWeights {
    pub router: RouterWeights,
    /// The shared experts fused into one MLP, as checkpoints store them.
    pub shared: MlpWeights,
    pub experts: Vec<MlpWeights>,
}

impl MoeWeights {
    /// Loads `model.layers.{layer}.mlp.*` with the config's (TP 1) shapes.
    pub fn load(source: &dyn WeightSource, cfg: &ModelConfig, layer: usize) -> Result<Self> {
        let name = |suffix: &str| layer_tensor_name(layer, &format!("mlp.{suffix}"));
        let hidden = cfg.hidden_size;
        let experts = (0..cfg.n_routed_experts)
            .map(|e| MlpWeights::load_expert(source, cfg, layer, e))
            .collect::<Result<Vec<_>>>()?;
        Ok(MoeWeights {
            router: RouterWeights {
                gate: source.matrix(&name("gate.weight"), cfg.n_routed_experts, hidden)?,
                bias: source.vector(&name("gate.e_score_correction_bias"), cfg.n_routed_experts)?,
            },
            shared: MlpWeights::load(
                source,
                &name("shared_experts"),
                hidden,
                cfg.n_shared_experts * cfg.moe_intermediate_size,
            )?,
            experts,
        })
    }
}

/// What the MoE block did for a set of rows.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeOutput {
    /// One output per row (before the residual).
    pub rows: Vec<Vec<f32>>,
    pub routes: Vec<Vec<Route>>,
}

/// Spec §2.9 for rows `xs` (post-attention-normed): y = Σ_e w_e f_e(x) + f_shared(x). Experts are
/// summed in ascending index order into a running sum (each term and the sum stored like the
/// activations), then the shared expert's output is added: transformers' eager order.
pub fn moe(
    w: &MoeWeights,
    routing: &Routing,
    xs: &[Vec<f32>],
    bf16_activations: bool,
) -> Result<MoeOutput> {
    let routes = xs
        .iter()
        .map(|x| route(&w.router, routing, x))
        .collect::<Result<Vec<_>>>()?;
    let hidden = w.router.gate.cols();
    let mut rows = vec![vec![0f32; hidden]; xs.len()];
    for (expert, served) in dispatch(&routes, w.experts.len())?.iter().enumerate() {
        for &(row, slot) in served {
            let y = mlp(&w.experts[expert], &xs[row], bf16_activations)?;
            let weight = routes[row][slot].weight;
            for (acc, v) in rows[row].iter_mut().zip(y) {
                *acc = store(*acc + store(v * weight, bf16_activations), bf16_activations);
            }
        }
    }
    for (row, x) in rows.iter_mut().zip(xs) {
        for (acc, v) in row.iter_mut().zip(mlp(&w.shared, x, bf16_activations)?) {
            *acc = store(*acc + v, bf16_activations);
        }
    }
    Ok(MoeOutput { rows, routes })
}
