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

fn inputs_rows(batch: &Batch) -> usize {
    batch.requests.iter().map(|r| r.tokens.len()).sum()
}

/// Largest relative L2 error of the device's logits of a row against the reference's, over every
/// row and step: the tail's own tolerance is the layers' ([`LOGIT_TOLERANCE`]).
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
    /// Largest relative L2 error of a row's logits.
    pub logit_error: f64,
    /// The same, each step's.
    pub step_errors: Vec<f64>,
    /// Picks that are not the argmax of the device's own logits (ties to the lower id).
    pub not_argmax: Vec<(usize, usize)>,
    pub picks: usize,
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
/// batch's, each next step's tokens the device's picks), so that a pick that differs does not
/// change the steps after it: the device's logits against the reference's, and every pick of the
/// device that is not the reference's.
pub fn over_the_same_rows(case: &Case, device: &[DeviceStep]) -> SameRows {
    let cfg = config();
    let model = reference(&cfg);
    let mut state = prefill(&cfg, &model, &case.contexts);
    let (batch, _) = batch(&cfg, case);
    let mut host = HostRows::new(&batch).unwrap();
    let mut out = SameRows::default();
    for (step, d) in device.iter().enumerate() {
        let want = model.step(&mut state, &rows_of(&host)).unwrap();
        out.step_errors.push(0.0);
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

impl SameRows {
    /// Whether the device's steps follow the reference: logits within [`LOGIT_TOLERANCE`], each
    /// pick the argmax of the device's own logits, and every pick that is not the reference's a
    /// near-tie the measured logit error explains.
    pub fn passes(&self) -> bool {
        self.logit_error < LOGIT_TOLERANCE
            && self.not_argmax.is_empty()
            && self.flips.iter().all(Flip::explained)
    }

    pub fn summary(&self) -> String {
        let explained = self.flips.iter().filter(|f| f.explained()).count();
        format!(
            "over the same rows: logits within {:.2e} of the reference's (tolerance {:.0e}); {} \
             of {} picks differ ({} near-ties the logit error explains); {} picks not the argmax \
             of the device's own logits; each step's logit error {}",
            self.logit_error,
            LOGIT_TOLERANCE,
            self.flips.len(),
            self.picks,
            explained,
            self.not_argmax.len(),
            self.step_errors
                .iter()
                .map(|e| format!("{e:.1e}"))
                .collect::<Vec<_>>()
                .join(" ")
        )
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
/// logits, read from the arena after the step).
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceStep {
    pub picks: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
}

/// The picks of every step.
pub fn picks_of(steps: &[DeviceStep]) -> Vec<Vec<u32>> {
    steps.iter().map(|s| s.picks.clone()).collect()
}

/// The whole step of `case` on `dev`, planned by `planning`: run once, captured, replayed for
/// the other steps, the greedy feed moving the rows on on the device. Every step's picks and
/// logits, as far as the steps ran.
pub fn device_greedy(
    dev: &Device,
    kernels: &mut Kernels,
    case: &Case,
    planning: Planning,
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
        DeviceStep { picks, logits }
    };
    let mut steps = Vec::new();
    if let Err(e) = graph.run_eager() {
        eprintln!("step 0 stopped: {e}");
        return steps;
    }
    steps.push(read(&inputs));
    eprintln!("  step 0 (run directly): {:?}", steps[0].picks);
    graph.capture().unwrap();
    for s in 1..case.steps {
        if let Err(e) = graph.replay(1) {
            eprintln!("step {s} (a replay) stopped: {e}");
            return steps;
        }
        steps.push(read(&inputs));
        eprintln!("  step {s} (a replay): {:?}", steps[s].picks);
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

/// The whole check of `case`: the device's greedy steps against the reference's over the same
/// rows ([`SameRows::passes`]), and the free-running greedy decodings compared (where they part,
/// it is at a pick of the same-rows list). The line to print, or every difference.
pub fn check(dev: &Device, kernels: &mut Kernels, case: &Case) -> Result<String, String> {
    let want = reference_greedy(case);
    let got = device_greedy(dev, kernels, case, Planning::Pages);
    let same = over_the_same_rows(case, &got);
    let free = first_difference(&picks_of(&got), &want);
    let head = format!(
        "{}: free-running greedy decoding {}; {}",
        case.name(),
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
    lines.extend(same.flips.iter().map(|f| format!("  {f}")));
    if same.passes() && got.len() == case.steps {
        Ok(lines.join("\n"))
    } else {
        if got.len() != case.steps {
            lines.push(format!(
                "  the device ran {} of {} steps",
                got.len(),
                case.steps
            ));
        }
        Err(lines.join("\n"))
    }
}
