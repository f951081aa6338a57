//! One decode step over T rows: embedding, every layer, the tail.

use std::time::{Duration, Instant};

use indexer::reference::{key, query, score_row, IndexerDims};
use mla::reference::{attend, project, Projection};
use mla::HeadLayout;
use model::numerics::{bf16_round, rms_norm};
use model::{IndexerKind, LayerPlan};
use moe::reference::{choose, mlp, moe_with_routes, scores as router_scores, weigh, Routing};
use moe::Route;
use select::{select_row, TopK};

use super::model_weights::{LayerWeights, MlpBlock};
use super::{DecodeState, ReferenceError, ReferenceModel, Result};

/// One query row: a request's token at a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub request: usize,
    pub token: u32,
    pub position: usize,
}

/// Reported after each layer of a step.
#[derive(Debug, Clone, Copy)]
pub struct LayerProgress<'a> {
    pub layer: &'a LayerPlan,
    pub rows: usize,
    pub elapsed: Duration,
}

/// Everything a step computed that a check may want.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// `[layer][row]`: the residual stream after the layer.
    pub hidden: Vec<Vec<Vec<f32>>>,
    /// `[layer]`, on full indexer layers: `[row]` the index scores of positions 0..=p_row.
    pub index_scores: Vec<Option<Vec<Vec<f32>>>>,
    /// `[layer][row]`: the top-k list (positions, -1 padded to index_topk) attention used.
    pub topk: Vec<Vec<Vec<i32>>>,
    /// `[layer]`, on MoE layers: `[row]` the routed experts and their weights.
    pub routes: Vec<Option<Vec<Vec<Route>>>>,
    /// `[layer]`, on MoE layers: `[row]` the router's scores (sigmoid of its logits, before the
    /// bias), which choose the experts.
    pub router_scores: Vec<Option<Vec<Vec<f32>>>>,
    /// `[row][vocab]`.
    pub logits: Vec<Vec<f32>>,
    /// `[row]`: the first index of the largest logit.
    pub argmax: Vec<u32>,
}

/// One layer's top-k lists per row, and the index scores where the layer ran its indexer.
struct Selection {
    lists: Vec<Vec<i32>>,
    scores: Option<Vec<Vec<f32>>>,
}

fn invalid(reason: impl Into<String>) -> ReferenceError {
    ReferenceError::Invalid(reason.into())
}

/// How the step stores activations: bf16 or f32 (see [`super::ReferenceOptions`]).
#[derive(Clone, Copy)]
struct Store {
    bf16: bool,
}

impl Store {
    fn value(self, x: f32) -> f32 {
        if self.bf16 {
            bf16_round(x)
        } else {
            x
        }
    }

    fn all(self, values: Vec<f32>) -> Vec<f32> {
        values.into_iter().map(|x| self.value(x)).collect()
    }

    fn rms_norm(self, x: &[f32], weight: &[f32], eps: f64) -> Result<Vec<f32>> {
        Ok(self.all(rms_norm(x, weight, eps)?))
    }

    fn add(self, a: &[f32], b: &[f32]) -> Vec<f32> {
        a.iter().zip(b).map(|(&x, &y)| self.value(x + y)).collect()
    }
}

fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if v.total_cmp(&values[best]).is_gt() {
            best = i;
        }
    }
    best as u32
}

/// Discrete choices a step can take from outside instead of making them: a check of a device's
/// steps follows the device's, so that where the two order a near-tie differently they do not
/// compute (and cache) different things from then on. Indexed by layer; `None` (or a short
/// vector) leaves a layer's choice to the reference.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Choices {
    /// A full-indexer layer's top-k lists: positions, -1 padded, a list a row. The layers that
    /// share its lists take them.
    pub lists: Vec<Option<Vec<Vec<i32>>>>,
    /// An MoE layer's routed experts, a list a row in rank order; their weights follow the
    /// reference's rule over its own router scores.
    pub experts: Vec<Option<Vec<Vec<usize>>>>,
}

