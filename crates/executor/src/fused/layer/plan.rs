//! [`LayerPlan::plan`]: the parts of a launch in their order (the module doc of [`super`]).

use super::index::index_projections;
use super::index::IndexPart;
use super::slices::StepSlices;
use super::source::{launch_kind, layer_stages};
use super::weights::ExpertBank;
use super::weights::{expert_banks, tensor, LayerMatrix, LayerVector, MatrixSource, VectorUse};
use super::{LaunchAt, LayerBuild, LayerError, LayerPlan};
use crate::fused::attention::{
    HalfBuild, HalfDims, HalfInputs, HalfMatrix, HalfPhases, HalfPlan, HalfRequest,
};
use crate::fused::front::{FrontBuild, FrontRequest};
use crate::fused::graph::{Handoff, LaunchGraph};
use crate::fused::head::{
    dense_mlp_part_into, embed_part_into, tail_part, DensePlan, DenseShape, EmbedPlan, HeadLists,
    TailPlan, TailShape,
};
use crate::fused::moe::{moe_part_into, MoePart};
use mailbox::Stage;
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
        let mut g = LaunchGraph::new(build.ctas)?;
        let slices = StepSlices::reserve(&mut g, build.step)?;
        let mut c = Composer {
            cfg,
            build,
            rank: RankShapes::new(cfg, build.tp)?,
            rows,
            slices,
            g,
            lists: HeadLists::default(),
            names: Names::default(),
            parts: Parts::default(),
        };
        match at {
            LaunchAt::Tail => c.tail()?,
            LaunchAt::Layer(i) => c.layer(i, requests)?,
        }
        let Composer {
            g,
            lists,
            names,
            parts,
            ..
        } = c;
        let launch = g.finish()?;
        let names = names.sorted(launch.matrices)?;
        Ok(LayerPlan {
            at,
            kind,
            rows,
            slices,
            launch,
            embed: parts.embed,
            attention: parts.attention,
            index: parts.index,
            moe: parts.moe,
            dense: parts.dense,
            tail: parts.tail,
            head_lists: lists,
            matrices: names.matrices,
            banks: parts.banks,
            vectors: names.vectors,
            stages: layer_stages(kind),
            out: parts.out,
        })
    }
}

/// A launch while its parts are added.
struct Composer<'a> {
    cfg: &'a ModelConfig,
    build: &'a LayerBuild,
    rank: RankShapes,
    rows: u32,
    slices: StepSlices,
    g: LaunchGraph,
    lists: HeadLists,
    names: Names,
    parts: Parts,
}

