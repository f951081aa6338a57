//! Greedy decoding with the whole captured step against the CPU reference's greedy decoding, at
//! the tiny preset: each request's context prefilled by the reference (its caches placed in the
//! device's through a page table), then the step graph (every layer's launch, the tail, the greedy
//! feed) run once and replayed, the feed moving every row on on the device. The replays equal the
//! same steps run launch by launch, and each of those is compared with the reference's step over
//! the same rows and the device's own top-k lists: the indexer's FP8 scores order near-ties at
//! the k-th key differently from the reference's, and a step that attends over other keys caches
//! other entries, so a reference left to choose its own lists parts from the device for every
//! step after such a tie. Where the device's list or pick is not the reference's own, the
//! measured error must explain it.
#![allow(dead_code)]

use device::Device;
use executor::fused::front::FrontRequest;
use executor::reference::{DecodeState, MlpBlock, ReferenceModel, ReferenceOptions, Row};
use executor::step::check::choices::{
    check_front, check_route, device_choices, read_front_look, read_route, ChoiceFlip, FrontLook,
    RouteLook,
};
use executor::step::check::rows_error;
use executor::step::inputs::{Batch, FeedKernel, HostRows, RequestInput, StepInputs};
use executor::step::layer::step::{
    front_requests, plan_step, step_build, step_graph, StepArena, StepKernels, StepPieces,
};
use executor::step::layer::{CacheImages, ModelWeights};
use executor::step::weights::{DeviceWeights, WeightPlan};
use mailbox::gpu::{DebugBound, Variant};
use model::paging::{pages_through, PageTable, PAGE_TOKENS};
use model::weights::Synthetic;
use model::{CacheFormat, ModelConfig, WeightFormat};
use moe::reference::Routing;
use select::TopK;

const SEED: u64 = 5;

/// How the launches' task lists are planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Planning {
    /// Over the pages each request has (`front_requests`): what the step does.
    Pages,
    /// At the first step's positions, as the step did before its tasks read the positions on
    /// the device: the negative control (the runs and select's rows stop at the first step's
    /// positions, so later steps miss their newest keys).
    FirstPositions,
}

/// A batch: `contexts[q]` tokens cached for request q, `rows` rows a request each step.
#[derive(Clone, Debug)]
pub struct Case {
    pub contexts: Vec<usize>,
    pub rows: usize,
    pub steps: usize,
}

impl Case {
    pub fn name(&self) -> String {
        format!(
            "{} request(s) x {} row(s), contexts {:?}, {} steps",
            self.contexts.len(),
            self.rows,
            self.contexts,
            self.steps
        )
    }
}

/// One step of the reference: each row's greedy token, and the margin of its logit over the
/// runner-up (how near a tie the pick was).
#[derive(Clone, Debug, PartialEq)]
pub struct RefStep {
    pub argmax: Vec<u32>,
    pub margins: Vec<f32>,
    pub logits: Vec<Vec<f32>>,
}

fn config() -> ModelConfig {
    ModelConfig::preset("tiny").unwrap()
}

fn reference(cfg: &ModelConfig) -> ReferenceModel {
    let source = Synthetic::new(cfg, SEED, WeightFormat::Bf16).unwrap();
    ReferenceModel::load(cfg, &source).unwrap()
}

fn options(cfg: &ModelConfig) -> ReferenceOptions {
    let mut options = ReferenceOptions::engines(cfg);
    // The tiny preset's FP8 MLA record (328 bytes) is not whole 16-byte pieces, which the
    // attention reads: its cache is bf16, here as on the device.
    options.mla_cache = mla::reference::CacheStore::Format(CacheFormat::Bf16);
    options
}

fn prompt_token(cfg: &ModelConfig, q: usize, p: usize) -> u32 {
    ((p * 37 + q * 11 + 5) % cfg.vocab_size) as u32
}

