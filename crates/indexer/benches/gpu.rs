//! Scoring on the GPU: rows 1, 2, 4, 8 (one request's draft chain, and separate requests) at 8K,
//! 128K and 512K keys. Each figure is the median of event-timed launches of the stage's task-list
//! entry running a scoring-only list (one CTA of 512 threads a SM, two runs a CTA), the L2 flushed
//! before each, beside the floor: the key and scale bytes the rows' requests must read, once, over
//! the copy bandwidth measured in the same run. Every case runs with each scorer: f16 (the mma
//! path: bf16 queries, keys widened to f16 in LDS) and wgmma (FP8 queries, keys copied into an LDS
//! ring by the copy engine); wgmma-pdl is wgmma with each scoring launch overlapping the kernel
//! before it (programmatic dependent launch; the launch waits for that kernel before its first
//! task), which only the graph figure can show: a single launch follows the L2 flush's kernel,
//! which does not release it early. Beside the floor, "copy us" is the copy kernel moving the same
//! bytes (half read, half written) timed the same way: what one launch that only moves the floor's
//! bytes costs here, launch included. "graph us" and "copy graph us" take the launch mostly out:
//! one graph of COPIES launches back to back, each on its own copy of the cache (or of the copied
//! bytes), the L2 flushed before the graph, the time divided by COPIES: what a launch costs when it
//! follows another, as a stage does inside a captured step.
//!
//! `cargo bench -p indexer --bench gpu` on a GPU machine; prints "skipped" without one. To time
//! fewer cases (e.g. under a profiler), set comma lists: `INDEXER_BENCH_METHODS=wgmma`,
//! `INDEXER_BENCH_KEYS=131072`, `INDEXER_BENCH_ROWS=1,4`; an unset variable takes every case.
//! `INDEXER_BENCH_RING=3` sizes the wgmma scorer's LDS ring (default `indexer::gpu::RING`).
//! `INDEXER_BENCH_TRACE=1` adds, per wgmma case, where a trace build's launches spend their time:
//! one graph of COPIES traced launches (`KernelConfig::trace`), and for its middle launch each
//! phase's p10 / p50 / p90 in us since the CTA's start (`indexer::trace`), then how far apart the
//! launches start. The phases are in us at the SM clock the trace measured (cycles over the global
//! timer), and each page's steps (waiting, landed, issued, scored) get their own percentiles.
//! `INDEXER_BENCH_TRACE_DIR=dir` also writes each traced case's middle launch as
//! `dir/trace-<keys>-<rows>-<chain|separate>-<method>.csv`, a line a warpgroup
//! (`indexer::trace::csv`). The traced builds are timed nowhere else: their stamps cost time.
//! With `MONO_BENCH_JSON=file` the figures are also appended there as records (`device::report`):
//! table "indexer scoring" (wgmma single and in a graph, wgmma-pdl overlapped in a graph, beside
//! the copy kernel) and "indexer scoring, mma.sync" (f16, beside wgmma's single launch).

#[path = "../tests/support/mod.rs"]
mod support;

use device::report::{keys_label, Figure, Reporter};
use device::timing::{median, ReplayTimer};
use device::{Args, BenchFilter, Device, Launch};
use indexer::gpu::KernelConfig;
use indexer::reference::{IndexerDims, IndexerOptions, VectorFormat};
use model::paging::pages_through;
use model::ModelConfig;
use support::{CacheKind, Error, Inputs, LaunchBuffers, Request, Scene, Stage};

const KEYS: [u32; 3] = [8192, 131_072, 524_288];
const ROWS: [u32; 4] = [1, 2, 4, 8];
const TIMED: usize = 30;
const COPIES: usize = 6;

const METHODS: [&str; 3] = ["f16", "wgmma", "wgmma-pdl"];

