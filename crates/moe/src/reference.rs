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
    /// Group-limited routing: experts in `n_group` equal groups, the `topk_group` groups with the
    /// largest sum of their two best biased scores kept (1 and 1: no limit).
    pub n_group: usize,
    pub topk_group: usize,
}

impl Routing {
    pub fn new(cfg: &ModelConfig) -> Self {
        Routing {
            top_k: cfg.num_experts_per_tok,
            norm_topk_prob: cfg.norm_topk_prob,
            scaling: cfg.routed_scaling_factor as f32,
            n_group: cfg.n_group,
            topk_group: cfg.topk_group,
        }
    }

    /// Fails unless `experts` split into the groups and the kept groups hold top_k experts.
    pub fn check(&self, experts: usize) -> Result<()> {
        let groups_ok = self.n_group > 0
            && experts % self.n_group == 0
            && (1..=self.n_group).contains(&self.topk_group)
            && (self.n_group == 1 || experts / self.n_group >= 2);
        if !groups_ok
            || self.top_k == 0
            || self.top_k > experts / self.n_group.max(1) * self.topk_group
        {
            return Err(invalid(
                "routing",
                format!(
                    "top {} of {experts} experts in {} groups keeping {}",
                    self.top_k, self.n_group, self.topk_group
                ),
            ));
        }
        Ok(())
    }
}

/// Spec §2.9 steps 1–2: s = sigmoid of the fp32 logits.
pub fn scores(router: &RouterWeights, x: &[f32]) -> Result<Vec<f32>> {
    Ok(router
        .gate
        .matvec(x)?
        .into_iter()
        .map(model::numerics::sigmoid)
        .collect())
}

/// Spec §2.9 steps 3–4: the chosen experts in rank order (biased score descending, ties to the
/// lower index), within the `topk_group` groups of the largest top-2 sums of biased scores.
pub fn choose(scores: &[f32], bias: &[f32], routing: &Routing) -> Result<Vec<usize>> {
    let experts = scores.len();
    routing.check(experts)?;
    if bias.len() != experts {
        return Err(invalid(
            "router",
            format!("{} biases for {experts} experts", bias.len()),
        ));
    }
    let biased: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
    let per_group = experts / routing.n_group;
    let mut kept = vec![true; routing.n_group];
    if routing.n_group > 1 {
        let group_score = |g: usize| {
            let mut v: Vec<f32> = biased[g * per_group..(g + 1) * per_group].to_vec();
            v.sort_by(|a, b| b.total_cmp(a));
            v[0] + v[1]
        };
        let mut groups: Vec<usize> = (0..routing.n_group).collect();
        groups.sort_by(|&a, &b| group_score(b).total_cmp(&group_score(a)));
        kept = vec![false; routing.n_group];
        for &g in &groups[..routing.topk_group] {
            kept[g] = true;
        }
    }
    let mut order: Vec<usize> = (0..experts).filter(|&e| kept[e / per_group]).collect();
    // Stable sort: equal biased scores keep ascending expert order.
    order.sort_by(|&a, &b| biased[b].total_cmp(&biased[a]));
    order.truncate(routing.top_k);
    Ok(order)
}

/// Spec §2.9 step 5 for `chosen` in rank order: s / (Σ s, summed in that order, + 1e-20) ·
/// scaling, from the scores without the bias.
pub fn weigh(scores: &[f32], chosen: &[usize], routing: &Routing) -> Vec<Route> {
    let total: f32 = chosen.iter().map(|&e| scores[e]).sum();
    let denominator = if routing.norm_topk_prob {
        total + 1e-20
    } else {
        1.0
    };
    chosen
        .iter()
        .map(|&e| Route {
            expert: e,
            weight: scores[e] / denominator * routing.scaling,
        })
        .collect()
}

/// Spec §2.9 steps 1–5: fp32 logits, s = sigmoid, selection by s + bias (ties to the lower expert
/// index; group-limited as `routing` says), weights s / (Σ s + 1e-20) · scaling.
pub fn route(router: &RouterWeights, routing: &Routing, x: &[f32]) -> Result<Vec<Route>> {
    if routing.top_k == 0 || routing.top_k > router.gate.rows() {
        return Err(invalid(
            "router",
            format!("top {} of {} experts", routing.top_k, router.gate.rows()),
        ));
    }
    let s = scores(router, x)?;
    let chosen = choose(&s, &router.bias, routing)?;
    Ok(weigh(&s, &chosen, routing))
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
    let rows = moe_with_routes(
        &w.shared,
        &|e| w.experts.get(e),
        w.experts.len(),
        &routes,
        xs,
        bf16_activations,
    )?;
    Ok(MoeOutput { rows, routes })
}

/// Spec §2.9 steps 6–7 for given routes: the routed experts (`expert(e)`, of `experts`) summed
/// in ascending index order into a running sum, then the shared expert, as [`moe`] does.
pub fn moe_with_routes<'a>(
    shared: &MlpWeights,
    expert: &dyn Fn(usize) -> Option<&'a MlpWeights>,
    experts: usize,
    routes: &[Vec<Route>],
    xs: &[Vec<f32>],
    bf16_activations: bool,
) -> Result<Vec<Vec<f32>>> {
    let hidden = xs.first().map_or(0, Vec::len);
    let mut rows = vec![vec![0f32; hidden]; xs.len()];
    for (e, served) in dispatch(routes, experts)?.iter().enumerate() {
        if served.is_empty() {
            continue;
        }
        let weights =
            expert(e).ok_or_else(|| invalid("moe", format!("expert {e} has no weights")))?;
        for &(row, slot) in served {
            let y = mlp(weights, &xs[row], bf16_activations)?;
            let weight = routes[row][slot].weight;
            for (acc, v) in rows[row].iter_mut().zip(y) {
                *acc = store(*acc + store(v * weight, bf16_activations), bf16_activations);
            }
        }
    }
    for (row, x) in rows.iter_mut().zip(xs) {
        for (acc, v) in row.iter_mut().zip(mlp(shared, x, bf16_activations)?) {
            *acc = store(*acc + v, bf16_activations);
        }
    }
    Ok(rows)
}