/// The reference's state after prefilling every request's context.
fn prefill(cfg: &ModelConfig, model: &ReferenceModel, contexts: &[usize]) -> DecodeState {
    let mut state = DecodeState::new(model, contexts.len(), options(cfg)).unwrap();
    for (q, &n) in contexts.iter().enumerate() {
        let rows: Vec<Row> = (0..n)
            .map(|p| Row {
                request: q,
                token: prompt_token(cfg, q, p),
                position: p,
            })
            .collect();
        model.step(&mut state, &rows).unwrap();
    }
    state
}

/// Each request's pages, enough for every step's rows, in reverse order (so that slots are not
/// positions), and the first step's batch.
fn batch(cfg: &ModelConfig, case: &Case) -> (Batch, PageTable) {
    let mut next = 0;
    let pages: Vec<Vec<u32>> = case
        .contexts
        .iter()
        .map(|&n| {
            let last = n + case.rows * case.steps - 1;
            let count = pages_through(last as u32);
            let p: Vec<u32> = (next..next + count).rev().collect();
            next += count;
            p
        })
        .collect();
    let batch = Batch {
        requests: case
            .contexts
            .iter()
            .enumerate()
            .map(|(q, &n)| RequestInput {
                tokens: vec![prompt_token(cfg, q, n); case.rows],
                first_position: n as u32,
                pages: pages[q].clone(),
            })
            .collect(),
        page_tokens: PAGE_TOKENS,
        pages_per_request: pages.iter().map(Vec::len).max().unwrap() as u32,
    };
    (batch, PageTable::new(&pages).unwrap())
}

/// Runs of the reference's rows: the host twin of the feed (`HostRows::fed`) moves them on.
fn rows_of(h: &HostRows) -> Vec<Row> {
    (0..h.tokens.len())
        .map(|r| Row {
            request: h.row_request[r] as usize,
            token: h.tokens[r] as u32,
            position: h.positions[r] as usize,
        })
        .collect()
}

fn margin(logits: &[f32], pick: u32) -> f32 {
    let best = logits[pick as usize];
    let runner_up = logits
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != pick as usize)
        .map(|(_, &v)| v)
        .fold(f32::NEG_INFINITY, f32::max);
    best - runner_up
}

/// The reference's greedy decoding of `case`: every step's picks.
pub fn reference_greedy(case: &Case) -> Vec<RefStep> {
    let cfg = config();
    let model = reference(&cfg);
    let mut state = prefill(&cfg, &model, &case.contexts);
    let (batch, _) = batch(&cfg, case);
    let mut host = HostRows::new(&batch).unwrap();
    let mut steps = Vec::new();
    for _ in 0..case.steps {
        let out = model.step(&mut state, &rows_of(&host)).unwrap();
        let margins = out
            .logits
            .iter()
            .zip(&out.argmax)
            .map(|(l, &a)| margin(l, a))
            .collect();
        let argmax: Vec<i32> = out.argmax.iter().map(|&t| t as i32).collect();
        host = host.fed(&argmax, &batch);
        steps.push(RefStep {
            argmax: out.argmax,
            margins,
            logits: out.logits,
        });
    }
    steps
}