/// Whether `experts` are `top_k` distinct experts of `count` for each of `rows` rows.
fn check_experts(
    experts: &[Vec<usize>],
    rows: usize,
    top_k: usize,
    count: usize,
) -> std::result::Result<(), String> {
    if experts.len() != rows {
        return Err(format!("experts for {} rows, not {rows}", experts.len()));
    }
    for (r, chosen) in experts.iter().enumerate() {
        if chosen.len() != top_k {
            return Err(format!("row {r} has {} experts, not {top_k}", chosen.len()));
        }
        if let Some(e) = chosen.iter().find(|&&e| e >= count) {
            return Err(format!("row {r} routes to expert {e} of {count}"));
        }
        let mut sorted = chosen.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(format!("row {r} routes to an expert twice"));
        }
    }
    Ok(())
}

/// Whether `lists` are top-k lists of `rows`: one a row, `k` entries, each -1 or a position no
/// later than the row's, no position twice.
fn check_chosen(lists: &[Vec<i32>], rows: &[Row], k: usize) -> std::result::Result<(), String> {
    if lists.len() != rows.len() {
        return Err(format!("{} lists for {} rows", lists.len(), rows.len()));
    }
    for (r, (list, row)) in lists.iter().zip(rows).enumerate() {
        if list.len() != k {
            return Err(format!(
                "row {r}'s list has {} entries, not k = {k}",
                list.len()
            ));
        }
        let mut seen: Vec<i32> = list.iter().copied().filter(|&p| p >= 0).collect();
        if let Some(&p) = seen.iter().find(|&&p| p as usize > row.position) {
            return Err(format!(
                "row {r} lists position {p}, past its own ({})",
                row.position
            ));
        }
        if list.iter().any(|&p| p < -1) {
            return Err(format!("row {r} lists an entry below -1"));
        }
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("row {r} lists position {} twice", w[0]));
        }
    }
    Ok(())
}

impl ReferenceModel {
    /// Runs one step. Rows of a request must be at consecutive positions starting where its
    /// caches end (they may be interleaved with other requests' rows). On error the state may be
    /// partly written; start a new one.
    pub fn step(&self, state: &mut DecodeState, rows: &[Row]) -> Result<StepOutput> {
        self.step_with_progress(state, rows, &mut |_| {})
    }

    /// [`ReferenceModel::step`], calling `progress` after each layer.
    pub fn step_with_progress(
        &self,
        state: &mut DecodeState,
        rows: &[Row],
        progress: &mut dyn FnMut(LayerProgress),
    ) -> Result<StepOutput> {
        self.run_step(state, rows, &Choices::default(), progress)
    }

    /// [`ReferenceModel::step`] taking the top-k lists and routed experts of `chosen` where it
    /// has them instead of its own ([`Choices`]); its index and router scores are still its own
    /// ([`StepOutput::index_scores`], [`StepOutput::router_scores`]).
    pub fn step_choosing(
        &self,
        state: &mut DecodeState,
        rows: &[Row],
        chosen: &Choices,
    ) -> Result<StepOutput> {
        self.run_step(state, rows, chosen, &mut |_| {})
    }

    fn run_step(
        &self,
        state: &mut DecodeState,
        rows: &[Row],
        chosen: &Choices,
        progress: &mut dyn FnMut(LayerProgress),
    ) -> Result<StepOutput> {
        self.check_rows(state, rows)?;
        let cfg = &self.cfg;
        let mut x: Vec<Vec<f32>> = rows
            .iter()
            .map(|r| self.embedding_row(r.token as usize))
            .collect();
        let mut out = StepOutput {
            hidden: Vec::new(),
            index_scores: Vec::new(),
            topk: Vec::new(),
            routes: Vec::new(),
            router_scores: Vec::new(),
            logits: Vec::new(),
            argmax: Vec::new(),
        };
        for layer in &self.layers {
            let started = Instant::now();
            x = self.layer(layer, state, rows, &x, chosen, &mut out)?;
            out.hidden.push(x.clone());
            progress(LayerProgress {
                layer: &layer.plan,
                rows: rows.len(),
                elapsed: started.elapsed(),
            });
        }
        let store = Store {
            bf16: state.options.bf16_activations,
        };
        for x_r in &x {
            let z = store.rms_norm(x_r, &self.final_norm, cfg.rms_norm_eps)?;
            let logits = store.all(self.lm_head.matvec(&z)?);
            out.argmax.push(argmax(&logits));
            out.logits.push(logits);
        }
        Ok(out)
    }

