//! The trace of a whole step: every launch's task records decoded and checked against its table,
//! the launches placed in time order on one axis (`mailbox::trace::Timeline::join`), drawn as one
//! Chrome / Perfetto JSON and SVG pictures, and a summary of where the time goes per launch kind.

use std::path::{Path, PathBuf};

use mailbox::trace::{chrome, decode, svg, Bar, TimeBase, Timeline, Trace};
use mailbox::Stage;

use super::names::kind_label;
use crate::step::graph::TracedLaunch;

/// One launch of a traced step, decoded.
#[derive(Clone, Debug)]
pub struct DecodedLaunch {
    pub name: String,
    pub kind: String,
    pub trace: Trace,
    /// Each task in words, by table position.
    pub task_names: Vec<String>,
}

impl DecodedLaunch {
    /// Its first task's start and last task's end on the shared ns clock.
    fn bounds(&self) -> (u64, u64) {
        let first = self.trace.spans.iter().map(|s| s.start_ns).min();
        let last = self.trace.spans.iter().map(|s| s.end_ns).max();
        (first.unwrap_or(0), last.unwrap_or(0))
    }
}

/// Decodes every launch's records (`mailbox::trace::decode`: every task of its table has its
/// record, times monotone within each CTA) and checks that each launch's tasks all start after the
/// previous launch's last task ended, on the shared clock. Errors name the launch.
pub fn decode_step(launches: &[TracedLaunch]) -> Result<Vec<DecodedLaunch>, String> {
    let mut decoded: Vec<DecodedLaunch> = Vec::with_capacity(launches.len());
    for l in launches {
        let r = &l.records;
        let trace = decode(&r.table, &r.words).map_err(|e| format!("{}: {e}", l.name))?;
        if trace.spans.is_empty() {
            return Err(format!("{}: the launch has no tasks", l.name));
        }
        if r.task_names.len() != r.table.tasks.len() {
            return Err(format!(
                "{}: {} task names for {} tasks",
                l.name,
                r.task_names.len(),
                r.table.tasks.len()
            ));
        }
        let launch = DecodedLaunch {
            name: l.name.clone(),
            kind: l.kind.clone(),
            trace,
            task_names: r.task_names.clone(),
        };
        if let Some(prev) = decoded.last() {
            let (end, (start, _)) = (prev.bounds().1, launch.bounds());
            if start < end {
                return Err(format!(
                    "{}: its first task starts at {start} ns, before {}'s last task ends ({end} ns)",
                    launch.name, prev.name
                ));
            }
        }
        decoded.push(launch);
    }
    Ok(decoded)
}

/// The launches on one axis (each placed at its first start on the shared clock), tasks named.
pub fn step_timeline(launches: &[DecodedLaunch], base: TimeBase, title: &str) -> Timeline {
    let origin = launches.iter().map(|l| l.bounds().0).min().unwrap_or(0);
    let parts = launches
        .iter()
        .map(|l| {
            let t = Timeline::new(&l.trace, base, &l.name, &kind_label).name_tasks(&|s| {
                l.task_names
                    .get(s.position as usize)
                    .cloned()
                    .unwrap_or_else(|| kind_label(s.kind))
            });
            (t, (l.bounds().0 - origin) as f64 / 1e3)
        })
        .collect();
    Timeline::join(title, parts)
}

/// The first launch of each kind laid end to end, each a fiftieth of its span after the last (not
/// where they fall in the step): a picture small enough to read every launch kind's tasks.
pub fn kinds_timeline(launches: &[DecodedLaunch], base: TimeBase, title: &str) -> Timeline {
    let mut seen: Vec<&str> = Vec::new();
    let mut parts = Vec::new();
    let mut at = 0.0;
    for l in launches {
        if seen.contains(&l.kind.as_str()) {
            continue;
        }
        seen.push(&l.kind);
        let one = step_timeline(std::slice::from_ref(l), base, &l.name);
        let width = one.end_us();
        parts.push((one, at));
        at += width * 1.02;
    }
    Timeline::join(title, parts)
}

/// Where one launch kind's time goes.
#[derive(Clone, Debug, PartialEq)]
pub struct KindShare {
    pub kind: String,
    pub launches: u32,
    /// Summed over its launches: first task start to last task end.
    pub us: f64,
    /// CTA-time (CTAs x launch time) each stage's tasks take, over the whole CTA-time.
    pub stages: Vec<(Stage, f64)>,
    /// CTA-time before a CTA's first task (the launch's ramp), between its tasks, and after its
    /// last task until the launch's last task ends (imbalance), each over the whole CTA-time.
    pub idle_ramp: f64,
    pub idle_between: f64,
    pub idle_tail: f64,
}

impl KindShare {
    pub fn idle(&self) -> f64 {
        self.idle_ramp + self.idle_between + self.idle_tail
    }
}