/// The reference's greedy decoding of `case` as the device's inspected steps report theirs: each
/// layer's rows in bf16, a full layer's scores (`-inf` past each row's position) and lists (cache
/// slots through the case's page table): what a device that computed exactly the reference's
/// numbers would give (the negative controls change it).
pub fn reference_as_device(case: &Case) -> Vec<DeviceStep> {
    let cfg = config();
    let model = reference(&cfg);
    let mut state = prefill(&cfg, &model, &case.contexts);
    let (batch, table) = batch(&cfg, case);
    let stride = (batch.pages_per_request * PAGE_TOKENS) as usize;
    let mut host = HostRows::new(&batch).unwrap();
    let mut steps = Vec::new();
    for _ in 0..case.steps {
        let rows = rows_of(&host);
        let out = model.step(&mut state, &rows).unwrap();
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| LayerLook {
                hidden: out.hidden[l]
                    .iter()
                    .flatten()
                    .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                    .collect(),
                front: out.index_scores[l].as_ref().map(|scores| FrontLook {
                    scores: scores
                        .iter()
                        .flat_map(|row| {
                            let mut v = row.clone();
                            v.resize(stride, f32::NEG_INFINITY);
                            v
                        })
                        .collect(),
                    lists: out.topk[l]
                        .iter()
                        .zip(&rows)
                        .flat_map(|(list, row)| {
                            list.iter()
                                .map(|&p| {
                                    if p < 0 {
                                        -1
                                    } else {
                                        table.slot(row.request, p as u32).unwrap()
                                    }
                                })
                                .collect::<Vec<_>>()
                        })
                        .collect(),
                    own_select: None,
                }),
                route: out.router_scores[l].as_ref().map(|scores| RouteLook {
                    scores: scores.iter().flatten().copied().collect(),
                    experts: out.routes[l]
                        .as_ref()
                        .unwrap()
                        .iter()
                        .flatten()
                        .map(|r| r.expert as u32)
                        .collect(),
                }),
            })
            .collect();
        let argmax: Vec<i32> = out.argmax.iter().map(|&t| t as i32).collect();
        host = host.fed(&argmax, &batch);
        steps.push(DeviceStep {
            picks: out.argmax,
            logits: out.logits,
            layers,
        });
    }
    steps
}

fn inputs_rows(batch: &Batch) -> usize {
    batch.requests.iter().map(|r| r.tokens.len()).sum()
}

/// Largest relative L2 error of a row's logits against the reference's, over every row and step:
/// the tail's own tolerance is the layers' ([`LOGIT_TOLERANCE`]).
pub const LOGIT_TOLERANCE: f64 = 3e-2;

/// One row's pick where the device's and the reference's differ over the same rows.
#[derive(Clone, Debug, PartialEq)]
pub struct Flip {
    pub step: usize,
    pub row: usize,
    pub device: u32,
    pub reference: u32,
    /// The reference's logit of its pick over its runner-up.
    pub margin: f32,
    /// The reference's logit of its pick over its logit of the device's pick.
    pub gap: f32,
    /// How far the device's logits of the two tokens are from the reference's, summed: a gap at
    /// most this is a near-tie that the measured logit error can swap.
    pub error: f32,
}

impl Flip {
    /// Whether the measured error of the two logits can swap the reference's order of them.
    pub fn explained(&self) -> bool {
        self.gap <= self.error
    }
}

impl std::fmt::Display for Flip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {} row {}: device {}, reference {} (the reference's margin {:.3}, its logit of \
             the device's pick {:.3} below its pick's; the device's error on the two logits {:.3}: {})",
            self.step,
            self.row,
            self.device,
            self.reference,
            self.margin,
            self.gap,
            self.error,
            if self.explained() { "a near-tie" } else { "NOT explained by the logit error" }
        )
    }
}

/// The device's steps against the reference stepped over the same rows.
#[derive(Clone, Debug, Default)]
pub struct SameRows {
    /// Every pick of the device that is not the reference's over the same rows.
    pub flips: Vec<Flip>,
    /// Every list and route of the device that is not the reference's choice over its own
    /// scores.
    pub list_flips: Vec<ChoiceFlip>,
    pub route_flips: Vec<ChoiceFlip>,
    /// Largest relative L2 error of a row's logits.
    pub logit_error: f64,
    /// The same, each step's.
    pub step_errors: Vec<f64>,
    /// Largest relative L2 error of a layer's output rows, each step's.
    pub layer_errors: Vec<f64>,
    /// Largest error of a device's index score (a position at most the row's) against the
    /// reference's, each step's.
    pub score_errors: Vec<f32>,
    /// Picks that are not the argmax of the device's own logits (ties to the lower id).
    pub not_argmax: Vec<(usize, usize)>,
    /// What else is wrong: a list that is not the select of the launch's own scores, a finite
    /// score past a row's position, a list the reference cannot attend over, a layer's rows past
    /// the tolerance.
    pub faults: Vec<String>,
    pub picks: usize,
    /// Rows' lists and routes compared (layers x rows x steps).
    pub lists: usize,
    pub routes: usize,
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn relative_l2(got: &[f32], want: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        diff += (f64::from(g) - f64::from(w)).powi(2);
        norm += f64::from(w).powi(2);
    }
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}

