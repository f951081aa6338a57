//! The device step checked against the CPU reference step (`mono check`): the same weights, the
//! same caches (the reference's own prefill, placed through a page table that is not the
//! positions), the same rows; every launch's output rows within [`TOLERANCE`] of the reference's
//! layer output, the tail's tokens the reference's argmax.
//!
//! [`CheckScene`] is the reference's side (its prefill and its step), [`run_launches`] runs
//! launches of the step on a device from it (chained, each launch's outputs and choices read back
//! before the next runs), [`compare_with_reference`] steps the reference with the device's top-k
//! lists and routed experts ([`choices`]) and says how far each launch is from it, and whether
//! each choice that is not the reference's own is a near-tie the measured score error explains.
//! [`without_cross_wait`] removes one hand-off's wait from a planned launch, and [`wait_control`]
//! shows that the digests ([`super::digest`]) catch it; [`lists`] checks the selected slots of a
//! full-indexer launch against the reference radix select of its own scores.

pub mod choices;
pub mod lists;

use std::fmt;

use device::Device;
use mailbox::gpu::Variant;
use mailbox::{Limits, Task};
use model::paging::{pages_through, PageTable, PAGE_TOKENS};
use model::weights::WeightSource;
use model::{CacheFormat, ModelConfig};

use super::digest::{compare, Comparison, Dump, LaunchDigest, TensorDigest};
use super::inputs::{Batch, FeedKernel, HostRows, RequestInput, StepInputs};
use super::layer::step::{
    front_requests, step_build, step_graph, StepArena, StepKernels, StepPieces,
};
use super::layer::{CacheImages, ModelWeights};
use super::scene::SceneRequest;
use super::weights::DeviceWeights;
use super::{Result, StepError};
use crate::fused::layer::{LaunchAt, LayerPlan};
use crate::reference::{DecodeState, MlpBlock, ReferenceModel, ReferenceOptions, Row, StepOutput};
use choices::{
    check_front, check_route, device_choices, read_front_look, read_route, ChoiceFlip, FrontLook,
    RouteLook,
};

/// Largest relative L2 error of a layer's output rows against the reference's (engine numerics:
/// bf16 activations; the kernels sum in fp32 in their own order where the reference sums in f64,
/// and round intermediates to bf16 where it does; the attention half's own tolerance is 3e-2).
pub const TOLERANCE: f64 = 3e-2;

fn invalid(what: impl fmt::Display) -> StepError {
    StepError::Invalid(what.to_string())
}

/// The token of row `position` of request `q`: fixed, spread over the vocabulary.
fn token(q: usize, position: usize, vocab: usize) -> u32 {
    ((position * 37 + q * 11 + 5) % vocab) as u32
}

/// The MLA cache's format for `cfg`: FP8 where its record is whole 16-byte pieces (the
/// attention's loads), else bf16 (the tiny preset's 328-byte FP8 record is not).
pub fn cache_format(cfg: &ModelConfig) -> CacheFormat {
    match mla::CacheLayout::new(cfg, CacheFormat::Fp8) {
        Ok(l) if l.bytes_per_token() % 16 == 0 => CacheFormat::Fp8,
        _ => CacheFormat::Bf16,
    }
}

/// The reference's side of a checked step: its weights, its caches after each request's
/// context (one prefill step per request), and its step over the batch's rows.
pub struct CheckScene {
    pub cfg: ModelConfig,
    pub requests: Vec<SceneRequest>,
    pub cache: CacheFormat,
    /// The reference's caches before the step.
    pub prefilled: DecodeState,
    /// Each request on pages of its own, in reverse, so slots are not positions.
    pub table: PageTable,
    pub batch: Batch,
    /// The step's rows, as the reference takes them.
    pub rows: Vec<Row>,
    /// The reference's step over the batch's rows (engine numerics), its own choices.
    pub want: StepOutput,
    pub model: ReferenceModel,
}

