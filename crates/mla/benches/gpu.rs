//! Sparse MLA attention on the GPU at GLM-5 TP8 shapes (8 heads, k = 2048, FP8 records): 1 row and
//! 4 verify rows of one request, at 8K and 128K contexts. Each figure is the median of 30 graph
//! replays, the L2 flushed (256 MB read by `device::probes::L2Flush`) before each: "step us" is a
//! graph of the epoch node, the slot stand-in and the attention launch; "attention us" is that
//! minus the same graph without the attention launch. Beside it the floor (the distinct selected
//! records' bytes over the copy bandwidth measured in the same run) and "copy us", a graph of one
//! copy kernel moving those bytes (read and written once), timed the same way. "launch us" is the
//! attention kernel over task lists with no tasks on as many CTAs (the same threads and shared
//! memory), timed as "attention us" is: what a launch costs before any task runs. "in-launch us" is
//! the median over replays of a trace build's span, the global timer from the first task's start to
//! the last one's end (a tick is about 1 us); after each case, the trace build's per-phase table.
//! With `MONO_BENCH_JSON` set, each case's attention figure is also a record (`device::report`;
//! table "mla attention", the floor and the copy beside it, the launch and in-launch times in its
//! note) for BENCHMARKS.md.
//! `cargo bench -p mla --bench gpu` on a GPU machine; prints "skipped" without one.

#[path = "../tests/support/mod.rs"]
mod support;

use device::report::{keys_label, Figure, Reporter};
use device::timing::{median, ReplayTimer};
use device::{probes, Args, Device, Launch};
use mla::layout::SplitChoice;
use mla::trace::Timeline;
use model::CacheFormat;
use support::{choice, kernel, shape, Attend, GpuScene, Pick, Request, Scene, PLAIN};

const TOPK: usize = 2048;
const TIMED: usize = 30;

/// The rows of each case and how its attention is cut: the tests' choice first, then the others
/// measured beside it (more or fewer slots a split, fewer rows a group, a combine a row).
fn cases() -> Vec<(usize, SplitChoice)> {
    let c = |group_rows, block, combine_queries| SplitChoice {
        group_rows,
        block,
        combine_queries,
    };
    vec![
        (1, choice(8)),
        (1, c(4, 128, 1)),
        (1, c(4, 32, 1)),
        (1, c(4, 64, 8)),
        (4, choice(8)),
        (4, c(2, 64, 1)),
        (4, c(1, 128, 1)),
        (4, c(1, 64, 1)),
        (4, c(4, 32, 8)),
    ]
}

