//! The task timeline of a launch: one record per task position of the [`TaskTable`], written by
//! the device's task loop (`MBX_TRACE=1` builds, `kernels/mailbox.h`) or by the CPU emulator
//! ([`Recorder`]), decoded here into spans and drawn as a Chrome / Perfetto trace ([`chrome`]) and
//! an SVG of the per-CTA timeline ([`svg`]).

pub mod chrome;
pub mod svg;

use crate::placement::{Placement, TaskTable};
use crate::task::{Stage, Task, STAGE_SHIFT};
use device::KernelSource;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Words of one record (`MBX_TRACE_WORDS`).
pub const RECORD_WORDS: usize = 8;
/// The last word of every written record (`MBX_TRACE_MARK`): a zeroed record was never written.
pub const RECORD_MARK: u64 = 0x4d42_5854_5241_4345;

/// One task's record, word for word as the device writes it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Record {
    /// A clock shared by every SM (`mono_timer_ns`): comparable across CTAs, in coarser steps than the cycles.
    pub start_ns: u64,
    pub end_ns: u64,
    /// The SM's own counter (`mono_clock_cycles`): fine, but only comparable within one CTA.
    pub start_cycles: u64,
    pub end_cycles: u64,
    pub sm: u64,
    pub cta: u64,
    /// `(order << 32) | kind` of the task.
    pub order_kind: u64,
    pub mark: u64,
}

const _: () = assert!(std::mem::size_of::<Record>() == RECORD_WORDS * 8);

impl Record {
    pub fn order(&self) -> u32 {
        (self.order_kind >> 32) as u32
    }

    pub fn kind(&self) -> u32 {
        self.order_kind as u32
    }
}

/// `src` built so that its task loop writes records (`MBX_TRACE=1`).
pub fn traced(src: KernelSource) -> KernelSource {
    src.define("MBX_TRACE", 1)
}

/// The CPU emulator's trace sink: the same records, timed by one host clock. The emulator runs
/// each CTA on its own thread, so a record's SM is its CTA, and its cycles are its nanoseconds.
#[derive(Debug)]
pub struct Recorder {
    offsets: Vec<u32>,
    words: Vec<AtomicU64>,
    origin: Instant,
}

/// When a task started, from [`Recorder::start`].
#[derive(Clone, Copy, Debug)]
pub struct Stamp(u64);