impl CheckScene {
    /// The reference over `source`'s weights: each request's context prefilled, then the step.
    pub fn new(
        cfg: &ModelConfig,
        source: &dyn WeightSource,
        requests: &[SceneRequest],
    ) -> Result<Self> {
        if requests.is_empty() || requests.iter().any(|r| r.rows == 0) {
            return Err(invalid(
                "a step needs at least one request of at least one row",
            ));
        }
        if let Some(r) = requests
            .iter()
            .find(|r| (r.context + r.rows) as usize > cfg.max_position_embeddings)
        {
            return Err(invalid(format!(
                "a context of {} and {} rows is past max_position_embeddings {}",
                r.context, r.rows, cfg.max_position_embeddings
            )));
        }
        let model = ReferenceModel::load(cfg, source).map_err(invalid)?;
        let cache = cache_format(cfg);
        let mut options = ReferenceOptions::engines(cfg);
        options.mla_cache = mla::reference::CacheStore::Format(cache);
        let vocab = cfg.vocab_size;
        let mut state = DecodeState::new(&model, requests.len(), options).map_err(invalid)?;
        for (q, r) in requests.iter().enumerate() {
            let rows: Vec<Row> = (0..r.context as usize)
                .map(|p| Row {
                    request: q,
                    token: token(q, p, vocab),
                    position: p,
                })
                .collect();
            if !rows.is_empty() {
                model.step(&mut state, &rows).map_err(invalid)?;
            }
        }
        let mut next = 0;
        let pages: Vec<Vec<u32>> = requests
            .iter()
            .map(|r| {
                let count = pages_through(r.context + r.rows - 1);
                let p: Vec<u32> = (next..next + count).rev().collect();
                next += count;
                p
            })
            .collect();
        let table = PageTable::new(&pages)?;
        let step_rows: Vec<Row> = requests
            .iter()
            .enumerate()
            .flat_map(|(q, r)| {
                (r.context..r.context + r.rows).map(move |p| Row {
                    request: q,
                    token: token(q, p as usize, vocab),
                    position: p as usize,
                })
            })
            .collect();
        let batch = Batch {
            requests: requests
                .iter()
                .enumerate()
                .map(|(q, r)| RequestInput {
                    tokens: step_rows
                        .iter()
                        .filter(|row| row.request == q)
                        .map(|row| row.token)
                        .collect(),
                    first_position: r.context,
                    pages: pages[q].clone(),
                })
                .collect(),
            page_tokens: PAGE_TOKENS,
            pages_per_request: pages.iter().map(Vec::len).max().unwrap_or(1) as u32,
        };
        let prefilled = state.clone();
        let want = model.step(&mut state, &step_rows).map_err(invalid)?;
        Ok(CheckScene {
            cfg: cfg.clone(),
            requests: requests.to_vec(),
            cache,
            prefilled,
            table,
            batch,
            rows: step_rows,
            want,
            model,
        })
    }

    /// The scene over `cfg`'s synthetic bf16 weights of `seed`, with those weights made on the
    /// host and uploaded to `dev` for TP 1 (the same values the reference computes with).
    pub fn synthetic(
        dev: &Device,
        cfg: &ModelConfig,
        seed: u64,
        requests: &[SceneRequest],
    ) -> Result<(Self, DeviceWeights)> {
        let source = model::weights::Synthetic::new(cfg, seed, model::WeightFormat::Bf16)?;
        let scene = Self::new(cfg, &source, requests)?;
        let plan = super::weights::WeightPlan::new(cfg, 1, 0, model::WeightFormat::Bf16)?;
        Ok((scene, DeviceWeights::from_host(dev, plan, seed)?))
    }

    /// Every launch of the step in order: each layer, then the tail.
    pub fn every_launch(&self) -> Vec<LaunchAt> {
        (0..self.cfg.num_hidden_layers)
            .map(LaunchAt::Layer)
            .chain([LaunchAt::Tail])
            .collect()
    }
}

/// One launch's outputs, read back right after it ran.
#[derive(Clone, Debug)]
pub struct LaunchOutputs {
    pub at: LaunchAt,
    pub name: String,
    /// Each tensor it writes, by name (`hidden` or `tokens` first; `slot lists` on full layers).
    pub tensors: Vec<(String, Vec<u8>)>,
    /// On a full-indexer layer, its index scores and top-k lists.
    pub front: Option<FrontLook>,
    /// On an MoE layer, its router's scores and choices.
    pub route: Option<RouteLook>,
}

