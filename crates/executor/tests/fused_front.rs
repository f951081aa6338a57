//! The front half's fused launch on the CPU: its task graph placed by the rule at tiny and
//! production shapes, run in the mailbox emulator with the tasks' CPU forms (scores from
//! `indexer::reference`, the lists from `select::reference`), and the selected slots equal to the
//! reference radix select of the reference scores, and every list reader (the attention tasks'
//! stand-in) running only after all of its row's select tasks. Negative controls: a select task
//! that misses a run it reads is refused by the hand-off check and, run anyway, reads unwritten
//! scores; a reader that skips its row's list box, or a row's first slice that skips its gang's
//! boxes, lets a reader run before a slow select task finished; bad batches are refused before
//! anything runs. The fused kernel builds for both targets.

use device::optional_compiler;
use executor::fused::front::{
    front_source, FrontBuild, FrontError, FrontGraph, FrontRequest, READER_KIND,
};
use executor::fused::{CtaShape, ENTRY};
use indexer::gpu::KernelConfig;
use indexer::layout::RunDesc;
use indexer::reference::{key_score, IndexerDims, RowQuery, ScaledVector};
use mailbox::emulator::{self, EmuConfig, Scratch, TaskFailed};
use mailbox::layout::BoxRange;
use mailbox::{Placement, Stage, Task};
use model::paging::PAGE_TOKENS;
use model::ModelConfig;
use select::layout::TopK;
use select::reference::{select_rows, RowPages, Rows};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// A score no run wrote: what the score buffer holds before the launch (a NaN with a payload).
const UNWRITTEN: u32 = 0x7fc0_dead;

fn lcg(state: &mut u64) -> u32 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*state >> 33) as u32
}

/// A small value grid, so scores tie now and then.
fn values(n: usize, state: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| (lcg(state) % 17) as f32 / 8.0 - 1.0)
        .collect()
}

/// A model config with GLM-5's indexer structure at a size the CPU scores quickly.
fn tiny_config(k: usize) -> ModelConfig {
    let mut cfg = ModelConfig::preset("glm-5").unwrap();
    cfg.index_n_heads = 4;
    cfg.index_head_dim = 64;
    cfg.qk_rope_head_dim = 64;
    cfg.index_topk = k;
    cfg
}

/// Pages for each request, shuffled across a cache of `cache_pages` (distinct ids).
fn page_tables(lens: &[u32], seed: u64) -> (Vec<Vec<u32>>, u32) {
    let counts: Vec<u32> = lens.iter().map(|&l| l.div_ceil(PAGE_TOKENS) + 1).collect();
    let total: u32 = counts.iter().sum();
    let mut ids: Vec<u32> = (0..total).collect();
    let mut state = seed;
    for i in (1..ids.len()).rev() {
        ids.swap(i, lcg(&mut state) as usize % (i + 1));
    }
    let mut at = 0;
    let tables = counts
        .iter()
        .map(|&c| {
            let t = ids[at..at + c as usize].to_vec();
            at += c as usize;
            t
        })
        .collect();
    (tables, total)
}

/// A batch of requests (context, rows) with its pages.
fn batch(shape: &[(u32, u32)], seed: u64) -> (Vec<FrontRequest>, u32) {
    let lens: Vec<u32> = shape.iter().map(|&(c, r)| c + r).collect();
    let (tables, cache_pages) = page_tables(&lens, seed);
    let requests = shape
        .iter()
        .zip(tables)
        .map(|(&(context, rows), pages)| FrontRequest {
            context,
            rows,
            pages,
        })
        .collect();
    (requests, cache_pages)
}

/// The step's inputs in their CPU form: every request's keys (cached and new), every row's query.
struct Inputs {
    dims: IndexerDims,
    keys: Vec<Vec<ScaledVector>>,
    queries: Vec<RowQuery>,
}