impl Recorder {
    /// A sink for launches of `placement`, all records unwritten.
    pub fn new(placement: &Placement) -> Self {
        let table = placement.table();
        Recorder {
            words: (0..table.tasks.len() * RECORD_WORDS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            offsets: table.offsets,
            origin: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    pub fn start(&self) -> Stamp {
        Stamp(self.now())
    }

    /// Task `index` of CTA `cta`'s list, started at `start`, has finished.
    pub fn finish(&self, cta: u32, index: usize, task: &Task, start: Stamp) {
        let end = self.now();
        let Some(first) = self.offsets.get(cta as usize) else {
            return;
        };
        let record = Record {
            start_ns: start.0,
            end_ns: end,
            start_cycles: start.0,
            end_cycles: end,
            sm: cta as u64,
            cta: cta as u64,
            order_kind: ((task.order as u64) << 32) | task.kind as u64,
            mark: RECORD_MARK,
        };
        let at = (*first as usize + index) * RECORD_WORDS;
        // A position past the table is left unwritten; decoding names the task that lacks its record.
        if let Some(slot) = self.words.get(at..at + RECORD_WORDS) {
            for (w, v) in slot
                .iter()
                .zip(bytemuck::cast::<Record, [u64; RECORD_WORDS]>(record))
            {
                w.store(v, Ordering::Relaxed);
            }
        }
    }

    /// The records, as a device trace buffer would hold them.
    pub fn words(&self) -> Vec<u64> {
        self.words
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect()
    }
}

/// One task's run: where it sat in the table and when it ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub cta: u32,
    /// Its position in the table (its record's index).
    pub position: u32,
    pub order: u32,
    pub kind: u32,
    pub sm: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub start_cycles: u64,
    pub end_cycles: u64,
}

impl Span {
    /// The stage of its kind, when the kind names one.
    pub fn stage(&self) -> Option<Stage> {
        Stage::from_bits(self.kind >> STAGE_SHIFT)
    }

    /// The stage's own kind (the low bits).
    pub fn own_kind(&self) -> u32 {
        self.kind & ((1 << STAGE_SHIFT) - 1)
    }
}

/// The stage name of `kind` and its own kind, e.g. `indexer 3` (a kind of no stage: `kind 0x...`).
pub fn kind_name(kind: u32) -> String {
    match Stage::from_bits(kind >> STAGE_SHIFT) {
        Some(stage) => format!("{} {}", stage.name(), kind & ((1 << STAGE_SHIFT) - 1)),
        None => format!("kind {kind:#x}"),
    }
}

/// A decoded launch: every task's span, in table order (by CTA, then list order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    pub ctas: u32,
    pub spans: Vec<Span>,
}

/// What makes a trace buffer disagree with its table, naming the task and CTA.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error("the table's offsets {offsets:?} do not split its {tasks} tasks into CTA lists")]
    Table { offsets: Vec<u32>, tasks: usize },
    #[error("the trace holds {words} words, not whole records of {RECORD_WORDS}")]
    Ragged { words: usize },
    #[error("the trace holds {records} records; the table has {tasks} tasks")]
    Short { records: usize, tasks: usize },
    #[error("record {position} (task {task} on CTA {cta}) is past the table's {tasks} tasks")]
    PastTable {
        position: usize,
        task: u32,
        cta: u64,
        tasks: usize,
    },
    #[error("task {task} on CTA {cta} (position {position}) has no record: it never finished")]
    Missing { task: u32, cta: u32, position: u32 },
    #[error("record {position} is of task {got_task} (kind {got_kind:#x}) on CTA {got_cta}; the table has task {task} (kind {kind:#x}) on CTA {cta} there")]
    WrongTask {
        position: u32,
        task: u32,
        kind: u32,
        cta: u32,
        got_task: u32,
        got_kind: u32,
        got_cta: u64,
    },
    #[error("task {task} on CTA {cta} ends before it starts ({clock} {start} .. {end})")]
    Backwards {
        task: u32,
        cta: u32,
        clock: &'static str,
        start: u64,
        end: u64,
    },
    #[error("task {task} on CTA {cta} starts ({clock} {start}) before the CTA's previous task {previous} ends ({end})")]
    Overlap {
        task: u32,
        previous: u32,
        cta: u32,
        clock: &'static str,
        start: u64,
        end: u64,
    },
}

/// The CTA of every table position, checking the offsets.
fn ctas_of(table: &TaskTable) -> Result<Vec<u32>, TraceError> {
    let bad = || TraceError::Table {
        offsets: table.offsets.clone(),
        tasks: table.tasks.len(),
    };
    let ok = table.offsets.first() == Some(&0)
        && table.offsets.last() == Some(&(table.tasks.len() as u32))
        && table.offsets.windows(2).all(|w| w[0] <= w[1]);
    if !ok {
        return Err(bad());
    }
    Ok(table
        .offsets
        .windows(2)
        .enumerate()
        .flat_map(|(cta, w)| std::iter::repeat_n(cta as u32, (w[1] - w[0]) as usize))
        .collect())
}