/// The launches that ran, and why the step stopped early if it did.
#[derive(Clone, Debug)]
pub struct StepRun {
    pub launches: Vec<LaunchOutputs>,
    /// The step's inputs after the greedy feed (when every launch ran).
    pub fed: Option<HostRows>,
    pub stopped: Option<String>,
}

impl StepRun {
    /// The digests of every launch's tensors, in step order.
    pub fn digests(&self) -> Dump {
        Dump {
            header: Vec::new(),
            launches: self
                .launches
                .iter()
                .enumerate()
                .map(|(i, l)| LaunchDigest {
                    index: i,
                    name: l.name.clone(),
                    tensors: l
                        .tensors
                        .iter()
                        .map(|(n, b)| TensorDigest::of(n, b))
                        .collect(),
                })
                .collect(),
        }
    }
}

/// The bf16 bytes of `rows`.
fn bf16_bytes(rows: &[Vec<f32>]) -> Vec<u8> {
    rows.iter()
        .flatten()
        .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
        .collect()
}

/// Launches `ats` of the scene's step on `dev` (in that order, one step graph, the greedy feed
/// last), over `weights` (the device's copy of the reference's) and the reference's prefilled
/// caches. The first launch gets the reference's inputs in the arena: the rows before it, and
/// the lists its layer attends over when it reuses an earlier layer's. `edit` may change the
/// plans before they are bound (a negative control's broken launch). Each launch's tensors are
/// read back before the next runs.
pub fn run_launches(
    dev: &Device,
    scene: &CheckScene,
    weights: &DeviceWeights,
    ats: &[LaunchAt],
    variant: Variant,
    edit: &mut dyn FnMut(&mut [LayerPlan]) -> Result<()>,
) -> Result<StepRun> {
    let cfg = &scene.cfg;
    let images = CacheImages::from_reference(cfg, scene.cache, &scene.prefilled, &scene.table)?;
    let caches = images.upload(dev)?;
    let bound = ModelWeights::bind(dev, cfg, weights)?;
    let build = step_build(dev, cfg, &scene.batch, &bound, scene.cache, caches.pages);
    let requests = front_requests(&scene.batch);
    let mut plans = ats
        .iter()
        .map(|&at| {
            LayerPlan::plan(cfg, at, &requests, &build).map_err(|e| invalid(format!("{at:?}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    edit(&mut plans)?;
    let first = *ats.first().ok_or_else(|| invalid("no launch to run"))?;
    let kernels = StepKernels::build(dev, cfg, &build, &plans, variant).map_err(|e| {
        invalid(format!(
            "the step's launch kinds do not build for this config on {}: {e}",
            dev.info().arch
        ))
    })?;
    let arena = StepArena::new(dev, cfg, &plans)?;
    seed_arena(scene, &arena, &plans[0], first)?;
    let inputs = StepInputs::new(dev, &scene.batch)?;
    let feed = FeedKernel::build(dev)?;
    let pieces = StepPieces {
        cfg,
        build: &build,
        kernels: &kernels,
        weights: &bound,
        caches: &caches,
        arena: &arena,
        inputs: &inputs,
        feed: Some(&feed),
        variant,
    };
    let kept = plans.clone();
    let mut graph = step_graph(dev, &pieces, plans)?;
    poison_scratch(&mut graph, &kept[0], &arena)?;
    let mut launches = Vec::new();
    let ran = graph.run_inspected(&mut |i, launch| {
        let tensors = launch
            .outputs()
            .iter()
            .map(|o| Ok((o.name.clone(), o.data.bytes()?)))
            .collect::<Result<Vec<_>>>()?;
        let plan = &kept[i];
        launches.push(LaunchOutputs {
            at: ats[i],
            name: launch.name(),
            tensors,
            front: read_front_look(plan, &arena.arena)?,
            route: read_route(cfg, plan, &arena.arena, plan.rows as usize)?,
        });
        Ok(())
    });
    let (fed, stopped) = match ran {
        Ok(()) => (Some(inputs.read()?), None),
        Err(e) => (None, Some(e.to_string())),
    };
    Ok(StepRun {
        launches,
        fed,
        stopped,
    })
}

/// Has `graph`'s launches run launch by launch find the arena past the step slices (`plan`'s, as
/// every launch's) filled with 0xff: each launch's own bytes there are its to write before it
/// reads them, and a read of bytes it never wrote then shows as NaN or -1 in its outputs.
/// Returns how many bytes each launch finds so.
pub fn poison_scratch(
    graph: &mut crate::step::StepGraph,
    plan: &LayerPlan,
    arena: &StepArena,
) -> Result<usize> {
    let end = plan.slices.end() as usize;
    let bytes = arena.arena.bytes();
    if end > bytes {
        return Err(invalid(format!(
            "the step slices end at byte {end} of an arena of {bytes}"
        )));
    }
    graph.poison_before_launches(arena.arena.device_ptr() + end as u64, bytes - end);
    Ok(bytes - end)
}

/// The reference's inputs of launch `first` written into the arena.
fn seed_arena(
    scene: &CheckScene,
    arena: &StepArena,
    plan: &LayerPlan,
    first: LaunchAt,
) -> Result<()> {
    let cfg = &scene.cfg;
    let layer = match first {
        LaunchAt::Layer(i) => i,
        LaunchAt::Tail => cfg.num_hidden_layers,
    };
    let mut bytes = arena.arena.download()?;
    let mut put = |offset: u64, data: &[u8]| {
        bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    };
    let slices = plan.slices;
    if layer > 0 {
        put(
            slices.hidden_in(layer).offset,
            &bf16_bytes(&scene.want.hidden[layer - 1]),
        );
    }
    if layer < cfg.num_hidden_layers && plan.index.is_none() {
        let mut lists = Vec::new();
        for (row, list) in scene.want.topk[layer].iter().enumerate() {
            let q = scene.want_row_request(row);
            for &p in list {
                lists.push(if p < 0 {
                    -1
                } else {
                    scene
                        .table
                        .slot(q, p as u32)
                        .ok_or_else(|| invalid(format!("row {row}: position {p} past its pages")))?
                });
            }
        }
        put(slices.slot_lists.offset, bytemuck::cast_slice(&lists));
    }
    arena.arena.write(&bytes)?;
    Ok(())
}

impl CheckScene {
    /// The request of the step's row `row`.
    fn want_row_request(&self, row: usize) -> usize {
        let mut first = 0;
        for (q, r) in self.requests.iter().enumerate() {
            first += r.rows as usize;
            if row < first {
                return q;
            }
        }
        self.requests.len() - 1
    }
}

fn bf16_value(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Largest relative L2 error over rows of `got` (bf16 bytes, `[rows][hidden]`) against `want`;
/// infinite when a row holds a NaN or the sizes differ.
pub fn rows_error(got: &[u8], want: &[Vec<f32>]) -> f64 {
    let hidden = want.first().map_or(0, Vec::len);
    if got.len() < 2 * hidden * want.len() {
        return f64::INFINITY;
    }
    want.iter()
        .enumerate()
        .map(|(r, w)| {
            let (mut diff, mut norm) = (0f64, 0f64);
            for (c, &e) in w.iter().enumerate() {
                let at = 2 * (r * hidden + c);
                let o = f64::from(bf16_value(u16::from_le_bytes([got[at], got[at + 1]])));
                diff += (o - f64::from(e)).powi(2);
                norm += f64::from(e).powi(2);
            }
            if diff.is_nan() {
                f64::INFINITY
            } else {
                (diff / norm.max(1e-30)).sqrt()
            }
        })
        .fold(0.0, f64::max)
}

/// One launch against the reference.
#[derive(Clone, Debug, PartialEq)]
pub enum LaunchCheck {
    /// A layer's output rows: their largest relative L2 error beside the tolerance.
    Rows {
        name: String,
        error: f64,
        tolerance: f64,
    },
    /// The tail's tokens beside the reference's argmax.
    Tokens {
        name: String,
        got: Vec<u32>,
        want: Vec<u32>,
    },
}

impl LaunchCheck {
    pub fn passed(&self) -> bool {
        match self {
            LaunchCheck::Rows {
                error, tolerance, ..
            } => error < tolerance,
            LaunchCheck::Tokens { got, want, .. } => got == want,
        }
    }
}

impl fmt::Display for LaunchCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = if self.passed() { "ok" } else { "FAILED" };
        match self {
            LaunchCheck::Rows {
                name,
                error,
                tolerance,
            } => write!(
                f,
                "{name}: hidden rows within {error:.2e} of the reference (relative L2, tolerance \
                 {tolerance:.0e}): {mark}"
            ),
            LaunchCheck::Tokens { name, got, want } => write!(
                f,
                "{name}: tokens {got:?}, the reference's {want:?}: {mark}"
            ),
        }
    }
}

/// How a run compares with the reference, launch by launch.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckReport {
    pub launches: Vec<LaunchCheck>,
    /// Every row's top-k list and routed experts of the device that are not the reference's own
    /// choice over its own scores (the reference took the device's).
    pub list_flips: Vec<ChoiceFlip>,
    pub route_flips: Vec<ChoiceFlip>,
    /// Rows' lists and routes compared (layers x rows).
    pub lists: usize,
    pub routes: usize,
    /// Largest error of a device's index score against the reference's.
    pub score_error: f32,
    /// What no near-tie explains: a list not the select of its launch's own scores, a finite
    /// score past a row's position, a list off its pages, experts not the rule's choice over the
    /// device's own scores, choices the reference cannot take.
    pub faults: Vec<String>,
    /// Why the device step stopped before its last launch, if it did.
    pub stopped: Option<String>,
}

impl CheckReport {
    pub fn passed(&self) -> bool {
        self.stopped.is_none()
            && self.faults.is_empty()
            && self.launches.iter().all(LaunchCheck::passed)
            && self.list_flips.iter().all(ChoiceFlip::explained)
            && self.route_flips.iter().all(ChoiceFlip::explained)
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for l in &self.launches {
            writeln!(f, "{l}")?;
        }
        let near = |v: &[ChoiceFlip]| v.iter().filter(|c| c.explained()).count();
        writeln!(
            f,
            "the reference stepped with the device's choices: {} of {} top-k lists ({} near-ties \
             the index score error explains; largest score error {:.2e}) and {} of {} routes ({} \
             near-ties the router score error explains) are not the reference's own choice",
            self.list_flips.len(),
            self.lists,
            near(&self.list_flips),
            self.score_error,
            self.route_flips.len(),
            self.routes,
            near(&self.route_flips),
        )?;
        for c in &self.list_flips {
            writeln!(f, "  list {c}")?;
        }
        for c in &self.route_flips {
            writeln!(f, "  route {c}")?;
        }
        for fault in &self.faults {
            writeln!(f, "FAULT {fault}")?;
        }
        if let Some(why) = &self.stopped {
            writeln!(f, "the step stopped early: {why}")?;
        }
        Ok(())
    }
}

fn u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Each launch of `run` against the scene's reference stepped with the device's top-k lists and
/// routed experts (so that a near-tie the two order differently does not make every later layer
/// differ): a layer's rows (its first tensor) against the reference's output of that layer, the
/// tail's tokens against its argmax; and each list and route that is not the reference's own
/// choice over its own scores, which must be a near-tie the device's measured score error
/// explains.
pub fn compare_with_reference(scene: &CheckScene, run: &StepRun) -> CheckReport {
    let cfg = &scene.cfg;
    let layers = cfg.num_hidden_layers;
    let looks = run.launches.iter().filter_map(|l| match l.at {
        LaunchAt::Layer(i) => Some((i, l.front.as_ref(), l.route.as_ref())),
        LaunchAt::Tail => None,
    });
    let (chosen, mut faults) = device_choices(layers, looks, &scene.rows, &scene.table, 0);
    let mut state = scene.prefilled.clone();
    let want = match scene.model.step_choosing(&mut state, &scene.rows, &chosen) {
        Ok(w) => w,
        Err(e) => {
            faults.push(format!(
                "the reference cannot take the device's lists and routes: {e}"
            ));
            scene.want.clone()
        }
    };
    let top = select::TopK::of(cfg);
    let routing = moe::reference::Routing::new(cfg);
    let mut report = CheckReport {
        launches: Vec::new(),
        list_flips: Vec::new(),
        route_flips: Vec::new(),
        lists: 0,
        routes: 0,
        score_error: 0.0,
        faults,
        stopped: run.stopped.clone(),
    };
    for l in &run.launches {
        let first: &[u8] = l.tensors.first().map_or(&[], |(_, b)| b);
        let i = match l.at {
            LaunchAt::Layer(i) => i,
            LaunchAt::Tail => {
                report.launches.push(LaunchCheck::Tokens {
                    name: l.name.clone(),
                    got: u32s(first),
                    want: want.argmax.clone(),
                });
                continue;
            }
        };
        report.launches.push(LaunchCheck::Rows {
            name: l.name.clone(),
            error: rows_error(first, &want.hidden[i]),
            tolerance: TOLERANCE,
        });
        if let Some(front) = &l.front {
            let (Some(scores), Ok(top)) = (&want.index_scores[i], &top) else {
                report.faults.push(format!(
                    "layer {i}: the device ran an indexer the reference does not (or no top-k)"
                ));
                continue;
            };
            let lists = chosen.lists.get(i).and_then(Option::as_ref);
            let c = check_front(0, i, front, lists, scores, &scene.rows, *top);
            report.lists += c.compared;
            report.score_error = report.score_error.max(c.score_error);
            report.list_flips.extend(c.flips);
            report.faults.extend(c.faults);
        }
        if let Some(route) = &l.route {
            let (Some(scores), MlpBlock::Moe(w)) =
                (&want.router_scores[i], &scene.model.layers[i].mlp)
            else {
                report.faults.push(format!(
                    "layer {i}: the device routed where the reference has no router"
                ));
                continue;
            };
            let c = check_route(0, i, route, scores, &w.router.bias, &routing);
            report.routes += c.compared;
            report.route_flips.extend(c.flips);
            report.faults.extend(c.faults);
        }
    }
    report
}

/// A wait removed from a launch's placement: which task, and what it no longer waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemovedWait {
    pub order: u32,
    pub kind: u32,
    /// The CTA whose list holds the task.
    pub cta: u32,
    /// The tasks it waited on, each `(order, kind, cta)`; none on its own CTA.
    pub producers: Vec<(u32, u32, u32)>,
}

impl fmt::Display for RemovedWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "task {} (kind {:#x}, CTA {}) no longer waits on",
            self.order, self.kind, self.cta
        )?;
        for (order, kind, cta) in &self.producers {
            write!(f, " task {order} (kind {kind:#x}, CTA {cta})")?;
        }
        Ok(())
    }
}

