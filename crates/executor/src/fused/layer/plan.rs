//! [`LayerPlan::plan`]: the parts of a launch in their order (the module doc of [`super`]).

use super::index::index_projections;
use super::index::IndexPart;
use super::slices::StepSlices;
use super::source::{launch_kind, layer_stages};
use super::weights::ExpertBank;
use super::weights::{expert_banks, tensor, LayerMatrix, LayerVector, MatrixSource, VectorUse};
use super::{LaunchAt, LayerBuild, LayerError, LayerPlan};
use crate::fused::attention::{HalfBuild, HalfDims, HalfInputs, HalfMatrix, HalfPlan, HalfRequest};
use crate::fused::front::{FrontBuild, FrontRequest};
use crate::fused::graph::{Handoff, LaunchGraph};
use crate::fused::head::{
    dense_mlp_part_into, embed_part_into, norm_part, tail_part, DensePlan, DenseShape, EmbedPlan,
    HeadLists, NormPlan, TailPlan, TailShape,
};
use crate::fused::moe::{moe_part_into, MoePart};
use model::{IndexerKind, MlpKind};
use model::{ModelConfig, RankShapes};
use moe::layout::{MoeShape, MAT_ROUTER, MAT_SHARED_DOWN, MAT_SHARED_GATE_UP};

/// The launch's matrices and vectors as the parts add them.
#[derive(Default)]
struct Names {
    matrices: Vec<LayerMatrix>,
    vectors: Vec<LayerVector>,
}

impl Names {
    fn matrix(&mut self, index: u32, source: MatrixSource) {
        self.matrices.push(LayerMatrix { index, source });
    }

    fn whole(&mut self, index: u32, name: String) {
        self.matrix(index, MatrixSource::Tensor(name));
    }

    fn vector(&mut self, name: String, used_as: VectorUse) {
        self.vectors.push(LayerVector { name, used_as });
    }

    /// The matrices by index, checked to fill `0..count` once each.
    fn sorted(mut self, count: u32) -> Result<Names, LayerError> {
        self.matrices.sort_by_key(|m| m.index);
        for (i, m) in self.matrices.iter().enumerate() {
            if m.index != i as u32 {
                return Err(LayerError::Matrices(format!(
                    "entry {i} is matrix {} ({:?})",
                    m.index, m.source
                )));
            }
        }
        if self.matrices.len() as u32 != count {
            return Err(LayerError::Matrices(format!(
                "{} named of {count} reserved",
                self.matrices.len()
            )));
        }
        Ok(self)
    }
}

/// The parts' plans as they are made.
#[derive(Default)]
struct Parts {
    embed: Option<EmbedPlan>,
    attention: Option<HalfPlan>,
    index: Option<IndexPart>,
    post_norm: Option<NormPlan>,
    moe: Option<MoePart>,
    dense: Option<DensePlan>,
    tail: Option<TailPlan>,
    banks: Vec<ExpertBank>,
    out: Handoff,
}

/// Checks the batch against the build; returns the step's rows.
fn check_batch(requests: &[FrontRequest], build: &LayerBuild) -> Result<u32, LayerError> {
    let step = &build.step;
    let most = step.max_rows.min(linear::layout::MAX_ROWS as u32);
    let rows: u32 = requests.iter().map(|r| r.rows).sum();
    if rows == 0 || rows > most {
        return Err(LayerError::Batch(format!(
            "{rows} rows; the build takes 1 to {most}"
        )));
    }
    if requests.len() as u32 > step.max_requests {
        return Err(LayerError::Batch(format!(
            "{} requests; the build takes at most {}",
            requests.len(),
            step.max_requests
        )));
    }
    if let Some((i, r)) = requests
        .iter()
        .enumerate()
        .find(|(_, r)| r.pages.len() as u32 > step.pages_per_request)
    {
        return Err(LayerError::Batch(format!(
            "request {i} has {} pages; the page table holds {} a request",
            r.pages.len(),
            step.pages_per_request
        )));
    }
    Ok(rows)
}