    fn embedding_row(&self, token: usize) -> Vec<f32> {
        let hidden = self.cfg.hidden_size;
        self.embedding.data()[token * hidden..(token + 1) * hidden].to_vec()
    }

    fn check_rows(&self, state: &DecodeState, rows: &[Row]) -> Result<()> {
        if rows.is_empty() {
            return Err(invalid("a step needs at least one row"));
        }
        let mut next: Vec<Option<usize>> =
            (0..state.requests.len()).map(|r| state.cached(r)).collect();
        for (i, row) in rows.iter().enumerate() {
            if row.token as usize >= self.cfg.vocab_size {
                return Err(invalid(format!(
                    "row {i}: token {} is outside the vocabulary of {}",
                    row.token, self.cfg.vocab_size
                )));
            }
            let expected = next
                .get_mut(row.request)
                .and_then(Option::as_mut)
                .ok_or_else(|| {
                    invalid(format!(
                        "row {i}: request {} but the state holds {} requests",
                        row.request,
                        state.requests.len()
                    ))
                })?;
            if row.position != *expected {
                return Err(invalid(format!(
                    "row {i}: request {} is at position {}, so its next row must be at {}, not {}",
                    row.request, *expected, *expected, row.position
                )));
            }
            *expected += 1;
        }
        Ok(())
    }

    fn layer(
        &self,
        layer: &LayerWeights,
        state: &mut DecodeState,
        rows: &[Row],
        x: &[Vec<f32>],
        chosen: &Choices,
        out: &mut StepOutput,
    ) -> Result<Vec<Vec<f32>>> {
        let cfg = &self.cfg;
        let opts = state.options;
        let store = Store {
            bf16: opts.bf16_activations,
        };
        let l = layer.plan.index;
        let heads = HeadLayout::new(cfg);
        let x_hat = x
            .iter()
            .map(|x_r| store.rms_norm(x_r, &layer.input_norm, cfg.rms_norm_eps))
            .collect::<Result<Vec<_>>>()?;
        let projections = rows
            .iter()
            .zip(&x_hat)
            .map(|(row, x_hat)| Ok(project(&heads, &layer.mla, &opts.mla, x_hat, row.position)?))
            .collect::<Result<Vec<_>>>()?;

        // Spec §2.5: every row's cache entries are written before any row reads.
        let dims = IndexerDims::new(cfg)?;
        for ((row, proj), x_hat) in rows.iter().zip(&projections).zip(&x_hat) {
            let cache = &mut state.requests[row.request];
            cache.mla[l].push(&proj.latent, &proj.k_pe)?;
            if let (Some(w), Some(keys)) = (&layer.indexer, cache.index_keys[l].as_mut()) {
                keys.push(key(
                    &dims,
                    &opts.indexer,
                    &w.view(),
                    x_hat,
                    row.position as u64,
                )?);
            }
        }

        let Selection { mut lists, scores } =
            self.select_top_k(layer, state, rows, &projections, &x_hat, out)?;
        if let Some(Some(chosen)) = chosen.lists.get(l) {
            if layer.plan.indexer != IndexerKind::Full {
                return Err(invalid(format!(
                    "layer {l} was given top-k lists, but it shares another layer's"
                )));
            }
            check_chosen(chosen, rows, cfg.index_topk)
                .map_err(|e| invalid(format!("layer {l}: {e}")))?;
            lists = chosen.clone();
        }

        let mut h = Vec::with_capacity(rows.len());
        for ((row, proj), list) in rows.iter().zip(&projections).zip(&lists) {
            let cache = &state.requests[row.request].mla[l];
            let attn = attend(&heads, &layer.mla, &opts.mla, proj, cache, list)?;
            h.push(store.add(&x[h.len()], &attn));
        }
        let h_hat = h
            .iter()
            .map(|h_r| store.rms_norm(h_r, &layer.post_norm, cfg.rms_norm_eps))
            .collect::<Result<Vec<_>>>()?;
        let mut router = Vec::new();
        let (y, routes) = match &layer.mlp {
            MlpBlock::Dense(w) => (
                h_hat
                    .iter()
                    .map(|v| mlp(w, v, opts.bf16_activations))
                    .collect::<moe::Result<Vec<_>>>()?,
                None,
            ),
            MlpBlock::Moe(w) => {
                let routing = Routing::new(cfg);
                let scores = h_hat
                    .iter()
                    .map(|x| router_scores(&w.router, x))
                    .collect::<moe::Result<Vec<_>>>()?;
                let experts = match chosen.experts.get(l) {
                    Some(Some(given)) => {
                        check_experts(given, rows.len(), routing.top_k, w.experts.len())
                            .map_err(|e| invalid(format!("layer {l}: {e}")))?;
                        given.clone()
                    }
                    _ => scores
                        .iter()
                        .map(|s| choose(s, &w.router.bias, &routing))
                        .collect::<moe::Result<Vec<_>>>()?,
                };
                let routes: Vec<Vec<Route>> = scores
                    .iter()
                    .zip(&experts)
                    .map(|(s, e)| weigh(s, e, &routing))
                    .collect();
                let y = moe_with_routes(
                    &w.shared,
                    &|e| w.experts.get(e),
                    w.experts.len(),
                    &routes,
                    &h_hat,
                    opts.bf16_activations,
                )?;
                router.push(scores);
                (y, Some(routes))
            }
        };
        out.topk.push(lists);
        out.index_scores.push(scores);
        out.routes.push(routes);
        out.router_scores.push(router.pop());
        Ok(h.iter()
            .zip(&y)
            .map(|(h_r, y_r)| store.add(h_r, y_r))
            .collect())
    }