fn main() -> Result<(), support::Error> {
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("mla gpu bench skipped: {e}");
            return Ok(());
        }
    };
    let report = Reporter::from_env(&dev.info().name);
    let bw = probes::copy_bandwidth(&dev, 256 << 20)?;
    println!("copy bandwidth {:.0} GB/s", bw.bytes_per_s / 1e9);
    let timer = ReplayTimer::new(&dev)?;
    let copy_module = dev.build(&probes::copy_source())?;
    let copy = copy_module.kernel("copy_16b")?;
    let stream = dev.new_stream()?;
    let timed = |graph: &device::Graph| -> Result<f64, support::Error> {
        graph.upload(&stream)?;
        // Three replays untimed: the timer's own and two more.
        let ms = timer.replays_ms(&dev, &stream, graph, TIMED + 2, |_| {
            Ok::<(), support::Error>(())
        })?;
        Ok(median(&ms[2..]) * 1e3)
    };
    let mut timelines = Vec::new();
    println!(
        "| rows | group rows, block, combine queries | context | distinct slots | MB | step us | attention us | launch us | in-launch us | floor us | copy us |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for context in [8192usize, 131_072] {
        let mut scenes = std::collections::BTreeMap::new();
        for (rows, choice) in cases() {
            if let std::collections::btree_map::Entry::Vacant(slot) = scenes.entry(rows) {
                slot.insert(Scene::new(
                    shape(CacheFormat::Fp8, 8),
                    TOPK,
                    &[Request { context, rows }],
                    Pick::Random,
                    PLAIN,
                    5,
                )?);
            }
            let scene = scenes[&rows].clone().replan(choice)?;
            let g = GpuScene::new(
                &dev,
                kernel(&dev, scene.shape, false, false)?,
                &scene,
                None,
                None,
            )?;
            let with = g.graph(&stream, TOPK as u32, Attend::Tasks)?;
            let without = g.graph(&stream, TOPK as u32, Attend::No)?;
            let empty = g.graph(&stream, TOPK as u32, Attend::Empty)?;
            let step = timed(&with)?;
            let base = timed(&without)?;
            let launch = timed(&empty)? - base;
            let err = scene.error(&g.out.download()?);
            let t = GpuScene::new(
                &dev,
                kernel(&dev, scene.shape, false, true)?,
                &scene,
                None,
                None,
            )?
            .traced(&dev)?;
            let traced = t.graph(&stream, TOPK as u32, Attend::Tasks)?;
            traced.upload(&stream)?;
            let (mut spans, mut timeline) = (Vec::new(), None);
            for _ in 0..TIMED {
                timer.flush().enqueue(&dev, &stream)?;
                traced.launch(&stream)?;
                stream.sync()?;
                let tl = Timeline::parse(&t.trace.as_ref().expect("traced").download()?);
                spans.push(tl.span_ns() as f64 / 1e3);
                timeline = Some(tl);
            }
            let in_launch = median(&spans);
            let traced_err = scene.error(&t.out.download()?);
            let bytes = scene.distinct_slots * scene.shape.cache.bytes_per_token();
            let words = bytes.div_ceil(16);
            let src = dev.alloc_zeroed::<[u32; 4]>(words)?;
            let dst = dev.alloc_zeroed::<[u32; 4]>(words)?;
            stream.begin_capture()?;
            stream.launch(
                &copy,
                Launch::new(dev.info().multiprocessors * 4, 512),
                &Args::new().buf(&src).buf(&dst).u64(words as u64),
            )?;
            let copy_graph = stream.end_capture()?;
            let copy_us = timed(&copy_graph)?;
            let floor = 2.0 * bytes as f64 / bw.bytes_per_s * 1e6 / 2.0;
            println!(
                "| {rows} | {}, {}, {} | {context} | {} | {:.2} | {step:.2} | {:.2} | {launch:.2} | {in_launch:.2} | {floor:.2} | {copy_us:.2} |  (error {err:.1e}, traced {traced_err:.1e}, {} splits, {} combines)",
                choice.group_rows,
                choice.block,
                choice.combine_queries,
                scene.distinct_slots,
                bytes as f64 / 1e6,
                step - base,
                scene.plan.splits(),
                scene.plan.combines(),
            );
            let case = format!(
                "{} context x {rows} {}",
                keys_label(context as u64),
                if rows == 1 { "row" } else { "verify rows" }
            );
            let what = format!(
                "graph replay, groups of {} rows, {} slots a split, {} queries a combine",
                choice.group_rows, choice.block, choice.combine_queries
            );
            report.write(
                &Figure::new("mla attention", &case, &what, step - base, "us")
                    .floor(floor, "distinct records' bytes at the measured copy bandwidth")
                    .baseline(copy_us, "copy of the same bytes, one graph")
                    .note(&format!(
                        "launch over empty task lists {launch:.2} us, in-launch span {in_launch:.2} us"
                    )),
            )?;
            timelines.push((rows, choice, context, timeline.expect("replayed")));
        }
    }
    for (rows, choice, context, tl) in timelines {
        println!(
            "\n{rows} rows ({choice:?}), context {context}: the trace build's last replay, SM cycles at {} MHz; span {:.2} us",
            dev.info().clock_khz / 1000,
            tl.span_ns() as f64 / 1e3
        );
        print!("{}", tl.table(dev.info().clock_khz));
    }
    Ok(())
}