/// The reference stepped over the rows the device's feed made (its first step's rows the
/// batch's, each next step's tokens the device's picks) and over the device's choices (the top-k
/// lists of every full-indexer layer and the experts of every MoE layer, where the device's steps
/// were inspected), so that no pick, list or route that differs at a near-tie makes the two part
/// for the steps after it: the device's logits, layer rows and index scores against the
/// reference's; every pick, list and route of the device that is not the reference's own choice
/// over its own scores.
pub fn over_the_same_rows(case: &Case, device: &[DeviceStep]) -> SameRows {
    let cfg = config();
    let model = reference(&cfg);
    let top = TopK::of(&cfg).unwrap();
    let routing = Routing::new(&cfg);
    let mut state = prefill(&cfg, &model, &case.contexts);
    let (batch, table) = batch(&cfg, case);
    let mut host = HostRows::new(&batch).unwrap();
    let mut out = SameRows::default();
    for (step, d) in device.iter().enumerate() {
        let rows = rows_of(&host);
        let looks = d
            .layers
            .iter()
            .enumerate()
            .map(|(l, look)| (l, look.front.as_ref(), look.route.as_ref()));
        let (chosen, faults) = device_choices(cfg.num_hidden_layers, looks, &rows, &table, step);
        out.faults.extend(faults);
        let want = match model.step_choosing(&mut state, &rows, &chosen) {
            Ok(w) => w,
            Err(e) => {
                out.faults.push(format!(
                    "step {step}: the reference cannot attend over the device's lists: {e}"
                ));
                return out;
            }
        };
        out.step_errors.push(0.0);
        out.layer_errors.push(0.0);
        out.score_errors.push(0.0);
        for (l, look) in d.layers.iter().enumerate() {
            let e = rows_error(&look.hidden, &want.hidden[l]);
            out.layer_errors[step] = out.layer_errors[step].max(e);
            if e >= step_tolerance() {
                out.faults.push(format!(
                    "step {step} layer {l}: rows {e:.2e} from the reference's (tolerance {:.0e})",
                    step_tolerance()
                ));
            }
            if let (Some(route), Some(scores), MlpBlock::Moe(w)) =
                (&look.route, &want.router_scores[l], &model.layers[l].mlp)
            {
                let c = check_route(step, l, route, scores, &w.router.bias, &routing);
                out.routes += c.compared;
                out.route_flips.extend(c.flips);
                out.faults.extend(c.faults);
            }
            let (Some(front), Some(scores)) = (&look.front, &want.index_scores[l]) else {
                continue;
            };
            let lists = chosen.lists[l].as_ref();
            let c = check_front(step, l, front, lists, scores, &rows, top);
            out.lists += c.compared;
            out.score_errors[step] = out.score_errors[step].max(c.score_error);
            out.list_flips.extend(c.flips);
            out.faults.extend(c.faults);
        }
        for (row, (&got, &pick)) in d.picks.iter().zip(&want.argmax).enumerate() {
            let reference = &want.logits[row];
            out.picks += 1;
            if let Some(logits) = d.logits.get(row) {
                let e = relative_l2(logits, reference);
                out.logit_error = out.logit_error.max(e);
                out.step_errors[step] = out.step_errors[step].max(e);
                if argmax(logits) != got {
                    out.not_argmax.push((step, row));
                }
            }
            if got != pick {
                let off = |t: u32| {
                    d.logits.get(row).map_or(f32::INFINITY, |l| {
                        (l[t as usize] - reference[t as usize]).abs()
                    })
                };
                out.flips.push(Flip {
                    step,
                    row,
                    device: got,
                    reference: pick,
                    margin: margin(reference, pick),
                    gap: reference[pick as usize] - reference[got as usize],
                    error: off(got) + off(pick),
                });
            }
        }
        let fed: Vec<i32> = d.picks.iter().map(|&t| t as i32).collect();
        host = host.fed(&fed, &batch);
    }
    out
}

