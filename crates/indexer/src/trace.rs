//! The phase marks of a trace build's wgmma scorer ([`crate::gpu::KernelConfig::trace`]), as
//! `kernels/idx_score_ring.h` (`idx_mark`) writes them: [`WORDS_PER_WARPGROUP`] words per (run,
//! warpgroup), run-major. Each warpgroup's first thread stamps its SM's cycle counter when a phase
//! ends, which compares only within a CTA, and the global timer (ns) at its start and end, which
//! compares across CTAs and launches. [`phases`] turns a launch's marks into percentiles per phase.

/// Words per warpgroup (`IDX_TRACE_WORDS`).
pub const WORDS_PER_WARPGROUP: usize = 64;
/// Warpgroups per run (`IDX_BATCH_PAGES`).
pub const WARPGROUPS: usize = 2;
/// Pages per warpgroup with marks (`IDX_MARK_MAX_PAGES`).
pub const MARKED_PAGES: usize = 14;

const START_NS: usize = 0;
const SM: usize = 1;
const START: usize = 2;
const TASK: usize = 3;
const QUERIES: usize = 4;
const PAGES: usize = 6;
const MARKS_A_PAGE: usize = 4;
const END: usize = 62;
const END_NS: usize = 63;

/// Words a trace buffer needs for `runs` runs.
pub fn words(runs: u32) -> usize {
    runs as usize * WARPGROUPS * WORDS_PER_WARPGROUP
}

/// One warpgroup's marks: cycles since its run's start for each phase, in the order they end.
#[derive(Clone, Debug, PartialEq)]
pub struct Warpgroup {
    /// The run and its warpgroup.
    pub run: u32,
    pub warpgroup: u32,
    pub sm: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The task's group loaded, the queries in the B tile.
    pub task: u64,
    pub queries: u64,
    /// Per page of the warpgroup (up to [`MARKED_PAGES`]).
    pub pages: Vec<Page>,
    pub end: u64,
}

/// A page's marks (`IDX_MARK_WAITING` ..), cycles since the run's start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Page {
    /// The warpgroup starts waiting for the page's bytes.
    pub waiting: u64,
    /// They have landed in LDS.
    pub landed: u64,
    /// The page's MMAs are issued.
    pub issued: u64,
    /// Its scores are written.
    pub scored: u64,
}

/// The warpgroups of a launch's `runs` runs that left marks (a warpgroup with no pages leaves
/// only its start and end).
pub fn parse(words: &[u64], runs: u32) -> Vec<Warpgroup> {
    words
        .chunks_exact(WORDS_PER_WARPGROUP)
        .take(runs as usize * WARPGROUPS)
        .enumerate()
        .filter(|(_, w)| w[START_NS] != 0 && w[END_NS] != 0)
        .map(|(i, w)| {
            let since = |slot: usize| w[slot].saturating_sub(w[START]);
            let pages = (0..MARKED_PAGES)
                .map(|j| &w[PAGES + MARKS_A_PAGE * j..][..MARKS_A_PAGE])
                .take_while(|m| m.iter().all(|&t| t != 0))
                .map(|m| Page {
                    waiting: m[0] - w[START],
                    landed: m[1] - w[START],
                    issued: m[2] - w[START],
                    scored: m[3] - w[START],
                })
                .collect();
            Warpgroup {
                run: (i / WARPGROUPS) as u32,
                warpgroup: (i % WARPGROUPS) as u32,
                sm: w[SM] as u32,
                start_ns: w[START_NS],
                end_ns: w[END_NS],
                task: since(TASK),
                queries: since(QUERIES),
                pages,
                end: since(END),
            }
        })
        .collect()
}

/// One line a warpgroup, for plotting or joining against the SM ids: the run, the warpgroup, the
/// SM, the global timer at the start and the end (ns), then the phases in us since the run's start
/// at `mhz` (the task, the queries, the end) and the pages marked.
pub fn csv(marks: &[Warpgroup], mhz: f64) -> String {
    let us = |cycles: u64| cycles as f64 / mhz;
    let mut text =
        String::from("run,warpgroup,sm,start_ns,end_ns,task_us,queries_us,end_us,pages\n");
    for m in marks {
        text += &format!(
            "{},{},{},{},{},{:.3},{:.3},{:.3},{}\n",
            m.run,
            m.warpgroup,
            m.sm,
            m.start_ns,
            m.end_ns,
            us(m.task),
            us(m.queries),
            us(m.end),
            m.pages.len()
        );
    }
    text
}

