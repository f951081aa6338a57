//! The front half's fused launch against the standalone pair, on a GPU: for 8K, 128K and 512K
//! keys x 1 and 4 rows of one request, the median of TIMED graph replays, the L2 flushed before
//! each, of COPIES steps back to back, each on its own copy of the cache, divided by COPIES (what a
//! step costs when it follows another, as inside a captured step): (a) the epoch node and the
//! fused launch, (b) the standalone indexer's whole-stage launch and the standalone select's launch
//! (each with its epoch node); beside the floor: the index-key pages the scorers read plus the
//! scores written and read, over the copy bandwidth measured in the same run. Records go to
//! `MONO_BENCH_JSON` (table "fused front half").
//!
//! Then the timeline: the same graph with a kernel built with task records (`MBX_TRACE`, and
//! select's phase marks of row 0), TRACED replays, every launch's records read back: where a
//! step's time goes (the launch's span, the gap to the next launch, when each stage's tasks start
//! and end, how long row 0's select waits on its scores and how long it works). With
//! `FRONT_BENCH_TRACE=<dir>` each case's last launch is written there as a Chrome / Perfetto trace
//! and an SVG.
//!
//! `cargo bench -p executor --bench front` on a GPU machine; prints "skipped" without one.

#[path = "../../indexer/tests/support/mod.rs"]
mod support;

use device::report::{Figure, Reporter};
use device::timing::{capture, median, ReplayTimer};
use device::Device;
use executor::fused::front::{FrontGraph, FrontRequest};
use executor::fused::front_gpu::{FrontInputs, FrontKernel, FrontLaunch, FrontOptions};
use indexer::gpu::KernelConfig;
use indexer::reference::{IndexerDims, IndexerOptions};
use mailbox::gpu::{EpochNode, Variant};
use mailbox::trace::{self, Span, TimeBase, Timeline};
use mailbox::Stage as TaskStage;
use model::ModelConfig;
use select::gpu::{Batch, Method, Selector, Shape};
use select::reference::{RowPages, Rows};
use support::{CacheKind, Error, Inputs, LaunchBuffers, Request, Scene, Stage};

const TIMED: usize = 30;
const TRACED: usize = 10;
const COPIES: usize = 6;
const CASES: [(u32, u32); 6] = [
    (8192, 1),
    (8192, 4),
    (131_072, 1),
    (131_072, 4),
    (524_288, 1),
    (524_288, 4),
];