/// The step's time by launch kind (in the order kinds first appear) from its timeline.
pub fn shares(launches: &[DecodedLaunch], timeline: &Timeline) -> Vec<KindShare> {
    let mut out: Vec<KindShare> = Vec::new();
    let mut cta_time: Vec<f64> = Vec::new();
    for (i, l) in launches.iter().enumerate() {
        let Some(section) = timeline.sections.get(i) else {
            continue;
        };
        let bars: Vec<&Bar> = timeline
            .bars
            .iter()
            .filter(|b| b.section as usize == i)
            .collect();
        let (start, end) = (section.start_us, section.end_us);
        let at = match out.iter().position(|k| k.kind == l.kind) {
            Some(at) => at,
            None => {
                out.push(KindShare {
                    kind: l.kind.clone(),
                    launches: 0,
                    us: 0.0,
                    stages: Vec::new(),
                    idle_ramp: 0.0,
                    idle_between: 0.0,
                    idle_tail: 0.0,
                });
                cta_time.push(0.0);
                out.len() - 1
            }
        };
        let k = &mut out[at];
        k.launches += 1;
        k.us += end - start;
        cta_time[at] += f64::from(l.trace.ctas) * (end - start);
        for cta in 0..l.trace.ctas {
            let mine: Vec<&&Bar> = bars.iter().filter(|b| b.span.cta == cta).collect();
            let busy: f64 = mine.iter().map(|b| b.end_us - b.start_us).sum();
            let first = mine
                .iter()
                .map(|b| b.start_us)
                .fold(f64::INFINITY, f64::min);
            let last = mine
                .iter()
                .map(|b| b.end_us)
                .fold(f64::NEG_INFINITY, f64::max);
            if mine.is_empty() {
                k.idle_tail += end - start;
                continue;
            }
            k.idle_ramp += first - start;
            k.idle_between += (last - first - busy).max(0.0);
            k.idle_tail += end - last;
            for b in mine {
                let Some(stage) = b.span.stage() else {
                    continue;
                };
                let d = b.end_us - b.start_us;
                match k.stages.iter_mut().find(|s| s.0 == stage) {
                    Some(s) => s.1 += d,
                    None => k.stages.push((stage, d)),
                }
            }
        }
    }
    for (k, total) in out.iter_mut().zip(cta_time) {
        let total = total.max(1e-9);
        for s in &mut k.stages {
            s.1 /= total;
        }
        k.stages.sort_by(|a, b| b.1.total_cmp(&a.1));
        k.idle_ramp /= total;
        k.idle_between /= total;
        k.idle_tail /= total;
    }
    out
}

/// The summary's lines: the step's span and gaps, then each launch kind.
pub fn summary(launches: &[DecodedLaunch], timeline: &Timeline) -> String {
    let s = &timeline.sections;
    let inside: f64 = s.iter().map(|x| x.end_us - x.start_us).sum();
    let gaps: f64 = s.windows(2).map(|w| w[1].start_us - w[0].end_us).sum();
    let tasks: usize = launches.iter().map(|l| l.trace.spans.len()).sum();
    let mut text = format!(
        "step: {} launches, {tasks} tasks, {:.1} us from the first task to the last: {inside:.1} us \
         in launches, {gaps:.1} us between them ({:.1} us a gap)\n",
        launches.len(),
        timeline.end_us(),
        gaps / (s.len().max(2) - 1) as f64
    );
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    for k in shares(launches, timeline) {
        let stages: Vec<String> = k
            .stages
            .iter()
            .map(|(st, x)| format!("{} {}", st.name(), pct(*x)))
            .collect();
        text.push_str(&format!(
            "{}: {} launch(es), {:.1} us each, {:.1} us in all; tasks: {}; idle {} (ramp {}, \
             between tasks {}, tail {})\n",
            k.kind,
            k.launches,
            k.us / f64::from(k.launches.max(1)),
            k.us,
            stages.join(", "),
            pct(k.idle()),
            pct(k.idle_ramp),
            pct(k.idle_between),
            pct(k.idle_tail)
        ));
    }
    text
}

/// Where a traced step's drawings went.
#[derive(Clone, Debug)]
pub struct StepFiles {
    /// Every launch: the Chrome / Perfetto JSON and the picture.
    pub json: PathBuf,
    pub svg: PathBuf,
    /// The first launch of each kind, end to end.
    pub kinds_svg: PathBuf,
}

/// Writes `out/step.json`, `out/step.svg` and `out/kinds.svg`.
pub fn write_step(out: &Path, step: &Timeline, kinds: &Timeline) -> Result<StepFiles, String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let files = StepFiles {
        json: out.join("step.json"),
        svg: out.join("step.svg"),
        kinds_svg: out.join("kinds.svg"),
    };
    for (path, text) in [
        (&files.json, chrome::json(step)),
        (&files.svg, svg::svg(step)),
        (&files.kinds_svg, svg::svg(kinds)),
    ] {
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(files)
}