/// Reads `words` (a trace buffer of a launch of `table`) into spans. Every task of the table
/// must have its record, naming that task at that CTA, ending after it starts and starting after
/// the CTA's previous task ended, on both clocks. Unwritten records past the table are ignored.
pub fn decode(table: &TaskTable, words: &[u64]) -> Result<Trace, TraceError> {
    let cta_of = ctas_of(table)?;
    if words.len() % RECORD_WORDS != 0 {
        return Err(TraceError::Ragged { words: words.len() });
    }
    let records: &[Record] = bytemuck::cast_slice(words);
    let tasks = table.tasks.len();
    if records.len() < tasks {
        return Err(TraceError::Short {
            records: records.len(),
            tasks,
        });
    }
    if let Some((i, r)) = records
        .iter()
        .enumerate()
        .skip(tasks)
        .find(|(_, r)| r.mark == RECORD_MARK)
    {
        return Err(TraceError::PastTable {
            position: i,
            task: r.order(),
            cta: r.cta,
            tasks,
        });
    }
    let mut spans: Vec<Span> = Vec::with_capacity(tasks);
    for (i, (task, r)) in table.tasks.iter().zip(records).enumerate() {
        let (position, cta) = (i as u32, cta_of[i]);
        if r.mark != RECORD_MARK {
            return Err(TraceError::Missing {
                task: task.order,
                cta,
                position,
            });
        }
        if r.order() != task.order || r.kind() != task.kind || r.cta != cta as u64 {
            return Err(TraceError::WrongTask {
                position,
                task: task.order,
                kind: task.kind,
                cta,
                got_task: r.order(),
                got_kind: r.kind(),
                got_cta: r.cta,
            });
        }
        let clocks = [
            ("ns", r.start_ns, r.end_ns),
            ("cycles", r.start_cycles, r.end_cycles),
        ];
        for (clock, start, end) in clocks {
            if end < start {
                return Err(TraceError::Backwards {
                    task: task.order,
                    cta,
                    clock,
                    start,
                    end,
                });
            }
        }
        if let Some(prev) = spans.last().filter(|p| p.cta == cta) {
            let pairs = [
                ("ns", r.start_ns, prev.end_ns),
                ("cycles", r.start_cycles, prev.end_cycles),
            ];
            for (clock, start, end) in pairs {
                if start < end {
                    return Err(TraceError::Overlap {
                        task: task.order,
                        previous: prev.order,
                        cta,
                        clock,
                        start,
                        end,
                    });
                }
            }
        }
        spans.push(Span {
            cta,
            position,
            order: task.order,
            kind: task.kind,
            sm: r.sm as u32,
            start_ns: r.start_ns,
            end_ns: r.end_ns,
            start_cycles: r.start_cycles,
            end_cycles: r.end_cycles,
        });
    }
    Ok(Trace {
        ctas: (table.offsets.len() - 1) as u32,
        spans,
    })
}

/// An SM clock rate, for placing spans by cycles.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CycleClock {
    ghz: f64,
}

impl CycleClock {
    /// `None` for a rate of 0.
    pub fn from_khz(khz: u32) -> Option<Self> {
        (khz > 0).then(|| CycleClock {
            ghz: khz as f64 / 1e6,
        })
    }

    pub fn ghz(&self) -> f64 {
        self.ghz
    }
}

/// Which stamps place the spans on the time axis.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TimeBase {
    /// The shared nanosecond clock alone: CTAs line up exactly as stamped, at its resolution.
    Timer,
    /// Each CTA starts at its first task's shared-clock start; from there its SM's cycles at this
    /// rate place its spans (finer than the shared clock; CTAs line up only to its resolution).
    Cycles(CycleClock),
}

impl TimeBase {
    pub fn describe(&self) -> String {
        match self {
            TimeBase::Timer => "shared ns clock".to_string(),
            TimeBase::Cycles(c) => format!(
                "per-CTA start on the shared ns clock, SM cycles at {:.3} GHz after it",
                c.ghz
            ),
        }
    }
}

impl Trace {
    /// Every span's (start, end) in ns after the launch's first start, on `base`.
    pub fn times(&self, base: TimeBase) -> Vec<(f64, f64)> {
        let mut first: Vec<Option<(u64, u64)>> = vec![None; self.ctas as usize];
        for s in &self.spans {
            if let Some(f @ None) = first.get_mut(s.cta as usize) {
                *f = Some((s.start_ns, s.start_cycles));
            }
        }
        let raw: Vec<(f64, f64)> = self
            .spans
            .iter()
            .map(
                |s| match (base, first.get(s.cta as usize).copied().flatten()) {
                    (TimeBase::Cycles(c), Some((ns0, cyc0))) => {
                        let at = |cyc: u64| ns0 as f64 + cyc.saturating_sub(cyc0) as f64 / c.ghz;
                        (at(s.start_cycles), at(s.end_cycles))
                    }
                    _ => (s.start_ns as f64, s.end_ns as f64),
                },
            )
            .collect();
        let origin = raw.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
        raw.iter().map(|&(a, b)| (a - origin, b - origin)).collect()
    }
}