impl Composer<'_> {
    fn eps(&self) -> f32 {
        self.cfg.rms_norm_eps as f32
    }

    fn hidden(&self) -> u32 {
        self.cfg.hidden_size as u32
    }

    /// The tail: final norm, lm_head shard, argmax, pick, from the last layer's output rows.
    fn tail(&mut self) -> Result<(), LayerError> {
        let s = &self.slices;
        let input = Handoff {
            data: s.rows_of(s.hidden_in(self.cfg.num_hidden_layers), self.rows),
            ready: Default::default(),
        };
        let shape = TailShape {
            rows: self.rows,
            hidden: self.hidden(),
            vocab_rows: self.rank.vocab_rows as u32,
            shard: self.build.rank as u32,
            shards: self.build.tp as u32,
            eps: self.eps(),
            // lm_head is stored bf16 in every weight format (`RankShapes::tail_weights`).
            format: model::WeightFormat::Bf16,
        };
        let tail = tail_part(&mut self.g, &mut self.lists, shape, input)?;
        self.names.whole(tail.lm_head, "lm_head.weight".into());
        self.names
            .vector("model.norm.weight".into(), VectorUse::HeadNorm(tail.norm));
        self.parts.out = tail.tokens;
        self.parts.tail = Some(tail);
        Ok(())
    }

    /// Layer `i`, in the order of the module doc.
    fn layer(&mut self, i: usize, requests: &[FrontRequest]) -> Result<(), LayerError> {
        let layer = self.cfg.layer_plan()?[i];
        let full = layer.indexer == IndexerKind::Full;
        let x = self.input(i)?;
        let mut half = self.attention_latents(x, requests, full)?;
        let projections = if full {
            Some(index_projections(&mut self.g, self.cfg, half.plan())?)
        } else {
            None
        };
        // The index key and query tasks (one each a row, on consecutive CTAs) head the
        // indexer's chain to select and the attention: their CTAs are kept free of q_b, the
        // rope and W_UK, which the attention needs only after select, so that they start as soon
        // as the projections are done.
        let key_ctas: Vec<u32> = match projections {
            Some(_) => {
                let n = (2 * self.rows).min(self.build.ctas / 2);
                let first = self.g.lightest_block(n);
                (first..first + n).map(|c| c % self.build.ctas).collect()
            }
            None => Vec::new(),
        };
        let index = match projections {
            Some(p) => {
                let front_build = FrontBuild {
                    ctas: self.build.ctas,
                    cache_pages: self.build.cache_pages,
                    max_rows: self.build.step.max_rows,
                };
                let key_cta = key_ctas.first().copied();
                Some(p.front(&mut self.g, self.cfg, requests, front_build, key_cta)?)
            }
            None => None,
        };
        // q_b, the rope and W_UK after the front half's tasks: a CTA's score task then runs as
        // soon as the query is published, not behind a W_UK task that waits on all of q_b, and
        // q_b and W_UK go to the CTAs the front half leaves lightest. Those exclude the CTAs of
        // select's tasks while a quarter of the grid is left: select ends a long while after the
        // scores (a gang of slices a row at 128K keys), and q_b behind it made the q path the
        // launch's critical one, where two or three q_b tiles a CTA cost a few us (PERF.md).
        let mut spare = key_ctas;
        let selecting: Vec<u32> = self
            .g
            .holding(Stage::Select)
            .into_iter()
            .filter(|c| !spare.contains(c))
            .collect();
        if 4 * (spare.len() + selecting.len()) as u32 <= 3 * self.build.ctas {
            spare.extend(selecting);
        }
        half.queries_sparing(&mut self.g, &spare)?;
        let list_ready = match &index {
            Some(ix) => (0..self.rows)
                .map(|r| {
                    ix.list_ready(r)
                        .ok_or_else(|| LayerError::Batch(format!("row {r} has no list box")))
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        let attention = half.attend(&mut self.g, &list_ready)?;
        name_attention(&mut self.names, i, &attention);
        if let Some(ix) = &index {
            name_index(&mut self.names, i, ix);
        }
        let h = attention.out;
        self.parts.attention = Some(attention);
        self.parts.index = index;
        match layer.mlp {
            MlpKind::Dense => self.dense(i, h),
            MlpKind::Moe => self.moe(i, h),
        }
    }

    /// The layer's input rows: layer 0's embedding into `hidden[0]`, else `hidden[i % 2]` as an
    /// earlier launch left it.
    fn input(&mut self, i: usize) -> Result<Handoff, LayerError> {
        let input = self.slices.rows_of(self.slices.hidden_in(i), self.rows);
        if i != 0 {
            return Ok(Handoff {
                data: input,
                ready: Default::default(),
            });
        }
        let hidden = self.hidden();
        let embed = embed_part_into(&mut self.g, &mut self.lists, self.rows, hidden, input)?;
        self.names.vector(
            "model.embed_tokens.weight".into(),
            VectorUse::EmbedTable(embed.op),
        );
        let out = embed.out;
        self.parts.embed = Some(embed);
        Ok(out)
    }

    /// The attention half's first phase on the step slices; its slot lists published by select
    /// in the launch when `full`.
    fn attention_latents(
        &mut self,
        x: Handoff,
        requests: &[FrontRequest],
        full: bool,
    ) -> Result<HalfPhases, LayerError> {
        let (build, s) = (self.build, &self.slices);
        let half_requests: Vec<HalfRequest> = requests
            .iter()
            .map(|r| HalfRequest {
                context: r.context,
                rows: r.rows,
                selected: (r.context + r.rows).min(build.step.topk),
            })
            .collect();
        let inputs = HalfInputs {
            positions: s.positions.offset,
            new_slots: s.new_slots.offset,
            inv_freq: s.inv_freq.offset,
            slot_lists: s.slot_lists.offset,
        };
        let half_build = HalfBuild {
            topk: build.step.topk,
            union: build.union,
            choice: build.choice,
        };
        Ok(HalfPlan::begin(
            &mut self.g,
            HalfDims::new(self.cfg, build.tp, build.cache)?,
            &half_requests,
            half_build,
            x,
            "attn",
            Some(inputs),
            full,
            full,
        )?)
    }

    /// The dense MLP (its post-attention norm included) of `h`, into the residual stream.
    fn dense(&mut self, i: usize, h: Handoff) -> Result<(), LayerError> {
        let shape = DenseShape {
            rows: self.rows,
            hidden: self.hidden(),
            intermediate: self.rank.dense_intermediate as u32,
            eps: self.eps(),
            format: self.build.weights,
            residual: true,
        };
        let out = self.slices.rows_of(self.slices.hidden_out(i), self.rows);
        let dense = dense_mlp_part_into(&mut self.g, &mut self.lists, shape, h, out)?;
        let n = &mut self.names;
        n.whole(dense.gate_up, tensor(i, "mlp.gate_up_proj.weight"));
        n.whole(dense.down, tensor(i, "mlp.down_proj.weight"));
        n.vector(
            tensor(i, "post_attention_layernorm.weight"),
            VectorUse::HeadNorm(dense.norm),
        );
        self.parts.out = dense.out;
        self.parts.dense = Some(dense);
        Ok(())
    }

    /// The MoE of `h`, with `h` as its residual, into the residual stream: its matrices that
    /// read the input (the router's k-splits, the shared and the routed gate/ups) normalise `h`
    /// by the post-attention norm as they stage it, so no norm task stands between the attention
    /// and them.
    fn moe(&mut self, i: usize, h: Handoff) -> Result<(), LayerError> {
        let rows = self.rows;
        let shape = MoeShape::new(self.cfg, self.build.tp, rows as usize, self.build.weights)
            .map_err(crate::fused::moe::MoeGraphError::from)?;
        let out = self.slices.rows_of(self.slices.hidden_out(i), rows);
        let (out, moe) = moe_part_into(&mut self.g, &shape, h, h, out)?;
        let n = &mut self.names;
        n.vector(
            tensor(i, "post_attention_layernorm.weight"),
            VectorUse::MoeInputNorm,
        );
        name_moe(n, i, &shape, moe.first_matrix);
        n.vector(
            tensor(i, "mlp.gate.e_score_correction_bias"),
            VectorUse::RouterBias,
        );
        self.parts.banks = expert_banks(i, shape.experts);
        self.parts.out = out;
        self.parts.moe = Some(moe);
        Ok(())
    }
}

/// The indexer's projections and key norm.
fn name_index(names: &mut Names, layer: usize, ix: &IndexPart) {
    let p = &ix.projections;
    let t = |s: &str| tensor(layer, &format!("self_attn.indexer.{s}"));
    names.whole(p.wq_b, t("wq_b.weight"));
    names.whole(p.wk, t("wk.weight"));
    names.whole(p.weights_proj, t("weights_proj.weight"));
    names.vector(t("k_norm.weight"), VectorUse::IndexKeyNormWeight);
    names.vector(t("k_norm.bias"), VectorUse::IndexKeyNormBias);
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