/// The layers' tolerance (`step::check::TOLERANCE`, relative L2 of a layer's output rows).
fn step_tolerance() -> f64 {
    executor::step::check::TOLERANCE
}

fn list(v: &[f64]) -> String {
    v.iter()
        .map(|e| format!("{e:.1e}"))
        .collect::<Vec<_>>()
        .join(" ")
}

impl SameRows {
    /// Whether the device's steps follow the reference: logits and every layer's rows within
    /// tolerance, each pick the argmax of the device's own logits, each list the select of the
    /// launch's own scores, no finite score past a row's position, and every pick and list that
    /// is not the reference's a near-tie the measured error explains.
    pub fn passes(&self) -> bool {
        self.logit_error < LOGIT_TOLERANCE
            && self.not_argmax.is_empty()
            && self.faults.is_empty()
            && self.flips.iter().all(Flip::explained)
            && self.list_flips.iter().all(ChoiceFlip::explained)
            && self.route_flips.iter().all(ChoiceFlip::explained)
    }

    pub fn summary(&self) -> String {
        let explained = self.flips.iter().filter(|f| f.explained()).count();
        let lists_explained = self.list_flips.iter().filter(|f| f.explained()).count();
        let routes_explained = self.route_flips.iter().filter(|f| f.explained()).count();
        let scores: Vec<f64> = self.score_errors.iter().map(|&e| f64::from(e)).collect();
        format!(
            "over the same rows and lists: logits within {:.2e} of the reference's (tolerance \
             {:.0e}); {} of {} picks differ ({} near-ties the logit error explains); {} of {} \
             top-k lists are not the reference's selection ({} near-ties the score error \
             explains); {} of {} routes are not the reference's ({} near-ties the router score \
             error explains); {} picks not the argmax of the device's own logits; {} faults; each \
             step's logit error {}; its layers' {}; its index scores' {}",
            self.logit_error,
            LOGIT_TOLERANCE,
            self.flips.len(),
            self.picks,
            explained,
            self.list_flips.len(),
            self.lists,
            lists_explained,
            self.route_flips.len(),
            self.routes,
            routes_explained,
            self.not_argmax.len(),
            self.faults.len(),
            list(&self.step_errors),
            list(&self.layer_errors),
            list(&scores),
        )
    }

    /// Every fault, and every pick and list that is not the reference's, a line each.
    pub fn details(&self) -> Vec<String> {
        let flips = self.flips.iter().map(|f| format!("  pick {f}"));
        let lists = self.list_flips.iter().map(|f| format!("  list {f}"));
        let routes = self.route_flips.iter().map(|f| format!("  route {f}"));
        let faults = self.faults.iter().map(|f| format!("  FAULT {f}"));
        faults.chain(flips).chain(lists).chain(routes).collect()
    }
}

fn variant() -> Variant {
    Variant {
        debug: Some(DebugBound {
            poll_limit: 1 << 22,
            trap: false,
        }),
        ..Variant::default()
    }
}

/// The step's kernels, built once for every case of a device (they depend on the preset and the
/// CTAs, not on the batch).
#[derive(Default)]
pub struct Kernels(Option<StepKernels>);

/// One step of the device: each row's pick (the tail's argmax) and its logits (the tail's bf16
/// logits, read from the arena after the step); in a step run launch by launch, what each layer
/// left behind.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceStep {
    pub picks: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
    /// Each layer's launch, in order (empty for a replayed step: a later launch rewrites the
    /// arena a launch writes).
    pub layers: Vec<LayerLook>,
}

/// What one layer's launch left behind, read right after it ran.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerLook {
    /// Its output rows, `[rows][hidden]` bf16.
    pub hidden: Vec<u8>,
    /// On a full-indexer layer, its index scores and top-k lists.
    pub front: Option<FrontLook>,
    /// On an MoE layer, its router's choices.
    pub route: Option<RouteLook>,
}