/// For negative controls: `plan` with every wait of one task of `kind` removed, the first whose
/// producers all run on other CTAs (a producer earlier in the task's own list finishes before it
/// whether it waits or not). The placement is checked again (waiting on less breaks no rule of
/// boxes); the dependency checker (`fused::layer::check`) is what refuses it.
pub fn without_cross_wait(plan: &mut LayerPlan, kind: u32) -> Result<RemovedWait> {
    let placement = plan.launch.placement.placement();
    let mut writer = std::collections::HashMap::new();
    for (cta, t) in placement.tasks() {
        for b in t.out.boxes() {
            writer.insert(b, (t.order, t.kind, cta));
        }
    }
    let mut found = None;
    'search: for (cta, list) in placement.lists().iter().enumerate() {
        let cta = cta as u32;
        for (at, t) in list.iter().enumerate() {
            if t.kind != kind || t.n_inputs == 0 {
                continue;
            }
            let mut producers: Vec<(u32, u32, u32)> = t
                .inputs()
                .iter()
                .flat_map(|r| r.boxes())
                .filter_map(|b| writer.get(&b).copied())
                .collect();
            producers.sort_unstable();
            producers.dedup();
            if !producers.is_empty() && producers.iter().all(|p| p.2 != cta) {
                found = Some((
                    at,
                    RemovedWait {
                        order: t.order,
                        kind: t.kind,
                        cta,
                        producers,
                    },
                ));
                break 'search;
            }
        }
    }
    let (at, removed) = found.ok_or_else(|| {
        invalid(format!(
            "no task of kind {kind:#x} waits only on tasks of other CTAs"
        ))
    })?;
    let mut stripped = placement.clone();
    let task = &mut stripped.lists_mut()[removed.cta as usize][at];
    *task = Task::new(task.kind, task.order, task.out, &[], task.args)
        .map_err(|e| invalid(e.to_string()))?;
    plan.launch.placement = stripped
        .check(Limits {
            max_resident: plan.launch.placement.placement().ctas(),
            scratch_boxes: plan.launch.layout.boxes(),
        })
        .map_err(|e| invalid(e.to_string()))?;
    Ok(removed)
}