impl Inputs {
    fn new(cfg: &ModelConfig, requests: &[FrontRequest], seed: u64) -> Inputs {
        let dims = IndexerDims::new(cfg).unwrap();
        let mut state = seed;
        let keys = requests
            .iter()
            .map(|r| {
                (0..r.context + r.rows)
                    .map(|_| ScaledVector {
                        values: values(dims.head_dim, &mut state),
                        scale: 1.0 + (lcg(&mut state) % 4) as f32 / 4.0,
                    })
                    .collect()
            })
            .collect();
        let rows: u32 = requests.iter().map(|r| r.rows).sum();
        let queries = (0..rows)
            .map(|_| RowQuery {
                q: values(dims.heads * dims.head_dim, &mut state),
                weights: values(dims.heads, &mut state),
            })
            .collect();
        Inputs {
            dims,
            keys,
            queries,
        }
    }

    /// Row `row`'s reference score of position `t` (-inf past its position).
    fn score(&self, graph: &FrontGraph, row: u32, t: u32) -> f32 {
        let r = graph.plan.rows[row as usize];
        if t > r.position {
            return f32::NEG_INFINITY;
        }
        let key = &self.keys[r.request as usize][t as usize];
        key_score(
            &self.dims,
            &self.queries[row as usize],
            &key.values,
            key.scale,
        ) as f32
    }
}

/// The tasks' CPU forms over the emulator's boxes. Key and query tasks publish their row (the
/// values are the reference's); a score task checks that the queries and new keys it reads were
/// published, writes its runs' scores, then its boxes go out; a select task copies the scores it
/// reads and fails on any that no run wrote yet, then marks its part of the row's list written; a
/// list reader fails unless every select task of its row has. The lists are the reference select
/// of what the select tasks read.
struct CpuFront<'a> {
    graph: &'a FrontGraph,
    inputs: &'a Inputs,
    key_ready: Vec<AtomicBool>,
    query_ready: Vec<AtomicBool>,
    scores: Mutex<Vec<u32>>,
    seen: Mutex<Vec<f32>>,
    /// (row, slice) of every select task that has written its part of the row's list.
    written: Mutex<HashSet<(u32, u32)>>,
    /// Select tasks of each row.
    parts: Vec<u32>,
    slow: Slow,
}

/// A task that takes a while (the hand-off controls).
#[derive(Clone, Copy, Debug, Default)]
struct Slow {
    run: Option<u32>,
    /// (row, slice) of a select task.
    select: Option<(u32, u32)>,
}

impl<'a> CpuFront<'a> {
    fn new(graph: &'a FrontGraph, inputs: &'a Inputs, slow: Slow) -> Self {
        let rows = graph.plan.rows.len();
        let cells = rows * graph.plan.stride as usize;
        let mut parts = vec![0; rows];
        for (_, t) in graph.placement.placement().tasks() {
            if t.stage_bits() == Stage::Select as u32 {
                parts[t.args[0] as usize] += 1;
            }
        }
        CpuFront {
            graph,
            inputs,
            key_ready: (0..rows).map(|_| AtomicBool::new(false)).collect(),
            query_ready: (0..rows).map(|_| AtomicBool::new(false)).collect(),
            scores: Mutex::new(vec![UNWRITTEN; cells]),
            seen: Mutex::new(vec![f32::NAN; cells]),
            written: Mutex::new(HashSet::new()),
            parts,
            slow,
        }
    }

    /// A select task's CPU form: the scores it reads, then its part of the list marked written.
    /// Once a task: a gang member's share and run both call it.
    fn select(&self, task: &Task) -> Result<(), TaskFailed> {
        let row = task.args[0];
        let slice = task.args[2] & 0xffff;
        if self.written.lock().unwrap().contains(&(row, slice)) {
            return Ok(());
        }
        if self.slow.select == Some((row, slice)) {
            std::thread::sleep(Duration::from_millis(300));
        }
        let stride = self.graph.plan.stride as usize;
        let range = FrontGraph::select_range(task);
        let scores = self.scores.lock().unwrap();
        let mut seen = self.seen.lock().unwrap();
        for t in range {
            let cell = row as usize * stride + t as usize;
            if scores[cell] == UNWRITTEN {
                return Err(TaskFailed(format!(
                    "select reads row {row} at {t} before its run wrote it"
                )));
            }
            seen[cell] = f32::from_bits(scores[cell]);
        }
        self.written.lock().unwrap().insert((row, slice));
        Ok(())
    }