/// The p10, p50 and p90 of `values` (nearest rank), or `None` when there are none.
pub fn percentiles(values: &[f64]) -> Option<[f64; 3]> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Some([at(0.1), at(0.5), at(0.9)])
}

/// Each warpgroup's SM clock in MHz while it ran: its cycles from start to end over the global
/// timer's ns between the same marks. The device's nominal clock is its highest boost; under load
/// the SM may run slower, and phases in us are only right at the clock the SM had.
pub fn clock_mhz(marks: &[Warpgroup]) -> Vec<f64> {
    marks
        .iter()
        .filter(|m| m.end_ns > m.start_ns)
        .map(|m| m.end as f64 * 1e3 / (m.end_ns - m.start_ns) as f64)
        .collect()
}

/// Per phase, p10 / p50 / p90 over the warpgroups in us since their run's start (`mhz`: the SM
/// clock), then how long the steps of a page take (over every page but each warpgroup's first,
/// whose wait holds the run's start), then the spread of the CTAs' starts and the launch's span
/// (first start to last end) from the global timer.
pub fn phases(marks: &[Warpgroup], mhz: f64) -> Vec<(String, [f64; 3])> {
    let us = |cycles: u64| cycles as f64 / mhz;
    let mut out = Vec::new();
    let mut add = |name: String, values: Vec<f64>| {
        if let Some(p) = percentiles(&values) {
            out.push((name, p));
        }
    };
    add("task".into(), marks.iter().map(|m| us(m.task)).collect());
    add(
        "queries".into(),
        marks.iter().map(|m| us(m.queries)).collect(),
    );
    add(
        "page 0 landed".into(),
        marks
            .iter()
            .filter_map(|m| m.pages.first())
            .map(|p| us(p.landed))
            .collect(),
    );
    let most = marks.iter().map(|m| m.pages.len()).max().unwrap_or(0);
    for j in 0..most {
        let scored = marks
            .iter()
            .filter_map(|m| m.pages.get(j))
            .map(|p| us(p.scored));
        add(format!("page {j} scored"), scored.collect());
    }
    add("end".into(), marks.iter().map(|m| us(m.end)).collect());
    let later = || marks.iter().flat_map(|m| m.pages.iter().skip(1));
    let step = |f: fn(&Page) -> u64| later().map(|p| us(f(p))).collect::<Vec<_>>();
    add("a page: waits".into(), step(|p| p.landed - p.waiting));
    add("  landed..issued".into(), step(|p| p.issued - p.landed));
    add("  issued..scored".into(), step(|p| p.scored - p.issued));
    let gaps = marks
        .iter()
        .flat_map(|m| m.pages.windows(2).map(|w| us(w[1].waiting - w[0].scored)))
        .collect();
    add("  scored..next".into(), gaps);
    if let Some(first) = marks.iter().map(|m| m.start_ns).min() {
        let ns = |t: u64| (t - first) as f64 / 1e3;
        add(
            "start (launch)".into(),
            marks.iter().map(|m| ns(m.start_ns)).collect(),
        );
        add(
            "end (launch)".into(),
            marks.iter().map(|m| ns(m.end_ns)).collect(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Marks as the kernel writes them: warpgroup g starts at 1000 g cycles and g * 100 ns.
    fn written(runs: u32, pages: usize) -> Vec<u64> {
        let mut w = vec![0u64; words(runs)];
        for (g, m) in w.chunks_exact_mut(WORDS_PER_WARPGROUP).enumerate() {
            let start = 1000 * g as u64 + 5;
            m[START_NS] = 100 * g as u64 + 7;
            m[SM] = g as u64 / 2;
            m[START] = start;
            m[TASK] = start + 10;
            m[QUERIES] = start + 20;
            for j in 0..pages {
                for (k, at) in [40, 43, 46, 50].into_iter().enumerate() {
                    m[PAGES + MARKS_A_PAGE * j + k] = start + at + 20 * j as u64;
                }
            }
            m[END] = start + 500;
            m[END_NS] = 100 * g as u64 + 907;
        }
        w
    }

    #[test]
    fn marks_parse_relative_to_each_ctas_start() {
        let marks = parse(&written(3, 2), 3);
        assert_eq!(marks.len(), 6);
        assert_eq!(
            (marks[4].run, marks[4].warpgroup, marks[5].warpgroup),
            (2, 0, 1)
        );
        assert_eq!(marks[4].sm, 2);
        assert_eq!((marks[4].task, marks[4].queries), (10, 20));
        let page = |t: u64| Page {
            waiting: t,
            landed: t + 3,
            issued: t + 6,
            scored: t + 10,
        };
        assert_eq!(marks[4].pages, vec![page(40), page(60)]);
        assert_eq!(marks[4].end, 500);
        assert_eq!((marks[4].start_ns, marks[4].end_ns), (407, 1307));
    }

    #[test]
    fn unmarked_warpgroups_and_pages_are_left_out() {
        let mut w = written(2, 3);
        w[WORDS_PER_WARPGROUP + START_NS] = 0; // warpgroup 1 never ran
        w[PAGES + MARKS_A_PAGE * 2 + 1] = 0; // warpgroup 0's page 2 did not land
        let marks = parse(&w, 2);
        assert_eq!(marks.len(), 3);
        assert_eq!((marks[1].run, marks[1].warpgroup), (1, 0));
        assert_eq!(marks[0].pages.len(), 2);
        // Marks past the plan's runs are not read.
        assert_eq!(parse(&w, 1).len(), 1);
    }

    #[test]
    fn phases_report_percentiles_in_us() {
        let marks = parse(&written(5, 2), 5);
        let table = phases(&marks, 10.0);
        let row = |name: &str| table.iter().find(|(n, _)| n == name).unwrap().1;
        assert_eq!(row("task"), [1.0, 1.0, 1.0]);
        assert_eq!(row("page 0 landed"), [4.3, 4.3, 4.3]);
        assert_eq!(row("page 0 scored"), [5.0, 5.0, 5.0]);
        assert_eq!(row("end"), [50.0, 50.0, 50.0]);
        // Page 1 of each warpgroup: waits 3 cycles, issues 3 later, is scored 4 after; page 0's
        // scores to page 1's wait: 10.
        assert_eq!(row("a page: waits"), [0.3; 3]);
        assert_eq!(row("  landed..issued"), [0.3; 3]);
        assert_eq!(row("  issued..scored"), [0.4; 3]);
        assert_eq!(row("  scored..next"), [1.0; 3]);
        // Ten warpgroups starting 0.1 us apart: p10 0.1, p50 0.5 (rank 4.5 rounds to 5), p90 0.8.
        let starts = row("start (launch)");
        assert!(
            (starts[0] - 0.1).abs() < 1e-9 && (starts[2] - 0.8).abs() < 1e-9,
            "{starts:?}"
        );
        assert!(table.iter().all(|(n, _)| n != "page 2 scored"));
    }

    #[test]
    fn the_clock_is_cycles_over_elapsed_time() {
        let mut w = written(2, 1);
        // Warpgroup 1 ran 500 cycles in 250 ns: 2 GHz; warpgroup 0 in 900 ns.
        w[WORDS_PER_WARPGROUP + END_NS] = w[WORDS_PER_WARPGROUP + START_NS] + 250;
        let mhz = clock_mhz(&parse(&w, 1));
        assert_eq!(mhz.len(), 2);
        assert!((mhz[0] - 500.0 / 0.9).abs() < 1e-9, "{mhz:?}");
        assert!((mhz[1] - 2000.0).abs() < 1e-9, "{mhz:?}");
    }

    #[test]
    fn csv_has_a_line_a_warpgroup() {
        let text = csv(&parse(&written(1, 2), 1), 10.0);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[2], "0,1,0,107,1007,1.000,2.000,50.000,2");
    }

    #[test]
    fn percentiles_of_nothing_are_none() {
        assert_eq!(percentiles(&[]), None);
        assert_eq!(percentiles(&[3.0]), Some([3.0; 3]));
    }
}
