//! The CPU emulator of a persistent launch: one thread per CTA, each running its task list with
//! the real protocol on a shared scratch of atomic boxes, so schedules are exercised without a GPU.
//! Waits are bounded: a schedule that deadlocks ends in an error naming each stuck task and box.
//!
//! Gang members (tasks of one rank, `placement` has the rule) run as an all-gather of one round:
//! a member waits on its inputs from earlier ranks, computes with [`TaskFn::share`] and publishes
//! the boxes its peers wait on, then waits on its peers' boxes, computes with [`TaskFn::run`] and
//! publishes the rest of its row. Which input ranges are peers' and which boxes peers read comes
//! from the placement: a range is a peer's when a task of the same rank writes any box of it.

use crate::diag::Stall;
use crate::layout::{pack, BoxRange};
use crate::placement::{Placement, ValidPlacement};
use crate::protocol::{put, wait_all, Patience, PollMode};
use crate::task::Task;
use crate::trace::Recorder;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A task function: fills `out` (the task's output row) from its input rows, in `task.inputs()` order.
pub trait TaskFn: Sync {
    /// The whole task; for a gang member, called after [`TaskFn::share`] with its peers' rows too.
    fn run(&self, task: &Task, inputs: &[&[u32]], out: &mut [u32]) -> Result<(), TaskFailed>;

    /// A gang member's first half: the boxes its peers wait on, from the rows of earlier ranks;
    /// the rows its peers write are empty here. Of `out`, only the boxes peers wait on are kept
    /// (and [`TaskFn::run`]'s values for them are dropped: a box is written once a launch).
    fn share(&self, task: &Task, inputs: &[&[u32]], out: &mut [u32]) -> Result<(), TaskFailed> {
        self.run(task, inputs, out)
    }
}

impl<F> TaskFn for F
where
    F: Fn(&Task, &[&[u32]], &mut [u32]) -> Result<(), TaskFailed> + Sync,
{
    fn run(&self, task: &Task, inputs: &[&[u32]], out: &mut [u32]) -> Result<(), TaskFailed> {
        self(task, inputs, out)
    }
}

/// A task function's own failure (an unknown kind, say).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TaskFailed(pub String);

/// The boxes of a launch's scratch.
#[derive(Debug)]
pub struct Scratch {
    boxes: Vec<AtomicU64>,
}

impl Scratch {
    /// All zero: no box holds a tag (tags are never 0).
    pub fn new(boxes: u32) -> Self {
        Scratch::from_words(&vec![0; boxes as usize])
    }

    pub fn from_words(words: &[u64]) -> Self {
        Scratch {
            boxes: words.iter().map(|&w| AtomicU64::new(w)).collect(),
        }
    }

    pub fn boxes(&self) -> &[AtomicU64] {
        &self.boxes
    }

    pub fn len(&self) -> usize {
        self.boxes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.boxes.is_empty()
    }

    pub fn snapshot(&self) -> Vec<u64> {
        self.boxes
            .iter()
            .map(|b| b.load(Ordering::Acquire))
            .collect()
    }
}

/// Polls a wait makes at least before it gives up ([`EmuConfig::timeout`]). A waiter yields
/// between polls, so it polls about once each time the scheduler runs it: a machine too loaded to
/// run the producer it waits for runs the waiter as seldom, and this many turns are far more than
/// a producer needs to put its box. Alone, the polls take milliseconds, less than any timeout.
pub const MIN_POLLS: u64 = 10_000;

#[derive(Clone, Copy, Debug)]
pub struct EmuConfig {
    pub mode: PollMode,
    /// How long one wait may take before the launch is declared stuck: the wait gives up once
    /// this time has passed and it has polled [`MIN_POLLS`] times, so a machine too loaded to run
    /// the producer slows the launch without failing it.
    pub timeout: Duration,
    /// CTAs that run at once (`None`: all). CTAs start in id order as earlier ones finish, as a
    /// GPU dispatches blocks; fewer than the grid shows why the rule wants every CTA resident.
    pub resident: Option<u32>,
}

impl Default for EmuConfig {
    fn default() -> Self {
        EmuConfig {
            mode: PollMode::RelaxedThenFence,
            timeout: Duration::from_secs(10),
            resident: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EmuError {
    #[error("task {task} on CTA {cta} uses boxes up to {end}, past the {boxes}-box scratch")]
    OutOfScratch {
        task: u32,
        cta: u32,
        end: u64,
        boxes: usize,
    },
    #[error("the launch is stuck: {}{}", list(.stalls), never(.never_started))]
    Stalled {
        /// Every CTA that was waiting when the launch gave up, by CTA.
        stalls: Vec<Stall>,
        /// CTAs that never started (the resident limit was full of stuck CTAs).
        never_started: Vec<u32>,
    },
    #[error("task {task} (kind {kind}) on CTA {cta} failed: {source}")]
    Task {
        cta: u32,
        task: u32,
        kind: u32,
        source: TaskFailed,
    },
    #[error("task {task} reads box {box_index} before any earlier task wrote it")]
    Unwritten { task: u32, box_index: u32 },
    #[error("a CTA thread panicked")]
    Panicked,
}

fn list(stalls: &[Stall]) -> String {
    stalls
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

fn never(ctas: &[u32]) -> String {
    if ctas.is_empty() {
        String::new()
    } else {
        format!("; CTAs {ctas:?} never started")
    }
}

/// Runs a checked placement with tag `tag`. Outputs land in `scratch` as tagged pairs.
pub fn run<F: TaskFn>(
    placement: &ValidPlacement,
    scratch: &Scratch,
    tag: u32,
    config: &EmuConfig,
    task_fn: &F,
) -> Result<(), EmuError> {
    run_unchecked(placement.placement(), scratch, tag, config, task_fn)
}

/// [`run`], stamping every task's start and end into `trace` (made for this placement).
pub fn run_traced<F: TaskFn>(
    placement: &ValidPlacement,
    scratch: &Scratch,
    tag: u32,
    config: &EmuConfig,
    task_fn: &F,
    trace: &Recorder,
) -> Result<(), EmuError> {
    run_with(
        placement.placement(),
        scratch,
        tag,
        config,
        task_fn,
        Some(trace),
    )
}

/// Runs any placement, one that breaks the rule included: only for showing what the rule prevents.
/// Its waits are bounded by `config.timeout`, so a deadlock ends in [`EmuError::Stalled`].
pub fn run_unchecked<F: TaskFn>(
    placement: &Placement,
    scratch: &Scratch,
    tag: u32,
    config: &EmuConfig,
    task_fn: &F,
) -> Result<(), EmuError> {
    run_with(placement, scratch, tag, config, task_fn, None)
}

fn run_with<F: TaskFn>(
    placement: &Placement,
    scratch: &Scratch,
    tag: u32,
    config: &EmuConfig,
    task_fn: &F,
    trace: Option<&Recorder>,
) -> Result<(), EmuError> {
    check_ranges(placement, scratch.len())?;
    let plans = GangPlan::of(placement, scratch.len());
    let ctas = placement.ctas();
    let workers = config.resident.unwrap_or(ctas).clamp(1, ctas.max(1));
    let next_cta = AtomicU32::new(0);
    let started: Vec<AtomicBool> = (0..ctas).map(|_| AtomicBool::new(false)).collect();
    let abort = AtomicBool::new(false);
    let stalls = Mutex::new(Vec::new());
    let failure = Mutex::new(None);
    let cta_run = CtaRun {
        scratch,
        tag,
        config,
        abort: &abort,
        trace,
    };
    let joined = crossbeam::scope(|s| {
        for _ in 0..workers {
            s.spawn(|_| loop {
                if abort.load(Ordering::Relaxed) {
                    break;
                }
                let cta = next_cta.fetch_add(1, Ordering::Relaxed);
                if cta >= ctas {
                    break;
                }
                started[cta as usize].store(true, Ordering::Relaxed);
                let list = &placement.lists()[cta as usize];
                match cta_run.run(cta, list, &plans[cta as usize], task_fn) {
                    Ok(()) => {}
                    Err(Outcome::Stalled(stall)) => {
                        abort.store(true, Ordering::Relaxed);
                        if let Ok(mut v) = stalls.lock() {
                            v.push(stall);
                        }
                        break;
                    }
                    Err(Outcome::Failed(e)) => {
                        abort.store(true, Ordering::Relaxed);
                        if let Ok(mut f) = failure.lock() {
                            f.get_or_insert(e);
                        }
                        break;
                    }
                }
            });
        }
    });
    joined.map_err(|_| EmuError::Panicked)?;
    if let Some(e) = failure.into_inner().map_err(|_| EmuError::Panicked)? {
        return Err(e);
    }
    let mut stalls = stalls.into_inner().map_err(|_| EmuError::Panicked)?;
    if stalls.is_empty() {
        return Ok(());
    }
    stalls.sort_by_key(|s| s.cta);
    let never_started = (0..ctas)
        .filter(|&c| !started[c as usize].load(Ordering::Relaxed))
        .collect();
    Err(EmuError::Stalled {
        stalls,
        never_started,
    })
}

/// Every range inside the scratch, so the CTA threads index without checks failing.
fn check_ranges(placement: &Placement, boxes: usize) -> Result<(), EmuError> {
    for (cta, task) in placement.tasks() {
        for r in std::iter::once(&task.out).chain(task.inputs()) {
            if r.end() > boxes as u64 {
                return Err(EmuError::OutOfScratch {
                    task: task.order,
                    cta,
                    end: r.end(),
                    boxes,
                });
            }
        }
    }
    Ok(())
}

/// How one task meets its gang: which of its input ranges are waits on peers (same rank), and
/// which boxes of its row peers wait on. Empty for a task no peer reads and that reads no peer.
#[derive(Debug)]
struct GangPlan {
    peer_inputs: Vec<bool>,
    shared: Vec<bool>,
}

impl GangPlan {
    /// The plans of every task, by CTA and position. Box indices are inside `boxes` (checked by
    /// [`check_ranges`]); where a placement has two writers of a box, the last one counts.
    fn of(placement: &Placement, boxes: usize) -> Vec<Vec<GangPlan>> {
        let tasks: Vec<&Task> = placement.tasks().map(|(_, t)| t).collect();
        let mut writer: Vec<Option<usize>> = vec![None; boxes];
        for (i, t) in tasks.iter().enumerate() {
            for b in t.out.boxes() {
                writer[b as usize] = Some(i);
            }
        }
        let mut plans: Vec<GangPlan> = tasks
            .iter()
            .map(|t| GangPlan {
                peer_inputs: vec![false; t.inputs().len()],
                shared: vec![false; t.out.len as usize],
            })
            .collect();
        for (i, t) in tasks.iter().enumerate() {
            for (r, range) in t.inputs().iter().enumerate() {
                for b in range.boxes() {
                    let Some(w) = writer[b as usize] else {
                        continue;
                    };
                    if w != i && tasks[w].order == t.order {
                        plans[i].peer_inputs[r] = true;
                        plans[w].shared[(b - tasks[w].out.first as u64) as usize] = true;
                    }
                }
            }
        }
        let mut plans = plans.into_iter();
        placement
            .lists()
            .iter()
            .map(|list| plans.by_ref().take(list.len()).collect())
            .collect()
    }

    fn waits_on_peers(&self) -> bool {
        self.peer_inputs.contains(&true)
    }

    /// Whether the box at `i` of the row is published with the share (else after the peer waits).
    fn is_shared(&self, i: usize) -> bool {
        self.shared.get(i).copied().unwrap_or(false)
    }
}

enum Outcome {
    Stalled(Stall),
    Failed(EmuError),
}

struct CtaRun<'a> {
    scratch: &'a Scratch,
    tag: u32,
    config: &'a EmuConfig,
    abort: &'a AtomicBool,
    trace: Option<&'a Recorder>,
}

impl CtaRun<'_> {
    fn run<F: TaskFn>(
        &self,
        cta: u32,
        list: &[Task],
        plans: &[GangPlan],
        task_fn: &F,
    ) -> Result<(), Outcome> {
        let mut rows: Vec<Vec<u32>> = Vec::new();
        let mut out = Vec::new();
        for (index, (task, plan)) in list.iter().zip(plans).enumerate() {
            let start = self.trace.map(|t| t.start());
            rows.resize(task.inputs().len(), Vec::new());
            let failed = |source| {
                Outcome::Failed(EmuError::Task {
                    cta,
                    task: task.order,
                    kind: task.kind,
                    source,
                })
            };
            out.clear();
            out.resize(task.out.len as usize, 0);
            for (r, range) in task.inputs().iter().enumerate() {
                if plan.peer_inputs[r] {
                    rows[r].clear();
                } else {
                    self.wait(cta, task, range, &mut rows[r])?;
                }
            }
            if plan.waits_on_peers() {
                task_fn
                    .share(task, &views(&rows), &mut out)
                    .map_err(failed)?;
                self.put(task, &out, |i| plan.is_shared(i));
                for (r, range) in task.inputs().iter().enumerate() {
                    if plan.peer_inputs[r] {
                        self.wait(cta, task, range, &mut rows[r])?;
                    }
                }
                out.fill(0);
                task_fn.run(task, &views(&rows), &mut out).map_err(failed)?;
                self.put(task, &out, |i| !plan.is_shared(i));
            } else {
                task_fn.run(task, &views(&rows), &mut out).map_err(failed)?;
                self.put(task, &out, |_| true);
            }
            if let (Some(trace), Some(start)) = (self.trace, start) {
                trace.finish(cta, index, task, start);
            }
        }
        Ok(())
    }

    /// Waits on the boxes of `range`, their values to `row`.
    fn wait(
        &self,
        cta: u32,
        task: &Task,
        range: &BoxRange,
        row: &mut Vec<u32>,
    ) -> Result<(), Outcome> {
        row.resize(range.len as usize, 0);
        let cells = &self.scratch.boxes()[range.first as usize..range.end() as usize];
        let patience = Patience {
            max_polls: Some(MIN_POLLS),
            deadline: Some(Instant::now() + self.config.timeout),
            abort: Some(self.abort),
        };
        wait_all(cells, self.tag, self.config.mode, &patience, row).map_err(|nr| {
            Outcome::Stalled(Stall {
                cta,
                task: task.order,
                box_index: range.first + nr.index as u32,
                want_tag: self.tag,
                seen: nr.seen,
                polls: nr.polls,
                thread: None,
            })
        })
    }

    /// Publishes the boxes of the task's row that `keep` selects, as tagged pairs.
    fn put(&self, task: &Task, out: &[u32], keep: impl Fn(usize) -> bool) {
        let cells = &self.scratch.boxes()[task.out.first as usize..task.out.end() as usize];
        for (i, (cell, &v)) in cells.iter().zip(out).enumerate() {
            if keep(i) {
                put(cell, self.tag, v);
            }
        }
    }
}

fn views(rows: &[Vec<u32>]) -> Vec<&[u32]> {
    rows.iter().map(|r| r.as_slice()).collect()
}

/// The oracle: every task of `placement` in global order on one thread, on plain words, starting
/// from `initial` (the scratch before the launch). Returns the scratch image after the launch.
/// A rank's members first all share (the boxes their peers wait on), then all finish.
pub fn evaluate_sequential<F: TaskFn>(
    placement: &Placement,
    initial: &[u64],
    tag: u32,
    task_fn: &F,
) -> Result<Vec<u64>, EmuError> {
    check_ranges(placement, initial.len())?;
    let plans = GangPlan::of(placement, initial.len());
    let mut tasks: Vec<(u32, &Task, &GangPlan)> = placement
        .tasks()
        .zip(plans.iter().flatten())
        .map(|((cta, t), plan)| (cta, t, plan))
        .collect();
    tasks.sort_by_key(|(_, t, _)| t.order);
    let mut oracle = Oracle {
        image: initial.to_vec(),
        written: vec![false; initial.len()],
        tag,
    };
    for rank in tasks.chunk_by(|a, b| a.1.order == b.1.order) {
        for &(cta, task, plan) in rank {
            let rows = oracle.rows(task, |r| !plan.peer_inputs[r])?;
            let mut out = vec![0; task.out.len as usize];
            if plan.waits_on_peers() {
                task_fn.share(task, &views(&rows), &mut out)
            } else {
                task_fn.run(task, &views(&rows), &mut out)
            }
            .map_err(|source| failed(cta, task, source))?;
            oracle.put(task, &out, |i| !plan.waits_on_peers() || plan.is_shared(i));
        }
        for &(cta, task, plan) in rank.iter().filter(|(_, _, p)| p.waits_on_peers()) {
            let rows = oracle.rows(task, |_| true)?;
            let mut out = vec![0; task.out.len as usize];
            task_fn
                .run(task, &views(&rows), &mut out)
                .map_err(|source| failed(cta, task, source))?;
            oracle.put(task, &out, |i| !plan.is_shared(i));
        }
    }
    Ok(oracle.image)
}

fn failed(cta: u32, task: &Task, source: TaskFailed) -> EmuError {
    EmuError::Task {
        cta,
        task: task.order,
        kind: task.kind,
        source,
    }
}

/// The sequential scratch: plain words and which of them this launch wrote.
struct Oracle {
    image: Vec<u64>,
    written: Vec<bool>,
    tag: u32,
}

impl Oracle {
    /// The task's input rows; those `wanted` rejects are empty.
    fn rows(&self, task: &Task, wanted: impl Fn(usize) -> bool) -> Result<Vec<Vec<u32>>, EmuError> {
        let mut rows = Vec::with_capacity(task.inputs().len());
        for (r, range) in task.inputs().iter().enumerate() {
            let mut row = Vec::with_capacity(range.len as usize);
            for b in range.boxes().filter(|_| wanted(r)) {
                if !self.written[b as usize] {
                    return Err(EmuError::Unwritten {
                        task: task.order,
                        box_index: b as u32,
                    });
                }
                row.push(self.image[b as usize] as u32);
            }
            rows.push(row);
        }
        Ok(rows)
    }

    fn put(&mut self, task: &Task, out: &[u32], keep: impl Fn(usize) -> bool) {
        for (i, (b, &v)) in task.out.boxes().zip(out).enumerate() {
            if keep(i) {
                self.image[b as usize] = pack(self.tag, v);
                self.written[b as usize] = true;
            }
        }
    }
}
