//! The CPU emulator of a persistent launch: one thread per CTA, each running its task list with
//! the real protocol on a shared scratch of atomic boxes, so schedules are exercised without a GPU.
//! Waits are bounded: a schedule that deadlocks ends in an error naming each stuck task and box.

use crate::diag::Stall;
use crate::layout::pack;
use crate::placement::{Placement, ValidPlacement};
use crate::protocol::{put_row, wait_all, Patience, PollMode};
use crate::task::Task;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A task function: fills `out` (the task's output row) from its input rows, in `task.inputs()` order.
pub trait TaskFn: Sync {
    fn run(&self, task: &Task, inputs: &[&[u32]], out: &mut [u32]) -> Result<(), TaskFailed>;
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

#[derive(Clone, Copy, Debug)]
pub struct EmuConfig {
    pub mode: PollMode,
    /// How long one wait may take before the launch is declared stuck.
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

/// Runs any placement, one that breaks the rule included: only for showing what the rule prevents.
/// Its waits are bounded by `config.timeout`, so a deadlock ends in [`EmuError::Stalled`].
pub fn run_unchecked<F: TaskFn>(
    placement: &Placement,
    scratch: &Scratch,
    tag: u32,
    config: &EmuConfig,
    task_fn: &F,
) -> Result<(), EmuError> {
    check_ranges(placement, scratch.len())?;
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
                match cta_run.run(cta, list, task_fn) {
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

enum Outcome {
    Stalled(Stall),
    Failed(EmuError),
}

struct CtaRun<'a> {
    scratch: &'a Scratch,
    tag: u32,
    config: &'a EmuConfig,
    abort: &'a AtomicBool,
}

impl CtaRun<'_> {
    fn run<F: TaskFn>(&self, cta: u32, list: &[Task], task_fn: &F) -> Result<(), Outcome> {
        let boxes = self.scratch.boxes();
        let mut rows: Vec<Vec<u32>> = Vec::new();
        let mut out = Vec::new();
        for task in list {
            rows.resize(task.inputs().len(), Vec::new());
            for (range, row) in task.inputs().iter().zip(rows.iter_mut()) {
                row.resize(range.len as usize, 0);
                let cells = &boxes[range.first as usize..range.end() as usize];
                let patience = Patience {
                    max_polls: None,
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
                })?;
            }
            let inputs: Vec<&[u32]> = rows.iter().map(|r| r.as_slice()).collect();
            out.clear();
            out.resize(task.out.len as usize, 0);
            task_fn.run(task, &inputs, &mut out).map_err(|source| {
                Outcome::Failed(EmuError::Task {
                    cta,
                    task: task.order,
                    kind: task.kind,
                    source,
                })
            })?;
            put_row(
                &boxes[task.out.first as usize..task.out.end() as usize],
                self.tag,
                &out,
            );
        }
        Ok(())
    }
}

/// The oracle: every task of `placement` in global order on one thread, on plain words, starting
/// from `initial` (the scratch before the launch). Returns the scratch image after the launch.
pub fn evaluate_sequential<F: TaskFn>(
    placement: &Placement,
    initial: &[u64],
    tag: u32,
    task_fn: &F,
) -> Result<Vec<u64>, EmuError> {
    check_ranges(placement, initial.len())?;
    let mut tasks: Vec<(u32, &Task)> = placement.tasks().collect();
    tasks.sort_by_key(|(_, t)| t.order);
    let mut image = initial.to_vec();
    let mut written = vec![false; image.len()];
    for (cta, task) in tasks {
        let mut rows = Vec::with_capacity(task.inputs().len());
        for r in task.inputs() {
            let mut row = Vec::with_capacity(r.len as usize);
            for b in r.boxes() {
                if !written[b as usize] {
                    return Err(EmuError::Unwritten {
                        task: task.order,
                        box_index: b as u32,
                    });
                }
                row.push(image[b as usize] as u32);
            }
            rows.push(row);
        }
        let inputs: Vec<&[u32]> = rows.iter().map(|r| r.as_slice()).collect();
        let mut out = vec![0; task.out.len as usize];
        task_fn
            .run(task, &inputs, &mut out)
            .map_err(|source| EmuError::Task {
                cta,
                task: task.order,
                kind: task.kind,
                source,
            })?;
        for (b, v) in task.out.boxes().zip(out) {
            image[b as usize] = pack(tag, v);
            written[b as usize] = true;
        }
    }
    Ok(image)
}
