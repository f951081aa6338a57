//! Greedy decoding with the whole captured step against the CPU reference's greedy decoding, at
//! the tiny preset: each request's context prefilled by the reference (its caches placed in the
//! device's through a page table), then the step graph (every layer's launch, the tail, the greedy
//! feed) run once and replayed, the feed moving every row on on the device, and each step's
//! tokens compared with the reference's step over the same rows.
#![allow(dead_code)]

use device::Device;
use executor::fused::front::FrontRequest;
use executor::reference::{DecodeState, ReferenceModel, ReferenceOptions, Row};
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
        });
    }
    steps
}

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
}

impl std::fmt::Display for Flip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {} row {}: device {}, reference {} (the reference's margin {:.3}, its logit of \
             the device's pick {:.3} below its pick's)",
            self.step, self.row, self.device, self.reference, self.margin, self.gap
        )
    }
}

/// The reference stepped over the rows the device's feed made (its first step's rows the
/// batch's, each next step's tokens the device's picks), so that a pick that differs does not
/// change the steps after it: every pick of the device that is not the reference's over the same
/// rows.
pub fn flips_over_the_same_rows(case: &Case, device: &[Vec<u32>]) -> Vec<Flip> {
    let cfg = config();
    let model = reference(&cfg);
    let mut state = prefill(&cfg, &model, &case.contexts);
    let (batch, _) = batch(&cfg, case);
    let mut host = HostRows::new(&batch).unwrap();
    let mut flips = Vec::new();
    for (step, picks) in device.iter().enumerate() {
        let out = model.step(&mut state, &rows_of(&host)).unwrap();
        for (row, (&got, &want)) in picks.iter().zip(&out.argmax).enumerate() {
            if got != want {
                let logits = &out.logits[row];
                flips.push(Flip {
                    step,
                    row,
                    device: got,
                    reference: want,
                    margin: margin(logits, want),
                    gap: logits[want as usize] - logits[got as usize],
                });
            }
        }
        let fed: Vec<i32> = picks.iter().map(|&t| t as i32).collect();
        host = host.fed(&fed, &batch);
    }
    flips
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

/// The whole step of `case` on `dev`, planned by `planning`: run once, captured, replayed for
/// the other steps, the greedy feed moving the rows on on the device. Every step's picks (the
/// tail's argmax of each row), as far as the steps ran.
pub fn device_greedy(
    dev: &Device,
    kernels: &mut Kernels,
    case: &Case,
    planning: Planning,
) -> Vec<Vec<u32>> {
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
    let mut graph = step_graph(dev, &pieces, plans).unwrap();
    let picks = |inputs: &StepInputs| -> Vec<u32> {
        inputs
            .argmax
            .download()
            .unwrap()
            .iter()
            .map(|&t| t as u32)
            .collect()
    };
    let mut steps = Vec::new();
    if let Err(e) = graph.run_eager() {
        eprintln!("step 0 stopped: {e}");
        return steps;
    }
    steps.push(picks(&inputs));
    eprintln!("  step 0 (run directly): {:?}", steps[0]);
    graph.capture().unwrap();
    for s in 1..case.steps {
        if let Err(e) = graph.replay(1) {
            eprintln!("step {s} (a replay) stopped: {e}");
            return steps;
        }
        steps.push(picks(&inputs));
        eprintln!("  step {s} (a replay): {:?}", steps[s]);
    }
    steps
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

/// The whole check of `case`: the device's greedy tokens over its steps equal the reference's
/// greedy decoding's, and (where they part) every pick equals the reference's over the same rows.
/// The line to print, or every difference.
pub fn check(dev: &Device, kernels: &mut Kernels, case: &Case) -> Result<String, String> {
    let want = reference_greedy(case);
    let got = device_greedy(dev, kernels, case, Planning::Pages);
    let flips = flips_over_the_same_rows(case, &got);
    let free = first_difference(&got, &want);
    if free.is_none() && flips.is_empty() && got.len() == case.steps {
        return Ok(format!(
            "{}: the same greedy tokens as the reference at every step (its least margin {:.3e}); \
             last step {:?}",
            case.name(),
            least_margin(&want),
            want.last().map(|s| &s.argmax)
        ));
    }
    let mut lines = vec![format!(
        "{}: greedy decoding parts from the reference's: {}",
        case.name(),
        free.unwrap_or_else(|| "never".into())
    )];
    lines.push(format!(
        "  over the same rows, {} of {} picks differ",
        flips.len(),
        got.iter().map(Vec::len).sum::<usize>()
    ));
    lines.extend(flips.iter().map(|f| format!("  {f}")));
    Err(lines.join("\n"))
}