    fn score_run(&self, index: u32) -> Result<Vec<(usize, f32)>, TaskFailed> {
        let plan = &self.graph.plan;
        let run: RunDesc = plan.runs[index as usize];
        let group = plan.groups[run.group as usize];
        let request = plan.requests[group.request as usize];
        let last_of_group = plan
            .runs
            .get(index as usize + 1)
            .is_none_or(|next| next.group != run.group);
        let end_token = if last_of_group {
            plan.stride
        } else {
            (run.first_page + run.n_pages) * PAGE_TOKENS
        };
        let mut out = Vec::new();
        for row in group.first_row..group.first_row + group.n_rows {
            if !self.query_ready[row as usize].load(Ordering::Acquire) {
                return Err(TaskFailed(format!(
                    "run {index} reads row {row}'s query before its task published it"
                )));
            }
            let position = plan.rows[row as usize].position;
            for t in run.first_page * PAGE_TOKENS..end_token {
                if t >= request.first_position && t <= position {
                    let writer = request.first_row + (t - request.first_position);
                    if !self.key_ready[writer as usize].load(Ordering::Acquire) {
                        return Err(TaskFailed(format!(
                            "run {index} reads the new key at {t} before row {writer} published it"
                        )));
                    }
                }
                let cell = row as usize * plan.stride as usize + t as usize;
                out.push((cell, self.inputs.score(self.graph, row, t)));
            }
        }
        Ok(out)
    }
}

impl mailbox::TaskFn for CpuFront<'_> {
    fn run(&self, task: &Task, _inputs: &[&[u32]], out: &mut [u32]) -> Result<(), TaskFailed> {
        let own = task.kind & 0xff;
        let row = task.args[0] as usize;
        match Stage::from_bits(task.stage_bits()) {
            Some(Stage::Indexer) if own == 0 => self.key_ready[row].store(true, Ordering::Release),
            Some(Stage::Indexer) if own == 1 => {
                self.query_ready[row].store(true, Ordering::Release)
            }
            Some(Stage::Indexer) if own == 2 => {
                for run in task.args[0]..task.args[0] + task.args[1] {
                    if self.slow.run == Some(run) {
                        std::thread::sleep(Duration::from_millis(300));
                    }
                    let cells = self.score_run(run)?;
                    let mut scores = self.scores.lock().unwrap();
                    for (cell, value) in cells {
                        scores[cell] = value.to_bits();
                    }
                }
            }
            Some(Stage::Select) => self.select(task)?,
            Some(Stage::Synthetic) if own == READER_KIND => {
                let written = self.written.lock().unwrap();
                let done = written.iter().filter(|&&(r, _)| r as usize == row).count();
                if done as u32 != self.parts[row] {
                    return Err(TaskFailed(format!(
                        "a reader reads row {row}'s list after {done} of its {} select tasks",
                        self.parts[row]
                    )));
                }
            }
            _ => {
                return Err(TaskFailed(format!(
                    "kind {:#x} is not the front half's",
                    task.kind
                )))
            }
        }
        out.fill(task.order);
        Ok(())
    }

    fn share(&self, task: &Task, inputs: &[&[u32]], out: &mut [u32]) -> Result<(), TaskFailed> {
        // A slice's gang box goes out after its part of the list, as on the device.
        if task.stage_bits() == Stage::Select as u32 {
            self.select(task)?;
            out.fill(task.order);
            return Ok(());
        }
        self.run(task, inputs, out)
    }
}