/// How the device's steps after the first are run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Steps {
    /// Replays of the step graph captured after the first step: what a decoder runs.
    Replayed,
    /// Every step launched directly, launch by launch, each launch's outputs read before the
    /// next runs ([`DeviceStep::layers`]).
    Inspected,
}

/// The picks of every step.
pub fn picks_of(steps: &[DeviceStep]) -> Vec<Vec<u32>> {
    steps.iter().map(|s| s.picks.clone()).collect()
}

/// The whole step of `case` on `dev`, planned by `planning`, the greedy feed moving the rows on
/// on the device: run once, captured and replayed for the other steps, or every step run launch
/// by launch (`steps`). Every step's picks and logits, as far as the steps ran.
pub fn device_greedy(
    dev: &Device,
    kernels: &mut Kernels,
    case: &Case,
    planning: Planning,
    steps: Steps,
) -> Vec<DeviceStep> {
    let cfg = config();
    let model = reference(&cfg);
    let state = prefill(&cfg, &model, &case.contexts);
    let (batch, table) = batch(&cfg, case);
    let images = CacheImages::from_reference(&cfg, CacheFormat::Bf16, &state, &table).unwrap();
    let caches = images.upload(dev).unwrap();
    let plan = WeightPlan::new(&cfg, 1, 0, WeightFormat::Bf16).unwrap();
    let weights = DeviceWeights::from_host(dev, plan, SEED).unwrap();
    let bound = ModelWeights::bind(dev, &cfg, &weights).unwrap();
    let build = step_build(dev, &cfg, &batch, &bound, CacheFormat::Bf16, caches.pages);
    let requests = match planning {
        Planning::Pages => front_requests(&batch),
        Planning::FirstPositions => batch
            .requests
            .iter()
            .map(|r| FrontRequest {
                context: r.first_position,
                rows: r.tokens.len() as u32,
                pages: r.pages.clone(),
            })
            .collect(),
    };
    let plans = plan_step(&cfg, &requests, &build).unwrap();
    let tail = plans
        .last()
        .and_then(|p| p.tail.as_ref())
        .expect("the step ends with the tail");
    let (logits_at, vocab) = (tail.logits.offset as usize, tail.shape.vocab_rows as usize);
    let rows = inputs_rows(&batch);
    if kernels.0.is_none() {
        kernels.0 = Some(StepKernels::build(dev, &cfg, &build, &plans, variant()).unwrap());
    }
    let kernels = kernels.0.as_ref().unwrap();
    let arena = StepArena::new(dev, &cfg, &plans).unwrap();
    let inputs = StepInputs::new(dev, &batch).unwrap();
    let feed = FeedKernel::build(dev).unwrap();
    let pieces = StepPieces {
        cfg: &cfg,
        build: &build,
        kernels,
        weights: &bound,
        caches: &caches,
        arena: &arena,
        inputs: &inputs,
        feed: Some(&feed),
        variant: variant(),
    };
    let kept = plans.clone();
    let mut graph = step_graph(dev, &pieces, plans).unwrap();
    let read = |inputs: &StepInputs| -> DeviceStep {
        let picks = inputs
            .argmax
            .download()
            .unwrap()
            .iter()
            .take(rows)
            .map(|&t| t as u32)
            .collect();
        let bytes = arena
            .arena
            .download_range(logits_at..logits_at + rows * vocab * 2)
            .unwrap();
        let logits = bytes
            .chunks_exact(vocab * 2)
            .map(|row| {
                row.chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect()
            })
            .collect();
        DeviceStep {
            picks,
            logits,
            layers: Vec::new(),
        }
    };
    let mut done = Vec::new();
    if steps == Steps::Inspected {
        for s in 0..case.steps {
            let mut layers = Vec::new();
            let ran = graph.run_inspected(&mut |i, launch| {
                if kept[i].tail.is_some() {
                    return Ok(());
                }
                let front = read_front_look(&kept[i], &arena.arena)?;
                let route = read_route(&cfg, &kept[i], &arena.arena, rows)?;
                layers.push(LayerLook {
                    hidden: launch.outputs()[0].data.bytes()?,
                    front,
                    route,
                });
                Ok(())
            });
            if let Err(e) = ran {
                eprintln!("step {s} (launch by launch) stopped: {e}");
                return done;
            }
            done.push(DeviceStep {
                layers,
                ..read(&inputs)
            });
        }
        return done;
    }
    if let Err(e) = graph.run_eager() {
        eprintln!("step 0 stopped: {e}");
        return done;
    }
    done.push(read(&inputs));
    graph.capture().unwrap();
    for s in 1..case.steps {
        if let Err(e) = graph.replay(1) {
            eprintln!("step {s} (a replay) stopped: {e}");
            return done;
        }
        done.push(read(&inputs));
    }
    done
}