/// The negative control of the digests: launches `ats` run twice as planned, then once with one
/// wait removed from launch `broken`'s plan ([`without_cross_wait`] of a task of `kind`).
#[derive(Clone, Debug)]
pub struct WaitControl {
    pub removed: RemovedWait,
    /// The intact runs' digests against each other (equal, bit for bit).
    pub intact: Comparison,
    /// The intact run's digests against the broken one's.
    pub broken: Comparison,
    /// Why the broken run stopped early, if it did.
    pub broken_stopped: Option<String>,
}

/// Runs [`WaitControl`]'s three steps of `scene` on `dev`.
pub fn wait_control(
    dev: &Device,
    scene: &CheckScene,
    weights: &DeviceWeights,
    ats: &[LaunchAt],
    broken: usize,
    kind: u32,
    variant: Variant,
) -> Result<WaitControl> {
    let run = |edit: &mut dyn FnMut(&mut [LayerPlan]) -> Result<()>| {
        run_launches(dev, scene, weights, ats, variant, edit)
    };
    let first = run(&mut |_| Ok(()))?;
    if let Some(why) = &first.stopped {
        return Err(invalid(format!("the intact step stopped: {why}")));
    }
    let second = run(&mut |_| Ok(()))?;
    let mut removed = None;
    let faulty = run(&mut |plans| {
        let plan = plans
            .get_mut(broken)
            .ok_or_else(|| invalid(format!("no launch {broken} to break")))?;
        removed = Some(without_cross_wait(plan, kind)?);
        Ok(())
    })?;
    Ok(WaitControl {
        removed: removed.ok_or_else(|| invalid("no wait was removed"))?,
        intact: compare(&first.digests(), &second.digests()),
        broken: compare(&first.digests(), &faulty.digests()),
        broken_stopped: faulty.stopped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_error_is_relative_l2_per_row_and_catches_nan() {
        let want = vec![vec![1.0f32, 2.0, -2.0, 0.5], vec![4.0, 0.0, 0.0, 3.0]];
        assert_eq!(rows_error(&bf16_bytes(&want), &want), 0.0);
        // Row 1 off by 0.25 in one entry: 0.25 / 5.
        let mut got = want.clone();
        got[1][0] = 4.25;
        let e = rows_error(&bf16_bytes(&got), &want);
        assert!((e - 0.05).abs() < 1e-12, "{e}");
        got[0][2] = f32::NAN;
        assert_eq!(rows_error(&bf16_bytes(&got), &want), f64::INFINITY);
        assert_eq!(rows_error(&[0u8; 6], &want), f64::INFINITY);
        let check = LaunchCheck::Rows {
            name: "layer 0".into(),
            error: e,
            tolerance: TOLERANCE,
        };
        assert!(!check.passed() && check.to_string().contains("FAILED"));
    }

    #[test]
    fn a_choice_other_than_the_references_passes_only_as_a_near_tie() {
        let flip = |gap: f32| ChoiceFlip {
            step: 0,
            layer: 1,
            row: 2,
            what: "lists positions",
            device_only: vec![7],
            reference_only: vec![9],
            gap,
            error: 1e-3,
        };
        let report = |lists: Vec<ChoiceFlip>, routes: Vec<ChoiceFlip>| CheckReport {
            launches: vec![LaunchCheck::Rows {
                name: "layer 1".into(),
                error: 1e-3,
                tolerance: TOLERANCE,
            }],
            list_flips: lists,
            route_flips: routes,
            lists: 4,
            routes: 4,
            score_error: 1e-3,
            faults: Vec::new(),
            stopped: None,
        };
        assert!(report(vec![flip(5e-4)], vec![flip(1e-3)]).passed());
        let far = report(vec![flip(5e-4)], vec![flip(2e-3)]);
        assert!(
            !far.passed() && far.to_string().contains("NOT explained"),
            "{far}"
        );
        assert!(!report(vec![flip(2e-3)], Vec::new()).passed());
        let mut faulty = report(Vec::new(), Vec::new());
        faulty.faults.push("a list off its pages".into());
        assert!(!faulty.passed());
    }
}