/// The reference: every row's scores from `indexer::reference`, then select's radix select.
fn reference_lists(graph: &FrontGraph, inputs: &Inputs) -> Vec<i32> {
    let stride = graph.plan.stride as usize;
    let mut scores = vec![f32::NEG_INFINITY; graph.plan.rows.len() * stride];
    for (row, &len) in graph.lens.iter().enumerate() {
        for t in 0..len {
            scores[row * stride + t as usize] = inputs.score(graph, row as u32, t);
        }
    }
    lists_of(graph, &scores)
}

fn lists_of(graph: &FrontGraph, scores: &[f32]) -> Vec<i32> {
    let requests = graph.row_requests();
    let rows = Rows {
        scores,
        stride: graph.plan.stride as usize,
        lens: &graph.lens,
    };
    let pages = RowPages {
        table: &graph.pages,
        requests: &requests,
    };
    select_rows(&rows, graph.top, Some(&pages)).unwrap()
}

fn emulate(
    graph: &FrontGraph,
    placement: &Placement,
    inputs: &Inputs,
    slow: Slow,
) -> Result<Vec<i32>, emulator::EmuError> {
    let cpu = CpuFront::new(graph, inputs, slow);
    let scratch = Scratch::new(graph.layout.boxes());
    let config = EmuConfig {
        timeout: Duration::from_secs(20),
        ..EmuConfig::default()
    };
    emulator::run_unchecked(placement, &scratch, 7, &config, &cpu)?;
    let seen = cpu.seen.into_inner().unwrap();
    Ok(lists_of(graph, &seen))
}

fn build(ctas: u32, cache_pages: u32) -> FrontBuild {
    FrontBuild {
        ctas,
        cache_pages,
        max_rows: executor::fused::front::MAX_ROWS,
    }
}

/// (context, rows) of each request.
type Shape = &'static [(u32, u32)];

/// The emulated cases: requests, k, CTAs.
const CASES: [(Shape, usize, u32); 4] = [
    // Registers kind: rows of up to 10K keys, one shorter than k (it lists all, then -1).
    (&[(3000, 1), (700, 2), (30, 1)], 64, 16),
    // Multi-slice gangs: 20K and 9K keys, 4 MTP rows and one.
    (&[(20000, 4), (9000, 1)], 64, 24),
    // One request of 4 rows past 16K, k = 2048 (GLM-5's), fewer CTAs than slices would like.
    (&[(17000, 4)], 2048, 12),
    // One CTA a row (10K to 16K keys): a single row on a small grid.
    (&[(12345, 1)], 256, 4),
];

#[test]
fn emulated_front_half_selects_the_reference_slots() {
    for (i, &(shape, k, ctas)) in CASES.iter().enumerate() {
        let cfg = tiny_config(k);
        let (requests, cache_pages) = batch(shape, 11 + i as u64);
        let graph = FrontGraph::new(&cfg, &requests, build(ctas, cache_pages))
            .and_then(FrontGraph::with_readers)
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
        let inputs = Inputs::new(&cfg, &requests, 100 + i as u64);
        let want = reference_lists(&graph, &inputs);
        let got = emulate(
            &graph,
            graph.placement.placement(),
            &inputs,
            Slow::default(),
        )
        .unwrap_or_else(|e| panic!("case {i}: {e}"));
        assert_eq!(got.len(), want.len());
        let differ = got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(differ, None, "case {i}: first differing entry");
        // Rows shorter than k list every key, then -1.
        for (row, &len) in graph.lens.iter().enumerate() {
            let list = &got[row * k..][..k];
            let listed = list.iter().filter(|&&e| e >= 0).count();
            assert_eq!(listed, (len as usize).min(k), "case {i} row {row}");
        }
        println!(
            "case {i}: {} rows, {} runs, select {:?}, {} tasks on {ctas} CTAs: lists equal",
            graph.lens.len(),
            graph.plan.runs.len(),
            graph.select_kind,
            graph.placement.placement().tasks().count()
        );
    }
}