impl LayerPlan {
    /// Plans the launch `at` of a step of `requests` (in row order: each request's rows are
    /// consecutive) of `cfg` on `build`, and checks it.
    pub fn plan(
        cfg: &ModelConfig,
        at: LaunchAt,
        requests: &[FrontRequest],
        build: &LayerBuild,
    ) -> Result<LayerPlan, LayerError> {
        let kind = launch_kind(cfg, at)?;
        let rows = check_batch(requests, build)?;
        if build.step.hidden as usize != cfg.hidden_size
            || build.step.topk as usize != cfg.index_topk
            || build.step.rope as usize != cfg.qk_rope_head_dim
        {
            return Err(LayerError::Batch(format!(
                "the step dims {:?} are not the config's",
                build.step
            )));
        }
        let rank = RankShapes::new(cfg, build.tp)?;
        let mut g = LaunchGraph::new(build.ctas)?;
        let slices = StepSlices::reserve(&mut g, build.step)?;
        let mut lists = HeadLists::default();
        let mut names = Names::default();
        let eps = cfg.rms_norm_eps as f32;
        let hidden = cfg.hidden_size as u32;
        let mut plan = Parts::default();
        match at {
            LaunchAt::Tail => {
                let input = Handoff {
                    data: slices.rows_of(slices.hidden_in(cfg.num_hidden_layers), rows),
                    ready: Default::default(),
                };
                let shape = TailShape {
                    rows,
                    hidden,
                    vocab_rows: rank.vocab_rows as u32,
                    shard: build.rank as u32,
                    shards: build.tp as u32,
                    eps,
                    format: build.weights,
                };
                let tail = tail_part(&mut g, &mut lists, shape, input)?;
                names.whole(tail.lm_head, "lm_head.weight".into());
                names.vector("model.norm.weight".into(), VectorUse::HeadNorm(tail.norm));
                plan.out = tail.tokens;
                plan.tail = Some(tail);
            }
            LaunchAt::Layer(i) => {
                let layer = cfg.layer_plan()?[i];
                let full = layer.indexer == IndexerKind::Full;
                let input = slices.rows_of(slices.hidden_in(i), rows);
                let x = if i == 0 {
                    let embed = embed_part_into(&mut g, &mut lists, rows, hidden, input)?;
                    names.vector(
                        "model.embed_tokens.weight".into(),
                        VectorUse::EmbedTable(embed.op),
                    );
                    let out = embed.out;
                    plan.embed = Some(embed);
                    out
                } else {
                    Handoff {
                        data: input,
                        ready: Default::default(),
                    }
                };
                let half_requests: Vec<HalfRequest> = requests
                    .iter()
                    .map(|r| HalfRequest {
                        context: r.context,
                        rows: r.rows,
                        selected: (r.context + r.rows).min(build.step.topk),
                    })
                    .collect();
                let dims = HalfDims::new(cfg, build.tp, build.cache)?;
                let inputs = HalfInputs {
                    positions: slices.positions.offset,
                    new_slots: slices.new_slots.offset,
                    inv_freq: slices.inv_freq.offset,
                    slot_lists: slices.slot_lists.offset,
                };
                let half_build = HalfBuild {
                    topk: build.step.topk,
                    union: build.union,
                    choice: build.choice,
                };
                let mut half = HalfPlan::begin(
                    &mut g,
                    dims,
                    &half_requests,
                    half_build,
                    x,
                    "attn",
                    Some(inputs),
                    full,
                )?;
                let projections = if full {
                    Some(index_projections(&mut g, cfg, half.plan())?)
                } else {
                    None
                };
                half.queries(&mut g)?;
                let index = match projections {
                    Some(p) => {
                        let front_build = FrontBuild {
                            ctas: build.ctas,
                            cache_pages: build.cache_pages,
                            max_rows: build.step.max_rows,
                        };
                        Some(p.front(&mut g, cfg, requests, front_build)?)
                    }
                    None => None,
                };
                let list_ready = match &index {
                    Some(ix) => (0..rows)
                        .map(|r| {
                            ix.list_ready(r).ok_or_else(|| {
                                LayerError::Batch(format!("row {r} has no list box"))
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()?,
                    None => Vec::new(),
                };
                let attention = half.attend(&mut g, &list_ready)?;
                name_attention(&mut names, i, &attention);
                if let Some(ix) = &index {
                    let p = &ix.projections;
                    let t = |s: &str| tensor(i, &format!("self_attn.indexer.{s}.weight"));
                    names.whole(p.wq_b, t("wq_b"));
                    names.whole(p.wk, t("wk"));
                    names.whole(p.weights_proj, t("weights_proj"));
                    names.vector(t("k_norm"), VectorUse::IndexKeyNormWeight);
                    names.vector(
                        tensor(i, "self_attn.indexer.k_norm.bias"),
                        VectorUse::IndexKeyNormBias,
                    );
                }
                let out_rows = slices.rows_of(slices.hidden_out(i), rows);
                let post_norm = tensor(i, "post_attention_layernorm.weight");
                match layer.mlp {
                    MlpKind::Dense => {
                        let shape = DenseShape {
                            rows,
                            hidden,
                            intermediate: rank.dense_intermediate as u32,
                            eps,
                            format: build.weights,
                            residual: true,
                        };
                        let dense = dense_mlp_part_into(
                            &mut g,
                            &mut lists,
                            shape,
                            attention.out,
                            out_rows,
                        )?;
                        names.whole(dense.gate_up, tensor(i, "mlp.gate_up_proj.weight"));
                        names.whole(dense.down, tensor(i, "mlp.down_proj.weight"));
                        names.vector(post_norm, VectorUse::HeadNorm(dense.norm));
                        plan.out = dense.out;
                        plan.dense = Some(dense);
                    }
                    MlpKind::Moe => {
                        let normed = norm_part(
                            &mut g,
                            &mut lists,
                            "post_norm",
                            rows,
                            hidden,
                            eps,
                            attention.out,
                        )?;
                        names.vector(post_norm, VectorUse::HeadNorm(normed.norm));
                        let shape = MoeShape::new(cfg, build.tp, rows as usize, build.weights)
                            .map_err(crate::fused::moe::MoeGraphError::from)?;
                        let (out, moe) =
                            moe_part_into(&mut g, &shape, normed.out, attention.out, out_rows)?;
                        name_moe(&mut names, i, &shape, moe.first_matrix);
                        names.vector(
                            tensor(i, "mlp.gate.e_score_correction_bias"),
                            VectorUse::RouterBias,
                        );
                        plan.banks = expert_banks(i, shape.experts);
                        plan.out = out;
                        plan.post_norm = Some(normed);
                        plan.moe = Some(moe);
                    }
                }
                plan.attention = Some(attention);
                plan.index = index;
            }
        }
        let launch = g.finish()?;
        let names = names.sorted(launch.matrices)?;
        Ok(LayerPlan {
            at,
            kind,
            rows,
            slices,
            launch,
            embed: plan.embed,
            attention: plan.attention,
            index: plan.index,
            post_norm: plan.post_norm,
            moe: plan.moe,
            dense: plan.dense,
            tail: plan.tail,
            head_lists: lists,
            matrices: names.matrices,
            banks: plan.banks,
            vectors: names.vectors,
            stages: layer_stages(kind),
            out: plan.out,
        })
    }
}

/// The attention half's matrices and norms.
fn name_attention(names: &mut Names, layer: usize, half: &HalfPlan) {
    let t = |s: &str| tensor(layer, &format!("self_attn.{s}.weight"));
    let heads = half.dims.heads;
    for m in HalfMatrix::all(heads) {
        let index = half.first_matrix + m.index(heads) as u32;
        let source = match m {
            HalfMatrix::QA => MatrixSource::Tensor(t("q_a_proj")),
            HalfMatrix::KvA => MatrixSource::Tensor(t("kv_a_proj_with_mqa")),
            HalfMatrix::QB => MatrixSource::Tensor(t("q_b_proj")),
            HalfMatrix::Uk(head) => MatrixSource::UkTransposed {
                tensor: t("kv_b_proj"),
                head,
            },
            HalfMatrix::Uv(head) => MatrixSource::Uv {
                tensor: t("kv_b_proj"),
                head,
            },
            HalfMatrix::OProj => MatrixSource::Tensor(t("o_proj")),
        };
        names.matrix(index, source);
    }
    names.vector(
        tensor(layer, "input_layernorm.weight"),
        VectorUse::AttentionInputNorm,
    );
    names.vector(t("q_a_layernorm"), VectorUse::QLatentNorm);
    names.vector(t("kv_a_layernorm"), VectorUse::KvLatentNorm);
}

/// The MoE part's matrices: the shared expert's gate/up and down, the router's k-splits.
fn name_moe(names: &mut Names, layer: usize, shape: &MoeShape, first: u32) {
    names.whole(
        first + MAT_SHARED_GATE_UP,
        tensor(layer, "mlp.shared_experts.gate_up_proj.weight"),
    );
    names.whole(
        first + MAT_SHARED_DOWN,
        tensor(layer, "mlp.shared_experts.down_proj.weight"),
    );
    let splits = shape.router_splits();
    let cols = shape.hidden / splits;
    for s in 0..splits {
        names.matrix(
            first + MAT_ROUTER + s as u32,
            MatrixSource::Columns {
                tensor: tensor(layer, "mlp.gate.weight"),
                col0: s * cols,
                cols,
            },
        );
    }
}