/// A trace placed on a time axis and named, ready to draw: one launch, or several launches in
/// time order ([`Timeline::join`]), each a [`Section`].
#[derive(Clone, Debug)]
pub struct Timeline {
    pub title: String,
    pub base: TimeBase,
    pub ctas: u32,
    pub bars: Vec<Bar>,
    pub sections: Vec<Section>,
}

/// One launch's stretch of a timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct Section {
    pub title: String,
    /// Its first task's start and its last task's end, in microseconds on the timeline's axis.
    pub start_us: f64,
    pub end_us: f64,
}

/// One span on the axis.
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub span: Span,
    /// Microseconds after the timeline's first start.
    pub start_us: f64,
    pub end_us: f64,
    /// What the legend calls its kind.
    pub label: String,
    /// The task itself, in words (its kind's label unless [`Timeline::name_tasks`] named it).
    pub name: String,
    /// The index of its launch's [`Section`].
    pub section: u32,
}

impl Timeline {
    /// `name` gives each kind its legend label ([`kind_name`] when nothing better is known).
    pub fn new(trace: &Trace, base: TimeBase, title: &str, name: &dyn Fn(u32) -> String) -> Self {
        let bars = trace
            .spans
            .iter()
            .zip(trace.times(base))
            .map(|(s, (a, b))| {
                let label = name(s.kind);
                Bar {
                    span: *s,
                    start_us: a / 1e3,
                    end_us: b / 1e3,
                    name: label.clone(),
                    label,
                    section: 0,
                }
            })
            .collect();
        let mut t = Timeline {
            title: title.to_string(),
            base,
            ctas: trace.ctas,
            bars,
            sections: Vec::new(),
        };
        t.sections = vec![Section {
            title: title.to_string(),
            start_us: 0.0,
            end_us: t.end_us(),
        }];
        t
    }

    /// Each bar named by `name` of its span (say which matrix, row or slice the task works on).
    pub fn name_tasks(mut self, name: &dyn Fn(&Span) -> String) -> Self {
        for b in &mut self.bars {
            b.name = name(&b.span);
        }
        self
    }

    /// `parts` (each one launch's timeline and where its first start falls, in microseconds
    /// after the first part's) on one axis, one section each, under `title`.
    pub fn join(title: &str, parts: Vec<(Timeline, f64)>) -> Timeline {
        let base = parts.first().map_or(TimeBase::Timer, |p| p.0.base);
        let mut joined = Timeline {
            title: title.to_string(),
            base,
            ctas: 0,
            bars: Vec::new(),
            sections: Vec::new(),
        };
        for (i, (part, offset)) in parts.into_iter().enumerate() {
            joined.ctas = joined.ctas.max(part.ctas);
            joined.sections.push(Section {
                title: part.title.clone(),
                start_us: offset,
                end_us: offset + part.end_us(),
            });
            joined.bars.extend(part.bars.into_iter().map(|b| Bar {
                start_us: b.start_us + offset,
                end_us: b.end_us + offset,
                section: i as u32,
                ..b
            }));
        }
        joined
    }

    /// The last end, in microseconds.
    pub fn end_us(&self) -> f64 {
        self.bars.iter().map(|b| b.end_us).fold(0.0, f64::max)
    }

    /// The distinct kinds in the order of their stage, then own kind.
    pub fn kinds(&self) -> Vec<(u32, String)> {
        let mut kinds: Vec<(u32, String)> = self
            .bars
            .iter()
            .map(|b| (b.span.kind, b.label.clone()))
            .collect();
        kinds.sort_by_key(|k| k.0);
        kinds.dedup_by_key(|k| k.0);
        kinds
    }
}

#[cfg(test)]
mod tests;