/// The tiny preset as it is (8 heads x 64, k = 16, select's registers kind): it plans on the host
/// backend's 8 CTAs and on a H200's 132, and its lists are the reference's, rows of fewer keys
/// than k among them.
#[test]
fn the_tiny_preset_plans_and_selects_the_reference_slots() {
    let cfg = ModelConfig::preset("tiny").unwrap();
    let shapes: [Shape; 3] = [&[(299, 1)], &[(997, 3)], &[(5, 1), (39, 2)]];
    for (i, shape) in shapes.iter().enumerate() {
        for ctas in [8, 132] {
            let (requests, cache_pages) = batch(shape, 21 + i as u64);
            let graph = FrontGraph::new(&cfg, &requests, build(ctas, cache_pages))
                .unwrap_or_else(|e| panic!("{shape:?} on {ctas} CTAs: {e}"));
            assert_eq!(graph.top.k(), 16);
            let inputs = Inputs::new(&cfg, &requests, 200 + i as u64);
            let got = emulate(
                &graph,
                graph.placement.placement(),
                &inputs,
                Slow::default(),
            )
            .unwrap_or_else(|e| panic!("{shape:?} on {ctas} CTAs: {e}"));
            assert_eq!(
                got,
                reference_lists(&graph, &inputs),
                "{shape:?} on {ctas} CTAs"
            );
        }
    }
}

/// The first select task that reads more than one run and sits on another CTA than the last of
/// them, with that run: drop the run from its wait.
fn drop_last_run(graph: &FrontGraph) -> (Placement, u32) {
    let mut placement = graph.placement.placement().clone();
    let stride = graph.boxes.indexer.run.stride();
    for (cta, list) in placement.lists_mut().iter_mut().enumerate() {
        for task in list.iter_mut() {
            if task.stage_bits() != Stage::Select as u32 {
                continue;
            }
            let runs = graph.runs_of(task.args[0], FrontGraph::select_range(task));
            let last = runs.end - 1;
            // Score task k (runs 2k, 2k + 1) is on CTA k.
            if runs.len() < 2 || (last / 2) as usize == cta {
                continue;
            }
            let range = task.inputs[0];
            task.inputs[0] = BoxRange::new(range.first, range.len - stride);
            return (placement, last);
        }
    }
    panic!("no select task reads two runs");
}

#[test]
fn a_select_task_that_misses_a_run_is_refused_and_reads_unwritten_scores() {
    let (shape, k, ctas) = CASES[1];
    let cfg = tiny_config(k);
    let (requests, cache_pages) = batch(shape, 12);
    let graph = FrontGraph::new(&cfg, &requests, build(ctas, cache_pages)).unwrap();
    let inputs = Inputs::new(&cfg, &requests, 101);
    let (broken, run) = drop_last_run(&graph);
    // The box rules alone cannot see it: every box waited on still has an earlier writer.
    let limits = graph.placement.limits();
    assert!(broken.validate(limits).is_ok());
    match graph.check_handoff(&broken) {
        Err(FrontError::MissedRun { run: missed, .. }) => assert_eq!(missed, run),
        other => panic!("the hand-off check let it through: {other:?}"),
    }
    // Run anyway, with that run's scoring slow: the select task reads scores no run wrote.
    let slow = Slow {
        run: Some(run),
        select: None,
    };
    let err = emulate(&graph, &broken, &inputs, slow).unwrap_err();
    assert!(err.to_string().contains("before its run wrote it"), "{err}");
    // The control's control: the same slow run with the real wait is fine.
    let want = reference_lists(&graph, &inputs);
    let got = emulate(&graph, graph.placement.placement(), &inputs, slow).unwrap();
    assert_eq!(got, want);
}

