//! The attention half of a layer alone in one fused launch on the GPU, GLM-5 TP8 (8 heads,
//! k = 2048, FP8 weights of q_a, kv_a, q_b and o_proj, bf16 W_UK / W_UV, FP8 cache records),
//! 1 row and 4 verify rows at 8K: graph replays of the epoch node and the launch, L2 flushed before
//! each (256 MB read by `device::probes::L2Flush`, untimed), median of 20. Beside it in the same
//! run: the same kernel over empty task lists (what the launch costs), a copy kernel (`copy_16b`)
//! moving the same bytes as the half reads (half read, half written) in the same graph mode, and
//! the floor (those bytes over the measured copy bandwidth). Then one traced launch (`MBX_TRACE`):
//! each kind's task times from the in-kernel timeline, and when the last of each kind ends. Figures
//! also as `device::report` records. Prints "skipped" without a GPU.
//! `cargo bench -p executor --bench half`

#[path = "../tests/support/mod.rs"]
mod support;

use device::report::{Figure, Reporter};
use device::timing::{median, ReplayTimer};
use device::{Args, Device, Launch};
use executor::fused::attention::{HalfBuild, HalfDims};
use mailbox::gpu::{DeviceTable, LaunchTable, Variant};
use mailbox::trace::{decode, kind_name};
use mailbox::Placement;
use mla::layout::SplitChoice;
use model::{CacheFormat, ModelConfig};
use support::half::{Case, Pick, Request, Twist, Weights};
use support::half_gpu::{Error, GpuHalf, GpuKernel};

const TIMED: usize = 20;
/// The GPU test's tolerance (`tests/gpu_half.rs`): a case whose output misses it is not timed.
const TOLERANCE: f64 = 3e-2;
const TOPK: usize = 2048;