fn main() -> Result<(), Error> {
    let names = |values: &[u32]| values.iter().map(u32::to_string).collect::<Vec<_>>();
    let keys_picked = BenchFilter::from_env("INDEXER_BENCH_KEYS", &names(&KEYS))?;
    let rows_picked = BenchFilter::from_env("INDEXER_BENCH_ROWS", &names(&ROWS))?;
    let methods_picked =
        BenchFilter::from_env("INDEXER_BENCH_METHODS", &METHODS.map(String::from))?;
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("indexer gpu bench skipped: {e}");
            return Ok(());
        }
    };
    println!(
        "device: {} ({} SMs)",
        dev.info().name,
        dev.info().multiprocessors
    );
    let report = Reporter::from_env(&dev.info().name);
    let bandwidth = device::probes::copy_bandwidth(&dev, 1 << 30)?.bytes_per_s;
    println!(
        "copy bandwidth: {:.2} TB/s (read + written)",
        bandwidth / 1e12
    );

    let cfg = ModelConfig::preset("glm-5")?;
    let dims = IndexerDims::new(&cfg)?;
    let config = KernelConfig::new(dims, &IndexerOptions::kernels(&cfg))?;
    let ring = match std::env::var("INDEXER_BENCH_RING") {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("INDEXER_BENCH_RING={v}: not a number"))?,
        Err(_) => indexer::gpu::RING,
    };
    let wgmma = KernelConfig {
        query: VectorFormat::Fp8,
        ring,
        ..config
    };
    let stage_of = |config, overlapping| -> Result<Stage, Error> {
        let mut stage = Stage::new(Device::open(0)?, config)?;
        stage.kernels.set_overlapping(overlapping);
        Ok(stage)
    };
    let traced = match std::env::var("INDEXER_BENCH_TRACE").as_deref() {
        Ok("1") => {
            let config = KernelConfig {
                trace: true,
                ..wgmma
            };
            vec![
                (METHODS[1], stage_of(config, false)?),
                (METHODS[2], stage_of(config, true)?),
            ]
        }
        Ok(v) if v != "0" => return Err(format!("INDEXER_BENCH_TRACE={v}: 1 or 0").into()),
        _ => Vec::new(),
    };
    let stages = [
        (METHODS[0], Stage::new(dev, config)?),
        (METHODS[1], stage_of(wgmma, false)?),
        (METHODS[2], stage_of(wgmma, true)?),
    ];
    let dev = &stages[0].1.dev;
    let timer = ReplayTimer::new(dev)?;
    let stream = dev.new_stream()?;
    let copy_module = dev.build(&device::probes::copy_source())?;
    let copy = copy_module.kernel("copy_16b")?;
    let copy_src = dev.alloc_zeroed::<[u32; 4]>(COPIES << 25)?;
    let copy_dst = dev.alloc_zeroed::<[u32; 4]>(1 << 25)?;
    let copy_launch = Launch::new(dev.info().multiprocessors * 4, 512);
    // One graph of COPIES launches issued by `issue`, per launch, L2 flushed before each replay.
    let graph_us =
        |stream: &device::Stream, issue: &dyn Fn() -> Result<(), Error>| -> Result<f64, Error> {
            Ok(timer.capture_median_ms(dev, stream, TIMED, issue)? * 1e3 / COPIES as f64)
        };

    // The copy kernel moving `bytes` (half each way), timed as the scorer is.
    let copy_us = |bytes: f64| -> Result<(f64, f64), Error> {
        let words = ((bytes / 32.0) as u64).min(1 << 25);
        let args = Args::new().buf(&copy_src).buf(&copy_dst).u64(words);
        let single = timer.direct_ms(dev, &stream, TIMED, || -> Result<(), Error> {
            Ok(stream.launch(&copy, copy_launch, &args)?)
        })?;
        let copies: Vec<Args> = (0..COPIES as u64)
            .map(|i| {
                Args::new()
                    .u64(copy_src.device_ptr() + i * (words * 16))
                    .buf(&copy_dst)
                    .u64(words)
            })
            .collect();
        let graph = graph_us(&stream, &|| {
            copies
                .iter()
                .try_for_each(|a| Ok(stream.launch(&copy, copy_launch, a)?))
        })?;
        Ok((median(&single) * 1e3, graph))
    };
    let mut lines = Vec::new();
    for keys in KEYS
        .into_iter()
        .filter(|k| keys_picked.allows(&k.to_string()))
    {
        // Requests 0..4: chains of 1, 2, 4, 8 rows; 4..12: single rows. All end at key `keys`.
        let mut requests: Vec<Request> = ROWS
            .iter()
            .map(|&rows| Request {
                rows,
                last_position: keys - 1,
            })
            .collect();
        requests.extend((0..8).map(|_| Request {
            rows: 1,
            last_position: keys - 1,
        }));
        let scene = Scene::new(dims, requests, CacheKind::Random, u64::from(keys));
        let caches = (0..COPIES)
            .map(|_| dev.upload(&scene.bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let cache = &caches[0];
        let page_bytes = scene.cache.page_bytes() as f64;
        for (ri, &rows) in ROWS.iter().enumerate() {
            for chain in [true, false] {
                if (rows == 1 && !chain) || !rows_picked.allows(&rows.to_string()) {
                    continue; // one row is one request either way; or a row count not chosen
                }
                let set: Vec<usize> = if chain {
                    vec![ri]
                } else {
                    (4..4 + rows as usize).collect()
                };
                for (method, stage) in stages.iter().filter(|(m, _)| methods_picked.allows(m)) {
                    let plan = stage.plan(&scene, &set)?;
                    let inputs = Inputs::random(&dims, plan.rows.len(), 1);
                    let buffers = LaunchBuffers::new(stage, &scene, &plan, &inputs)?;
                    let args = buffers.stage(stage, cache, cache);
                    // The timed scoring launches find the published queries and new keys ready.
                    stage.publish(&stream, &buffers, cache, cache)?;
                    stream.sync()?;
                    let single =
                        timer.direct_ms(dev, &stream, TIMED, || -> Result<(), Error> {
                            Ok(stage.kernels.score(&stream, &args)?)
                        })?;
                    let each: Vec<_> = caches.iter().map(|c| buffers.stage(stage, c, c)).collect();
                    let graph = graph_us(&stream, &|| {
                        each.iter()
                            .try_for_each(|a| Ok(stage.kernels.score(&stream, a)?))
                    })?;
                    if let Some((_, traced)) = traced.iter().find(|(m, _)| m == method) {
                        let nominal_mhz = f64::from(dev.info().clock_khz) / 1e3;
                        let name = format!(
                            "trace-{keys}-{rows}-{}-{method}",
                            if chain { "chain" } else { "separate" }
                        );
                        println!(
                            "{}",
                            trace(
                                traced,
                                &stream,
                                timer.flush(),
                                &buffers,
                                &caches,
                                nominal_mhz,
                                &name
                            )?
                            .lines()
                            .fold(
                                format!(
                                    "trace: {keys} keys, {rows} rows ({}), {method}",
                                    if chain { "one request" } else { "separate" }
                                ),
                                |text, line| text + "\n  " + line
                            )
                        );
                    }
                    let requests = if chain { 1.0 } else { f64::from(rows) };
                    let floor_bytes = requests * f64::from(pages_through(keys - 1)) * page_bytes;
                    let (copy, copy_graph) = copy_us(floor_bytes)?;
                    lines.push((
                        keys,
                        rows,
                        chain,
                        *method,
                        plan.runs.len(),
                        median(&single) * 1e3,
                        floor_bytes / bandwidth * 1e6,
                        copy,
                        graph,
                        copy_graph,
                    ));
                }
            }
        }
    }

    println!("\nindexer scoring, GLM-5 (32 heads x 128), median of {TIMED} launches, L2 flushed before each");
    println!(
        "{:>7} {:>4} {:>9} {:>9} {:>5} {:>10} {:>10} {:>8} {:>9} {:>8} {:>9} {:>13}",
        "keys",
        "rows",
        "requests",
        "method",
        "runs",
        "time us",
        "floor us",
        "x floor",
        "x 1 row",
        "copy us",
        "graph us",
        "copy graph us"
    );
    for &(keys, rows, chain, method, runs, us, floor, copy, graph, copy_graph) in &lines {
        let one_row = lines
            .iter()
            .find(|l| l.0 == keys && l.1 == 1 && l.3 == method)
            .map_or(f64::NAN, |l| l.5);
        println!(
            "{:>7} {:>4} {:>9} {:>9} {:>5} {:>10.2} {:>10.2} {:>8.2} {:>9.2} {:>8.2} {:>9.2} {:>13.2}",
            keys,
            rows,
            if chain { "1 (chain)" } else { "separate" },
            method,
            runs,
            us,
            floor,
            us / floor,
            us / one_row,
            copy,
            graph,
            copy_graph
        );
    }
    let floor_how = format!(
        "the key and scale bytes the rows' requests must read, once, over the copy bandwidth \
         measured in the same run ({:.2} TB/s)",
        bandwidth / 1e12
    );
    for &(keys, rows, chain, method, _, us, floor, copy, graph, copy_graph) in &lines {
        let case = match (rows, chain) {
            (1, _) => format!("{} x 1 row", keys_label(u64::from(keys))),
            (_, true) => format!("{} x {rows} rows, one request", keys_label(u64::from(keys))),
            _ => format!(
                "{} x {rows} rows, separate requests",
                keys_label(u64::from(keys))
            ),
        };
        let figure = |table: &str, what: &str, us: f64| {
            Figure::new(table, &case, what, us, "us").floor(floor, &floor_how)
        };
        let single_copy = "copy kernel, same bytes, single launch";
        let graph_copy = "copy kernel, same bytes, in a graph";
        let figures = match method {
            "wgmma" => vec![
                figure("indexer scoring", "wgmma, single launch", us).baseline(copy, single_copy),
                figure("indexer scoring", "wgmma, in a graph", graph)
                    .baseline(copy_graph, graph_copy),
            ],
            // A single launch follows the flush's kernel, so only the graph shows the overlap.
            "wgmma-pdl" => vec![figure(
                "indexer scoring",
                "wgmma-pdl, overlapped, in a graph",
                graph,
            )
            .baseline(copy_graph, graph_copy)],
            _ => {
                let wgmma = lines
                    .iter()
                    .find(|l| (l.0, l.1, l.2, l.3) == (keys, rows, chain, "wgmma"));
                let f16 = figure(
                    "indexer scoring, mma.sync",
                    "f16 mma.sync, single launch",
                    us,
                );
                vec![match wgmma {
                    Some(w) => f16.baseline(w.5, "wgmma, single launch, same call"),
                    None => f16,
                }]
            }
        };
        for f in &figures {
            report.write(f)?;
        }
    }
    Ok(())
}

/// One graph of COPIES traced scoring launches (each on its own copy of the cache), replayed
/// twice after an L2 flush: the second replay's middle launch, phase by phase, and how far apart
/// the launches start.
fn trace(
    stage: &Stage,
    stream: &device::Stream,
    flush: &device::probes::L2Flush,
    buffers: &LaunchBuffers,
    caches: &[device::Buffer<u8>],
    nominal_mhz: f64,
    name: &str,
) -> Result<String, Error> {
    let runs = buffers.plan.n_runs;
    let marks = (0..COPIES)
        .map(|_| stage.dev.alloc_zeroed::<u64>(indexer::trace::words(runs)))
        .collect::<Result<Vec<_>, _>>()?;
    stage.publish(stream, buffers, &caches[0], &caches[0])?;
    stream.begin_capture()?;
    for (cache, marks) in caches.iter().zip(&marks) {
        let mut args = buffers.stage(stage, cache, cache);
        args.trace = Some(marks);
        stage.kernels.score(stream, &args)?;
    }
    let graph = stream.end_capture()?;
    graph.upload(stream)?;
    for _ in 0..2 {
        flush.enqueue(&stage.dev, stream)?;
        graph.launch(stream)?;
    }
    stream.sync()?;
    let launches = marks
        .iter()
        .map(|m| Ok(indexer::trace::parse(&m.download()?, runs)))
        .collect::<Result<Vec<_>, Error>>()?;
    let middle = COPIES / 2;
    // Phases in us at the clock the SMs had (the nominal one is the highest boost).
    let clock = indexer::trace::percentiles(&indexer::trace::clock_mhz(&launches[middle]));
    let [c10, c50, c90] = clock.unwrap_or([nominal_mhz; 3]);
    let mut text = format!(
        "launch {middle} of {COPIES}, us since each CTA's start (p10 p50 p90) at {c50:.0} MHz:\n\
         SM clock (MHz)   {c10:>6.0} {c50:>6.0} {c90:>6.0} (nominal {nominal_mhz:.0})"
    );
    for (phase, [p10, p50, p90]) in indexer::trace::phases(&launches[middle], c50) {
        text += &format!("\n{phase:<16} {p10:>6.2} {p50:>6.2} {p90:>6.2}");
    }
    if let Ok(dir) = std::env::var("INDEXER_BENCH_TRACE_DIR") {
        let path = std::path::Path::new(&dir).join(format!("{name}.csv"));
        std::fs::write(&path, indexer::trace::csv(&launches[middle], c50))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let first_start = |l: &[indexer::trace::Warpgroup]| l.iter().map(|m| m.start_ns).min();
    let starts: Vec<u64> = launches.iter().filter_map(|l| first_start(l)).collect();
    let apart: Vec<String> = starts
        .windows(2)
        .map(|w| format!("{:.2}", (w[1] as f64 - w[0] as f64) / 1e3))
        .collect();
    text += &format!(
        "\nlaunches' first CTAs start apart (us): {}",
        apart.join(" ")
    );
    Ok(text)
}