/// The reader of a row of several slices, the row and its last slice.
fn sliced_reader(graph: &FrontGraph) -> (u32, u32) {
    let placement = graph.placement.placement();
    let (_, reader) = placement
        .tasks()
        .find(|(_, t)| {
            t.stage_bits() == Stage::Synthetic as u32
                && placement.tasks().any(|(_, s)| {
                    s.stage_bits() == Stage::Select as u32
                        && s.args[0] == t.args[0]
                        && s.args[2] >> 16 > 1
                })
        })
        .expect("a reader of a row of slices");
    let row = reader.args[0];
    let last = placement
        .tasks()
        .filter(|(_, s)| s.stage_bits() == Stage::Select as u32 && s.args[0] == row)
        .map(|(_, s)| s.args[2] & 0xffff)
        .max()
        .unwrap();
    (row, last)
}

#[test]
fn readers_wait_for_the_whole_list_of_their_row() {
    let (shape, k, ctas) = CASES[1];
    let cfg = tiny_config(k);
    let (requests, cache_pages) = batch(shape, 13);
    let graph = FrontGraph::new(&cfg, &requests, build(ctas, cache_pages))
        .and_then(FrontGraph::with_readers)
        .unwrap();
    let inputs = Inputs::new(&cfg, &requests, 102);
    let want = reference_lists(&graph, &inputs);
    let (row, last) = sliced_reader(&graph);
    let limits = graph.placement.limits();
    // Every reader waits on its row's one list box, at a later rank than the row's select tasks.
    for (_, t) in graph.placement.placement().tasks() {
        if t.stage_bits() == Stage::Synthetic as u32 {
            assert_eq!(t.inputs(), &[graph.list_ready(t.args[0]).unwrap()]);
            assert!(t.order >= graph.next_rank());
        }
    }
    // The row's last slice is slow: with the real waits the reader still sees the whole list.
    let slow = Slow {
        run: None,
        select: Some((row, last)),
    };
    assert_eq!(
        emulate(&graph, graph.placement.placement(), &inputs, slow).unwrap(),
        want
    );
    // A reader that skips the list box reads the row before its select tasks are done.
    let mut skips = graph.placement.placement().clone();
    for task in skips.lists_mut().iter_mut().flatten() {
        if task.stage_bits() == Stage::Synthetic as u32 && task.args[0] == row {
            task.n_inputs = 0;
        }
    }
    assert!(skips.validate(limits).is_ok());
    let err = emulate(&graph, &skips, &inputs, slow).unwrap_err();
    assert!(err.to_string().contains("select tasks"), "{err}");
    // A first slice that puts the list box without waiting on its gang's boxes: the reader,
    // waiting on the list box, still runs before the slow slice is done.
    let mut early = graph.placement.placement().clone();
    for task in early.lists_mut().iter_mut().flatten() {
        if task.stage_bits() == Stage::Select as u32
            && task.args[0] == row
            && task.args[2] & 0xffff == 0
        {
            task.n_inputs -= 1;
        }
    }
    assert!(early.validate(limits).is_ok());
    let err = emulate(&graph, &early, &inputs, slow).unwrap_err();
    assert!(err.to_string().contains("select tasks"), "{err}");
}

#[test]
fn production_shapes_place_by_the_rule() {
    let cfg = ModelConfig::preset("glm-5").unwrap();
    let top = TopK::of(&cfg).unwrap();
    let cases: [Shape; 6] = [
        &[(8191, 1)],
        &[(8188, 4)],
        &[(131071, 1)],
        &[(131068, 4)],
        &[(524287, 1)],
        &[(100_000, 4), (30_000, 1), (5_000, 2)],
    ];
    for shape in cases {
        let (requests, cache_pages) = batch(shape, 5);
        let graph = FrontGraph::new(&cfg, &requests, build(132, cache_pages))
            .unwrap_or_else(|e| panic!("{shape:?}: {e}"));
        assert_eq!(graph.top, top);
        let selects = graph
            .placement
            .placement()
            .tasks()
            .filter(|(_, t)| t.stage_bits() == Stage::Select as u32)
            .count();
        println!(
            "{shape:?}: {} runs, select {:?} in {selects} tasks, {} boxes",
            graph.plan.runs.len(),
            graph.select_kind,
            graph.layout.boxes()
        );
    }
}

