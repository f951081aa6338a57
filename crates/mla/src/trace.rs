//! The marks of a trace build (`MLA_TRACE=1`, [`crate::gpu::traced_source`]), as
//! `kernels/mla_attn.h` (`mla_trace`) writes them: [`WORDS_PER_TASK`] words a task, by the task's
//! global order. Each task's first thread stamps the global timer (ns, comparable across CTAs,
//! coarse: about 1 us a tick on the H200) at its start and end, and its SM's cycle counter at the
//! end of each phase (exact, within the task). [`Timeline`] turns a launch's marks into a table.

use crate::layout::MlaKind;

/// Words a task (`MLA_TRACE_WORDS`).
pub const WORDS_PER_TASK: usize = 16;
const START_NS: usize = 0;
const END_NS: usize = 1;
const WHO: usize = 2;
const CYCLES: usize = 3;
const PHASES: usize = 4;

/// The phases of each kind, in the order they run (`MLA_PH_*`), by their index among the marks.
pub fn phases(kind: MlaKind) -> &'static [(usize, &'static str)] {
    match kind {
        MlaKind::CacheWrite => &[(0, "inputs seen"), (2, "records written"), (8, "release")],
        MlaKind::Split => &[
            (0, "slot boxes seen"),
            (1, "distinct slots"),
            (2, "cache write seen"),
            (3, "keys gathered"),
            (4, "queries loaded"),
            (5, "scores"),
            (6, "softmax"),
            (7, "values, partial written"),
            (8, "release"),
        ],
        MlaKind::Combine => &[
            (0, "splits seen"),
            (1, "weights"),
            (2, "output written"),
            (8, "release"),
        ],
        // The attention half's row tasks stamp no phases (the launch's task trace times them).
        MlaKind::Norm | MlaKind::RopeQ | MlaKind::Slots => &[],
    }
}

/// One task's marks.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskMarks {
    pub order: u32,
    pub kind: MlaKind,
    pub sm: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// SM cycles of the whole task, and of each phase (`MLA_PH_*` index).
    pub cycles: u64,
    pub phases: [u64; WORDS_PER_TASK - PHASES],
}

/// A launch's tasks that left marks.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    pub tasks: Vec<TaskMarks>,
}

fn kind_of(own: u64) -> Option<MlaKind> {
    [MlaKind::CacheWrite, MlaKind::Split, MlaKind::Combine]
        .into_iter()
        .find(|k| *k as u64 == own)
}

impl Timeline {
    /// Reads a trace buffer (tasks without marks, such as orders of other stages, are skipped).
    pub fn parse(words: &[u64]) -> Timeline {
        let tasks = words
            .chunks_exact(WORDS_PER_TASK)
            .enumerate()
            .filter(|(_, w)| w[START_NS] != 0 && w[END_NS] != 0)
            .filter_map(|(order, w)| {
                Some(TaskMarks {
                    order: order as u32,
                    kind: kind_of(w[WHO] >> 32)?,
                    sm: w[WHO] as u32,
                    start_ns: w[START_NS],
                    end_ns: w[END_NS],
                    cycles: w[CYCLES],
                    phases: w[PHASES..].try_into().expect("a task's phase words"),
                })
            })
            .collect();
        Timeline { tasks }
    }

    /// The global timer from the first task's start to the last one's end.
    pub fn span_ns(&self) -> u64 {
        let start = self.tasks.iter().map(|t| t.start_ns).min().unwrap_or(0);
        let end = self.tasks.iter().map(|t| t.end_ns).max().unwrap_or(0);
        end.saturating_sub(start)
    }

    /// A markdown table: for each kind, each phase's median and largest cycles over its tasks
    /// (and in us at `clock_khz`), then the whole task's, and when the kind's tasks start and end
    /// on the global timer, from the launch's first start.
    pub fn table(&self, clock_khz: u32) -> String {
        let us = |cycles: u64| cycles as f64 / f64::from(clock_khz) * 1e3;
        let t0 = self.tasks.iter().map(|t| t.start_ns).min().unwrap_or(0);
        let mut out = String::from(
            "| task | phase | median cycles | max cycles | median us | max us |\n|---|---|---|---|---|---|\n",
        );
        for kind in [MlaKind::CacheWrite, MlaKind::Split, MlaKind::Combine] {
            let tasks: Vec<&TaskMarks> = self.tasks.iter().filter(|t| t.kind == kind).collect();
            if tasks.is_empty() {
                continue;
            }
            let mut row = |name: &str, mut v: Vec<u64>| {
                v.sort_unstable();
                let (med, max) = (v[v.len() / 2], v[v.len() - 1]);
                out += &format!(
                    "| {kind:?} x{} | {name} | {med} | {max} | {:.2} | {:.2} |\n",
                    tasks.len(),
                    us(med),
                    us(max)
                );
            };
            for &(i, name) in phases(kind) {
                row(name, tasks.iter().map(|t| t.phases[i]).collect());
            }
            row("whole task", tasks.iter().map(|t| t.cycles).collect());
            let starts = tasks.iter().map(|t| t.start_ns - t0);
            let ends = tasks.iter().map(|t| t.end_ns - t0);
            out += &format!(
                "| {kind:?} x{} | global timer from the launch's first start (ns) | start {}..{} | end {}..{} | | |\n",
                tasks.len(),
                starts.clone().min().unwrap_or(0),
                starts.max().unwrap_or(0),
                ends.clone().min().unwrap_or(0),
                ends.max().unwrap_or(0),
            );
        }
        out
    }
}