    /// Spec §3: each row's top-k list (positions, -1 padded), from this layer's indexer over the
    /// row's request's keys up to its position, or, on a shared layer, the list its source layer
    /// chose in this step. Also the scores on full layers.
    fn select_top_k(
        &self,
        layer: &LayerWeights,
        state: &DecodeState,
        rows: &[Row],
        projections: &[Projection],
        x_hat: &[Vec<f32>],
        out: &StepOutput,
    ) -> Result<Selection> {
        let cfg = &self.cfg;
        let opts = &state.options;
        let l = layer.plan.index;
        let dims = IndexerDims::new(cfg)?;
        match (layer.plan.indexer, &layer.indexer) {
            (IndexerKind::Full, Some(w)) => {
                let top = TopK::of(cfg).map_err(|e| ReferenceError::Select(e.to_string()))?;
                let mut lists = Vec::with_capacity(rows.len());
                let mut scores = Vec::with_capacity(rows.len());
                for ((row, proj), x_hat) in rows.iter().zip(projections).zip(x_hat) {
                    let keys = state.requests[row.request].index_keys[l]
                        .as_ref()
                        .ok_or_else(|| invalid(format!("layer {l} has no index-key cache")))?;
                    let pos = row.position as u64;
                    let q = query(&dims, &opts.indexer, &w.view(), &proj.q_latent, x_hat, pos)?;
                    let row_scores = score_row(&dims, &q, &keys[..=row.position], pos)?;
                    let selection = select_row(&row_scores, top)
                        .map_err(|e| ReferenceError::Select(e.to_string()))?;
                    lists.push(selection.list);
                    scores.push(row_scores);
                }
                Ok(Selection {
                    lists,
                    scores: Some(scores),
                })
            }
            (IndexerKind::Shared { source_layer }, _) => {
                let lists = out.topk.get(source_layer).cloned().ok_or_else(|| {
                    invalid(format!(
                        "layer {l} shares the top-k of layer {source_layer}, which has not run"
                    ))
                })?;
                Ok(Selection {
                    lists,
                    scores: None,
                })
            }
            (IndexerKind::Full, None) => Err(invalid(format!(
                "layer {l} is a full indexer layer without indexer weights"
            ))),
        }
    }
}