#[test]
fn bad_batches_are_refused_before_anything_runs() {
    let cfg = ModelConfig::preset("glm-5").unwrap();
    let (mut requests, cache_pages) = batch(&[(5000, 2)], 3);
    // A context past the request's page table.
    requests[0].context = 9000;
    assert!(matches!(
        FrontGraph::new(&cfg, &requests, build(132, cache_pages)),
        Err(FrontError::ContextPastPages { .. })
    ));
    // A page past the cache.
    let (mut requests, cache_pages) = batch(&[(5000, 2)], 3);
    requests[0].pages[3] = cache_pages;
    assert!(matches!(
        FrontGraph::new(&cfg, &requests, build(132, cache_pages)),
        Err(FrontError::PagePastCache { page: 3, .. })
    ));
    // More rows than the build takes.
    let (requests, cache_pages) = batch(&[(5000, 30), (100, 3)], 3);
    assert!(matches!(
        FrontGraph::new(&cfg, &requests, build(132, cache_pages)),
        Err(FrontError::TooManyRows { rows: 33, max: 32 })
    ));
    // More rows than the grid has CTAs for: each row's key and query tasks take one.
    let (requests, cache_pages) = batch(&[(5000, 4)], 3);
    assert!(matches!(
        FrontGraph::new(&cfg, &requests, build(4, cache_pages)),
        Err(FrontError::TooFewCtas {
            rows: 4,
            ctas: 4,
            max: 1
        })
    ));
    assert!(FrontGraph::new(&cfg, &requests, build(9, cache_pages)).is_ok());
    // No rows.
    let (requests, cache_pages) = batch(&[(5000, 0)], 3);
    assert_eq!(
        FrontGraph::new(&cfg, &requests, build(132, cache_pages)).unwrap_err(),
        FrontError::NoRows
    );
    // k from the config that select cannot build.
    let mut big_k = cfg.clone();
    big_k.index_topk = 1 << 20;
    let (requests, cache_pages) = batch(&[(5000, 1)], 3);
    assert_eq!(
        FrontGraph::new(&big_k, &requests, build(132, cache_pages)).unwrap_err(),
        FrontError::BadTopK(1 << 20)
    );
}

/// The front half builds for both targets as `FrontKernel::build` builds it for each
/// (`KernelConfig::production`: on sm_90a, wgmma at GLM-5's shape, the source of the kernel
/// table's row), at GLM-5's and the tiny preset's shapes.
#[test]
fn the_fused_front_half_builds_for_both_targets() {
    for target in ["sm_90a", "gfx950"] {
        let shape = CtaShape::for_target(target).unwrap();
        let mut builds = Vec::new();
        for preset in ["glm-5", "tiny"] {
            let cfg = ModelConfig::preset(preset).unwrap();
            let top = TopK::of(&cfg).unwrap();
            let stage = KernelConfig::production(&cfg, target)
                .unwrap()
                .stage_kernel();
            builds.push((preset, stage, top));
        }
        let Some(compiler) = optional_compiler(target).unwrap() else {
            continue;
        };
        for (preset, stage, top) in builds {
            let source = front_source(shape, stage, top, Default::default()).unwrap();
            let compiled = compiler
                .compile(&source)
                .unwrap_or_else(|e| panic!("{target}, {preset}: {e}"));
            let entry = compiled
                .resources
                .iter()
                .find(|r| r.kernel == ENTRY)
                .unwrap_or_else(|| panic!("{target}: no {ENTRY} in {:?}", compiled.resources));
            println!("{target}, {preset}: {entry:?}");
            // The mma path's build takes no local memory on sm_90a (GLM-5's wgmma build is the
            // kernel table's row, a few bytes of spills at 128 registers).
            if target == "sm_90a" && preset == "tiny" {
                assert!(
                    entry.spills == 0 && entry.scratch_bytes == 0,
                    "{preset}: {entry:?}"
                );
            }
        }
    }
}