fn main() -> Result<(), Error> {
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("attention half bench skipped: {e}");
            return Ok(());
        }
    };
    let reporter = Reporter::from_env(&dev.info().name);
    let d = HalfDims::new(&ModelConfig::preset("glm-5")?, 8, CacheFormat::Fp8)?;
    let build = HalfBuild {
        topk: TOPK as u32,
        union: 128,
        choice: SplitChoice::MEASURED_FASTEST,
    };
    let attend = d.attend_shape(build.union)?;
    let k = GpuKernel::build(&dev, &attend, d.rope_style, Variant::default(), false)?;
    let traced = GpuKernel::build(&dev, &attend, d.rope_style, Variant::default(), true)?;
    let bandwidth = device::probes::copy_bandwidth(&dev, 256 << 20)?.bytes_per_s;
    let copy_module = dev.build(&device::probes::copy_source())?;
    let copy = copy_module.kernel("copy_16b")?;
    let timer = ReplayTimer::new(&dev)?;
    let stream = dev.new_stream()?;
    let graph_us = |issue: &dyn Fn() -> Result<(), Error>| -> Result<f64, Error> {
        Ok(timer.capture_median_ms(&dev, &stream, TIMED, issue)? * 1e3)
    };
    println!(
        "{}: copy bandwidth {:.2} TB/s; us a step (graph replay, L2 flushed)",
        dev.info().name,
        bandwidth / 1e12
    );
    println!(
        "{:<16} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "case", "MB", "floor", "copy", "launch", "half", "x copy", "x floor"
    );
    let w = Weights::new(&d, 1);
    for (name, rows) in [("1 row 8K", 1usize), ("4 verify rows 8K", 4)] {
        let case = Case::new(
            &d,
            &w,
            TOPK,
            &[Request {
                context: 8192 - rows,
                rows,
            }],
            Pick::Random,
            Twist::None,
            3,
        );
        let half = GpuHalf::new(&dev, &k, &case, &w, build, None, None)?;
        let out = half.run(&dev, &k)?;
        let err = case.error(&out);
        if err >= TOLERANCE {
            return Err(format!("{name}: error {err:.2e} against the reference; not timed").into());
        }
        let us = graph_us(&|| half.enqueue(&stream, &k, None))?;
        // The launch alone: the same kernel, grid and shared memory over lists with no tasks.
        let empty = DeviceTable::upload_unchecked(
            &dev,
            &Placement::new(vec![Vec::new(); half.table.ctas as usize]),
        )?;
        let launch_us = graph_us(&|| {
            k.epoch
                .enqueue(&stream, &half.epoch, &half.scratch, half.tags)?;
            let table =
                LaunchTable::new(&empty, &half.scratch, &half.epoch, &half.diag, half.tags, 0)?;
            let launch = Launch::new(empty.ctas, k.shape.threads).shared(half.lds);
            let args = Args::new().value(&table).value(&half.lin).value(&half.mla);
            Ok(stream.launch(&k.kernel, launch, &args)?)
        })?;
        let record = d.cache_layout()?.bytes_per_token() as u64;
        let bytes = half.weight_bytes + (rows * TOPK) as u64 * record;
        let words = (bytes / 32) as usize;
        let src = dev.alloc_zeroed::<[u32; 4]>(words)?;
        let dst = dev.alloc_zeroed::<[u32; 4]>(words)?;
        let copy_us = graph_us(&|| {
            let a = Args::new().buf(&src).buf(&dst).u64(words as u64);
            let launch = Launch::new(dev.info().multiprocessors * 4, 512);
            Ok(stream.launch(&copy, launch, &a)?)
        })?;
        let floor = bytes as f64 / bandwidth * 1e6;
        println!(
            "{name:<16} {:>8.2} {floor:>9.2} {copy_us:>9.2} {launch_us:>9.2} {us:>9.2} {:>8.3} {:>8.3}   (error {err:.1e})",
            bytes as f64 / 1e6,
            us / copy_us,
            us / floor
        );
        reporter.write(
            &Figure::new("attention half", name, "fused launch", us, "us")
                .floor(
                    floor,
                    "weights + selected cache records, over copy bandwidth",
                )
                .baseline(
                    copy_us,
                    "copy_16b of the same bytes, graph replays, L2 flushed",
                )
                .note(&format!(
                    "empty launch {launch_us:.2} us; GLM-5 TP8, FP8 cache"
                )),
        )?;
        // The timeline of one traced launch.
        let th = GpuHalf::new(&dev, &traced, &case, &w, build, None, None)?;
        let trace = th.table.trace_buffer(&dev)?;
        let s = dev.stream();
        th.enqueue(s, &traced, Some(&trace))?;
        s.sync()?;
        let spans = decode(&th.launch.placement.placement().table(), &trace.download()?)?.spans;
        let t0_ns = spans.iter().map(|s| s.start_ns).min().unwrap_or(0);
        let mut kinds: Vec<u32> = spans.iter().map(|s| s.kind).collect();
        kinds.sort_unstable();
        kinds.dedup();
        println!("  timeline ({name}): span {:.2} us", {
            let end = spans.iter().map(|s| s.end_ns).max().unwrap_or(0);
            (end - t0_ns) as f64 / 1e3
        });
        println!(
            "  {:<12} {:>6} {:>10} {:>10} {:>12} {:>12}",
            "kind", "tasks", "median us", "max us", "first start", "last end"
        );
        for kind in kinds {
            let mine: Vec<_> = spans.iter().filter(|s| s.kind == kind).collect();
            let dur: Vec<f64> = mine
                .iter()
                .map(|s| (s.end_ns - s.start_ns) as f64 / 1e3)
                .collect();
            let start = mine.iter().map(|s| s.start_ns).min().unwrap_or(0) - t0_ns;
            let end = mine.iter().map(|s| s.end_ns).max().unwrap_or(0) - t0_ns;
            println!(
                "  {:<12} {:>6} {:>10.2} {:>10.2} {:>12.2} {:>12.2}",
                kind_name(kind),
                mine.len(),
                median(&dur),
                dur.iter().copied().fold(0.0, f64::max),
                start as f64 / 1e3,
                end as f64 / 1e3
            );
        }
    }
    Ok(())
}