/// Where the device's picks first leave the reference's: `None` when every step's picks are
/// equal, else the step, the row, both tokens and the reference's margin there.
pub fn first_difference(device: &[Vec<u32>], reference: &[RefStep]) -> Option<String> {
    if device.len() != reference.len() {
        return Some(format!(
            "the device ran {} of {} steps",
            device.len(),
            reference.len()
        ));
    }
    for (s, (got, want)) in device.iter().zip(reference).enumerate() {
        if got.len() != want.argmax.len() {
            return Some(format!(
                "step {s}: {} picks, the reference {}",
                got.len(),
                want.argmax.len()
            ));
        }
        if let Some(r) = (0..got.len()).find(|&r| got[r] != want.argmax[r]) {
            return Some(format!(
                "step {s}, row {r}: the device picked {}, the reference {} (its logit {:.3e} over \
                 the runner-up); device {got:?}, reference {:?}",
                got[r], want.argmax[r], want.margins[r], want.argmax
            ));
        }
    }
    None
}

/// The smallest margin of the reference's picks over its runner-up: how near a tie any step came.
pub fn least_margin(reference: &[RefStep]) -> f32 {
    reference
        .iter()
        .flat_map(|s| s.margins.iter().copied())
        .fold(f32::INFINITY, f32::min)
}

/// The whole check of `case`: the replayed steps equal the steps run launch by launch bit for
/// bit (picks and logits), and those follow the reference stepped over the same rows and lists
/// ([`SameRows::passes`]); the free-running greedy decodings compared beside it (where they
/// part, it is at a pick or list of the same-rows check). The line to print, or every difference.
pub fn check(dev: &Device, kernels: &mut Kernels, case: &Case) -> Result<String, String> {
    let want = reference_greedy(case);
    let replayed = device_greedy(dev, kernels, case, Planning::Pages, Steps::Replayed);
    let inspected = device_greedy(dev, kernels, case, Planning::Pages, Steps::Inspected);
    let same = over_the_same_rows(case, &inspected);
    let free = first_difference(&picks_of(&replayed), &want);
    let unlike: Vec<usize> = (0..case.steps)
        .filter(|&s| {
            let (a, b) = (replayed.get(s), inspected.get(s));
            a.map(|a| (&a.picks, &a.logits)) != b.map(|b| (&b.picks, &b.logits))
        })
        .collect();
    let head = format!(
        "{}: replays {}; free-running greedy decoding {}; {}",
        case.name(),
        if unlike.is_empty() {
            "equal the steps run launch by launch, bit for bit".to_string()
        } else {
            format!("DIFFER from the steps run launch by launch at steps {unlike:?}")
        },
        free.map_or_else(
            || format!(
                "gives the reference's tokens at every step (its least margin {:.3e})",
                least_margin(&want)
            ),
            |d| format!("parts from the reference's at {d}")
        ),
        same.summary()
    );
    let mut lines = vec![head];
    lines.extend(same.details());
    let ran = replayed.len() == case.steps && inspected.len() == case.steps;
    if same.passes() && unlike.is_empty() && ran {
        Ok(lines.join("\n"))
    } else {
        if !ran {
            lines.push(format!(
                "  the device ran {} replayed and {} inspected steps of {}",
                replayed.len(),
                inspected.len(),
                case.steps
            ));
        }
        Err(lines.join("\n"))
    }
}