fn main() -> Result<(), Error> {
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("fused front bench skipped: {e}");
            return Ok(());
        }
    };
    let cfg = ModelConfig::preset("glm-5")?;
    let dims = IndexerDims::new(&cfg)?;
    let config = KernelConfig::new(dims, &IndexerOptions::deepseek(&cfg))?;
    let stage = Stage::new(dev, config)?;
    let dev = &stage.dev;
    let reporter = Reporter::from_env(&dev.info().name);
    let fused = FrontKernel::build(dev, &cfg, Variant::default(), None)?;
    let traced = FrontKernel::build_with(
        dev,
        &cfg,
        FrontOptions {
            trace: true,
            ..FrontOptions::default()
        },
    )?;
    let trace_dir = std::env::var("FRONT_BENCH_TRACE").ok();
    let ghz = f64::from(dev.info().clock_khz) / 1e6;
    let epoch_node = EpochNode::build(dev, Variant::default())?;
    let bandwidth = device::probes::copy_bandwidth(dev, 1 << 30)?.bytes_per_s;
    let timer = ReplayTimer::new(dev)?;
    let stream = dev.new_stream()?;
    // The median us a step of `issue`'s graph over `replays` replays; `after(i)` runs after each.
    let replays_us = |issue: &dyn Fn() -> Result<(), Error>,
                      replays: usize,
                      after: &mut dyn FnMut(usize) -> Result<(), Error>|
     -> Result<f64, Error> {
        let graph = capture(&stream, issue)?;
        let ms = timer.replays_ms(dev, &stream, &graph, replays, after)?;
        Ok(median(&ms) * 1e3 / COPIES as f64)
    };
    let graph_us = |issue: &dyn Fn() -> Result<(), Error>| -> Result<f64, Error> {
        replays_us(issue, TIMED, &mut |_| Ok(()))
    };
    println!(
        "\nfused front half, GLM-5, median of {TIMED} graph replays of {COPIES} steps, L2 flushed before each; copy bandwidth {:.2} TB/s",
        bandwidth / 1e12
    );
    println!(
        "{:<10} {:>9} {:>9} {:>7} {:>9} {:>7}",
        "case", "fused us", "pair us", "ratio", "floor us", "x floor"
    );
    let mut timelines = Vec::new();
    for (keys, rows) in CASES {
        let request = Request {
            rows,
            last_position: keys - 1,
        };
        let scene = Scene::new(dims, vec![request], CacheKind::Random, 3);
        let cache_pages = (scene.bytes.len() as u64 / scene.cache.page_bytes()) as u32;
        let inputs = Inputs::random(&dims, rows as usize, 4);
        let caches = (0..COPIES)
            .map(|_| dev.upload(&scene.bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let key_proj = dev.upload(&inputs.key_proj)?;
        let query_proj = dev.upload(&inputs.query_proj)?;
        let gates = dev.upload(&inputs.gates)?;
        let norm_weight = dev.upload(&inputs.norm_weight)?;
        let norm_bias = dev.upload(&inputs.norm_bias)?;
        let requests = [FrontRequest {
            context: request.first_position(),
            rows,
            pages: scene.table.pages(0).to_vec(),
        }];
        let graph = FrontGraph::new(&cfg, &requests, fused.build_info(cache_pages))?;
        let floor_us = graph.floor_bytes(dims.head_dim as u32) as f64 / bandwidth * 1e6;
        let launches = caches
            .iter()
            .map(|cache| {
                let front = FrontInputs {
                    key_proj: &key_proj,
                    query_proj: &query_proj,
                    gates: &gates,
                    norm_weight: &norm_weight,
                    norm_bias: &norm_bias,
                    cache,
                };
                FrontLaunch::new(dev, &fused, graph.clone(), &front)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let fused_us = graph_us(&|| {
            for launch in &launches {
                launch.enqueue(&fused, &stream)?;
            }
            Ok(())
        })?;

        // The timeline: the same steps on the traced kernel, every launch's records read back.
        let traced_launches = caches
            .iter()
            .map(|cache| {
                let front = FrontInputs {
                    key_proj: &key_proj,
                    query_proj: &query_proj,
                    gates: &gates,
                    norm_weight: &norm_weight,
                    norm_bias: &norm_bias,
                    cache,
                };
                FrontLaunch::new(dev, &traced, graph.clone(), &front)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut steps = Vec::new();
        let traced_us = replays_us(
            &|| {
                for launch in &traced_launches {
                    launch.enqueue(&traced, &stream)?;
                }
                Ok(())
            },
            TRACED,
            &mut |_| {
                let mut step = Vec::new();
                for launch in &traced_launches {
                    let trace = launch.trace()?.expect("a traced kernel");
                    step.push((trace, launch.select_marks()?));
                }
                steps.push(step);
                Ok(())
            },
        )?;

        // The standalone pair: the indexer's whole stage, then select over scores of that shape.
        let plan = stage.plan(&scene, &[0])?;
        let buffers = LaunchBuffers::new(&stage, &scene, &plan, &inputs)?;
        let lens: Vec<u32> = plan.rows.iter().map(|r| r.position + 1).collect();
        let scores = vec![0.0f32; lens.len() * plan.stride as usize];
        let method = Method::fastest_for(keys);
        let shape = Shape::for_rows(method, fused.top(), keys)?;
        let selector = Selector::build(dev, method, shape, Variant::default())?;
        // Every row is request 0's.
        let requests = vec![0u32; lens.len()];
        let rows_in = Rows {
            scores: &scores,
            stride: plan.stride as usize,
            lens: &lens,
        };
        let pages = RowPages {
            table: &scene.table,
            requests: &requests,
        };
        let batches = (0..COPIES)
            .map(|_| Batch::upload(dev, &selector, &rows_in, Some(&pages)))
            .collect::<Result<Vec<_>, _>>()?;
        let pair_us = graph_us(&|| {
            for (cache, batch) in caches.iter().zip(&batches) {
                epoch_node.enqueue(&stream, &stage.epoch, &stage.scratch, stage.tags)?;
                stage
                    .kernels
                    .launch(&stream, &buffers.stage(&stage, cache, cache))?;
                batch.enqueue(&selector, &stream, 1)?;
            }
            Ok(())
        })?;
        let case = format!("{}K x {rows}", keys / 1024);
        println!(
            "{case:<10} {fused_us:>9.2} {pair_us:>9.2} {:>7.2} {floor_us:>9.2} {:>7.2}",
            fused_us / pair_us,
            fused_us / floor_us
        );
        timelines.push((case.clone(), traced_us, breakdown(&steps, ghz)));
        if let (Some(dir), Some(last)) = (&trace_dir, steps.last().and_then(|s| s.last())) {
            let title = format!("fused front half, GLM-5, {case}");
            let t = Timeline::new(&last.0, TimeBase::Timer, &title, &kind_label);
            let stem = format!("{dir}/front-{}", case.replace(' ', ""));
            std::fs::write(format!("{stem}.json"), trace::chrome::json(&t))?;
            std::fs::write(format!("{stem}.svg"), trace::svg::svg(&t))?;
        }
        let note = format!(
            "standalone pair: indexer whole stage + select {}",
            method.name()
        );
        reporter.write(
            &Figure::new("fused front half", &case, "fused launch", fused_us, "us")
                .floor(
                    floor_us,
                    "index-key pages + scores written and read, over copy bandwidth",
                )
                .baseline(pair_us, "standalone indexer + select, same graph replays")
                .note(&note),
        )?;
    }
    println!(
        "\ntimeline (traced kernel; medians over {TRACED} replays x {COPIES} launches, us; launch 0 of a replay follows the L2 flush)"
    );
    for (case, traced_us, lines) in timelines {
        println!("{case}: step {traced_us:.2} us traced");
        for line in lines {
            println!("  {line}");
        }
    }
    Ok(())
}

/// One traced launch: its timeline and the marks of row 0's select task (phase, SM cycles).
type TracedLaunch = (trace::Trace, Vec<(u32, u64)>);

/// Own kinds of the front half's tasks, by stage.
fn kind_label(kind: u32) -> String {
    let own = kind & 0xff;
    match (kind >> 8, own) {
        (s, 0) if s == TaskStage::Indexer as u32 => "index key".into(),
        (s, 1) if s == TaskStage::Indexer as u32 => "index query".into(),
        (s, 2) if s == TaskStage::Indexer as u32 => "score".into(),
        (s, _) if s == TaskStage::Select as u32 => "select".into(),
        _ => trace::kind_name(kind),
    }
}

fn quantiles(mut v: Vec<f64>) -> String {
    if v.is_empty() {
        return "-".into();
    }
    v.sort_by(|a, b| a.total_cmp(b));
    format!("{:.2} [{:.2}..{:.2}]", v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Where the traced steps' time went, one line a figure: each launch's span (first task start
/// to last task end, shared ns clock), the gap from its last end to the next launch's first
/// start, the spread of the CTAs' first starts, each kind's first start, last end and task
/// length, and row 0's select: its wait on the scores (its first mark less its record's start,
/// SM cycles), its work after it, and the time from the last score task's end to that wait's end.
fn breakdown(steps: &[Vec<TracedLaunch>], ghz: f64) -> Vec<String> {
    let at = |s: &Span| (s.start_ns as f64, s.end_ns as f64);
    let mut span = (Vec::new(), Vec::new());
    let mut gap = Vec::new();
    let mut skew = Vec::new();
    let mut kinds: std::collections::BTreeMap<String, [Vec<f64>; 3]> = Default::default();
    let mut wait = Vec::new();
    let mut work = Vec::new();
    let mut handoff = Vec::new();
    for step in steps {
        for (k, (t, marks)) in step.iter().enumerate() {
            let start = t
                .spans
                .iter()
                .map(|s| at(s).0)
                .fold(f64::INFINITY, f64::min);
            let end = t.spans.iter().map(|s| at(s).1).fold(0.0, f64::max);
            if k == 0 { &mut span.0 } else { &mut span.1 }.push((end - start) / 1e3);
            if let Some((next, _)) = step.get(k + 1) {
                let next_start = next
                    .spans
                    .iter()
                    .map(|s| at(s).0)
                    .fold(f64::INFINITY, f64::min);
                gap.push((next_start - end) / 1e3);
            }
            let mut firsts = vec![f64::INFINITY; t.ctas as usize];
            for s in &t.spans {
                let f = &mut firsts[s.cta as usize];
                *f = f.min(at(s).0);
                let e = kinds.entry(kind_label(s.kind)).or_default();
                e[0].push((at(s).0 - start) / 1e3);
                e[1].push((at(s).1 - start) / 1e3);
                e[2].push((s.end_cycles - s.start_cycles) as f64 / ghz / 1e3);
            }
            let used: Vec<f64> = firsts.into_iter().filter(|f| f.is_finite()).collect();
            let last_first = used.iter().copied().fold(0.0, f64::max);
            skew.push((last_first - start) / 1e3);
            let score_end = t
                .spans
                .iter()
                .filter(|s| kind_label(s.kind) == "score")
                .map(|s| at(s).1)
                .fold(0.0, f64::max);
            // Row 0's select task (its first slice, on CTA 0 as select's plan places it): the
            // one that stamps the marks.
            let first_select = t
                .spans
                .iter()
                .filter(|s| s.stage() == Some(TaskStage::Select))
                .map(|s| s.order)
                .min();
            let row0 = t
                .spans
                .iter()
                .find(|s| Some(s.order) == first_select && s.cta == 0);
            if let (Some(s), Some(first), Some(last)) = (row0, marks.first(), marks.last()) {
                let waited = (first.1 - s.start_cycles) as f64 / ghz;
                wait.push(waited / 1e3);
                work.push((last.1 - first.1) as f64 / ghz / 1e3);
                handoff.push((s.start_ns as f64 + waited - score_end) / 1e3);
            }
        }
    }
    let mut lines = vec![
        format!("launch span, first launch: {}", quantiles(span.0)),
        format!("launch span, later launches: {}", quantiles(span.1)),
        format!(
            "gap to the next launch (epoch node + launch): {}",
            quantiles(gap)
        ),
        format!("last CTA's first task start: {}", quantiles(skew)),
    ];
    for (name, [first, last, len]) in kinds {
        let lo = first.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = last.iter().copied().fold(0.0, f64::max);
        lines.push(format!(
            "{name}: start {} end {} (earliest {lo:.2}, latest {hi:.2}), task length {}",
            quantiles(first),
            quantiles(last),
            quantiles(len)
        ));
    }
    lines.push(format!(
        "row 0 select, wait on its scores: {}",
        quantiles(wait)
    ));
    lines.push(format!(
        "row 0 select, work after the wait: {}",
        quantiles(work)
    ));
    lines.push(format!(
        "row 0 select, wait end after the last score task's end (shared clock): {}",
        quantiles(handoff)
    ));
    lines
}
