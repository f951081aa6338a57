//! One MoE layer of a GLM-5.2 TP-8 rank (256 experts, FP8 slices 6144 -> 2 x 256 -> 6144, the bf16
//! router, the shared expert) as one fused launch on the H200, at 1 and 4 rows: graph replays of 16
//! launches, the launches rotating over enough copies of the weights that every launch reads them
//! cold from HBM (and 256 MB read by `device::probes::L2Flush` before each replay, untimed), each
//! graph starting with the copies' epoch nodes; median of 10 replays per launch. Beside it, in the
//! same run: a copy kernel (`copy_16b`, 4 CTAs of 512 a SM) moving the same bytes (half read, half
//! written) as graph replays of 16 launches, and the floor (the bytes over the measured copy
//! bandwidth). The bytes are the weights one step must read: the router, the shared expert and the
//! distinct experts the step's rows chose (their count is printed), scales included. Figures also
//! go to device::report records. Prints "skipped" without a GPU. With `MOE_BENCH_STAMPS=1`, each
//! case also runs one launch of a build with the tile's clock stamps (`LIN_STAMPS`,
//! `kernels/ops/linear.h`) after its timing, and prints a line for the slots' gate/ups and one for
//! their downs (the pair tasks of used slots): each milestone's median and longest, us after the
//! tile's start (a gate/up's tile starts once the route has named its expert, a down's once its
//! gate/up has published). `MOE_BENCH_DEFINES=NAME=VALUE,...` builds the kernels with those defines
//! (the tile's and the tasks' knobs), for builds compared in one call; `MOE_BENCH_COLD_MB` caps the
//! megabytes of weight copies the launches rotate over (unset: a copy a launch).
//! `cargo bench -p executor --bench moe`

use device::report::{Figure, Reporter};
use device::timing::{median, ReplayTimer};
use device::{Args, Device, Launch, Stream};
use executor::fused::moe::{moe_source, MoeBuild, MoeGraph};
use executor::fused::{CtaShape, ENTRY};
use linear::gpu::{stamp_milestones, STAMP_MILESTONES, STAMP_WORDS};
use linear::layout::{pair_range, KIND_EXPERT_PAIR};
use mailbox::gpu::{EpochNode, Variant};
use mailbox::Tags;
use model::{ModelConfig, WeightFormat};
use moe::gpu::{DeviceMoe, MoeKernel};
use moe::layout::{lds_bytes, MoeStart};
use moe::memory::MoeMemory;
use moe::problem::{MoeProblem, Pattern};
use moe::reference::Routing;

type Error = Box<dyn std::error::Error>;

const LAUNCHES: usize = 16;
const TIMED: usize = 10;
/// Copies of `bytes` the launches of a graph rotate over: one a launch, so that each reads its
/// weights from HBM rather than from what an earlier launch left in L2 (three copies at one row and
/// one at four left the launch 7 % and 5 % faster from L2 hits); `MOE_BENCH_COLD_MB` caps them at that many
/// megabytes, to see what L2 hits are worth.
fn cold_copies(bytes: usize) -> usize {
    std::env::var("MOE_BENCH_COLD_MB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(LAUNCHES, |mb| (mb << 20).div_ceil(bytes))
        .clamp(1, LAUNCHES)
}
/// The most boxes a stamped launch may hold (a task writes its stamps at its first box's record).
const MAX_STAMPED_BOXES: usize = 1 << 16;

struct Bench {
    dev: Device,
    stream: Stream,
    timer: ReplayTimer,
    copy: device::Kernel,
    _copy_module: device::Module,
}

impl Bench {
    /// Microseconds a launch: median over replays of a graph of LAUNCHES launches from `issue`.
    fn graph_us(&self, issue: &dyn Fn(usize) -> Result<(), Error>) -> Result<f64, Error> {
        self.timer
            .launches_us(&self.dev, &self.stream, TIMED, LAUNCHES, issue)
    }

    /// The copy kernel moving `bytes` (half each way), sources rotated to stay cold.
    fn copy_us(&self, bytes: usize) -> Result<f64, Error> {
        let words = bytes / 32;
        let copies = cold_copies(words * 16);
        let src = self.dev.alloc_zeroed::<[u32; 4]>(words * copies)?;
        let dst = self.dev.alloc_zeroed::<[u32; 4]>(words)?;
        let launch = Launch::new(self.dev.info().multiprocessors * 4, 512);
        self.graph_us(&|i| {
            let a = Args::new()
                .u64(src.device_ptr() + ((i % copies) * words * 16) as u64)
                .buf(&dst)
                .u64(words as u64);
            Ok(self.stream.launch(&self.copy, launch, &a)?)
        })
    }
}

fn main() -> Result<(), Error> {
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("skipped: {e}");
            return Ok(());
        }
    };
    let reporter = Reporter::from_env(&dev.info().name);
    let bandwidth = device::probes::copy_bandwidth(&dev, 256 << 20)?.bytes_per_s;
    let copy_module = dev.build(&device::probes::copy_source())?;
    let shape = CtaShape::for_device(dev.info()).ok_or("no fused CTA shape for this device")?;
    let kernel = MoeKernel::from_source(
        &dev,
        &with_defines(moe_source(shape, Variant::default())?),
        ENTRY,
        shape.threads,
    )?;
    let epoch = EpochNode::build(&dev, Variant::default())?;
    // The stamped build and the buffer its tasks write (its address is built into the kernel).
    let stamped = if stamps() {
        let buf = dev.alloc_zeroed::<u64>(STAMP_WORDS * MAX_STAMPED_BOXES)?;
        let src = with_defines(moe_source(shape, Variant::default())?)
            .define("LIN_STAMPS", 1)
            .define("LIN_STAMP_BUF", buf.device_ptr());
        Some((
            MoeKernel::from_source(&dev, &src, ENTRY, shape.threads)?,
            buf,
        ))
    } else {
        None
    };
    let bench = Bench {
        stream: dev.new_stream()?,
        timer: ReplayTimer::new(&dev)?,
        copy: copy_module.kernel("copy_16b")?,
        _copy_module: copy_module,
        dev,
    };
    println!(
        "{}: copy bandwidth {:.2} TB/s (read + written); us a launch, graph replays, weights cold",
        bench.dev.info().name,
        bandwidth / 1e12
    );
    println!(
        "{:<6} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "rows", "experts", "MB", "floor", "copy", "fused", "x copy", "x floor"
    );
    let cfg = ModelConfig::preset("glm-5.2")?;
    let build = MoeBuild {
        ctas: bench.dev.info().multiprocessors,
        tp: 8,
    };
    for rows in [1, 4] {
        let g = MoeGraph::new(&cfg, rows, WeightFormat::Fp8, build, &MoeStart::default())?;
        let p = MoeProblem::new(g.shape, Routing::new(&cfg), Pattern::Random, 1)?;
        let mem = MoeMemory::new(&p, None)?;
        let lds = kernel.lds_budget(&bench.dev, lds_bytes(&g.shape, shape.threads)?)?;
        let first = DeviceMoe::new(&bench.dev, &kernel, &p, &mem, &g.plan, lds)?;
        first.launch(&bench.stream, &kernel, Tags::new(1)?, 0)?;
        bench.stream.sync()?;
        let mut distinct = first.read(&mem)?.row_experts;
        distinct.sort_unstable();
        distinct.dedup();
        let per_expert: u64 = mem.spans.expert_bytes.iter().map(|(w, s)| w + s).sum();
        let bytes = mem.fixed_weight_bytes + distinct.len() as u64 * per_expert;
        let copies = cold_copies(bytes as usize);
        let mut sets = vec![first];
        for _ in 1..copies {
            sets.push(DeviceMoe::new(&bench.dev, &kernel, &p, &mem, &g.plan, lds)?);
        }
        let tags = Tags::new(LAUNCHES as u32)?;
        let us = bench.graph_us(&|i| {
            if i == 0 {
                for d in &sets {
                    epoch.enqueue(&bench.stream, &d.epoch, &d.scratch, tags)?;
                }
            }
            Ok(sets[i % copies].launch(&bench.stream, &kernel, tags, i as u32)?)
        })?;
        let copy = bench.copy_us(bytes as usize)?;
        if let Some((k, buf)) = &stamped {
            if g.plan.end_box as usize > MAX_STAMPED_BOXES {
                return Err(format!(
                    "{} boxes: the stamps hold {MAX_STAMPED_BOXES}",
                    g.plan.end_box
                )
                .into());
            }
            let lds = k.lds_budget(&bench.dev, lds_bytes(&g.shape, shape.threads)?)?;
            let d = DeviceMoe::new(&bench.dev, k, &p, &mem, &g.plan, lds)?;
            // Its weights cold too, as the timed launches' are (the upload leaves some in L2).
            bench.timer.flush().enqueue(&bench.dev, &bench.stream)?;
            d.launch(&bench.stream, k, Tags::new(1)?, 0)?;
            bench.stream.sync()?;
            let words = buf.download()?;
            print_stamps(&g, &words, bench.dev.info().clock_khz);
        }
        let floor = bytes as f64 / bandwidth * 1e6;
        println!(
            "{rows:<6} {:>8} {:>9.2} {floor:>9.2} {copy:>9.2} {us:>9.2} {:>8.3} {:>8.3}",
            distinct.len(),
            bytes as f64 / 1e6,
            us / copy,
            us / floor
        );
        let case = format!(
            "GLM-5.2 TP8 x {rows} row{}",
            if rows == 1 { "" } else { "s" }
        );
        reporter.write(
            &Figure::new("MoE layer, fused launch", &case, "fused launch", us, "us")
                .floor(
                    floor,
                    "weights read (router, shared, chosen experts) / copy bandwidth",
                )
                .baseline(copy, "copy_16b of the same bytes, same graph replays")
                .note(&format!(
                    "{} distinct experts, {:.2} MB",
                    distinct.len(),
                    bytes as f64 / 1e6
                )),
        )?;
    }
    Ok(())
}

/// `MOE_BENCH_DEFINES=NAME=VALUE,...`: the kernels built with these defines (the tile's and the
/// tasks' knobs), for builds measured side by side in one call.
fn with_defines(mut src: device::KernelSource) -> device::KernelSource {
    let defines = std::env::var("MOE_BENCH_DEFINES").unwrap_or_default();
    for d in defines.split(',').filter(|d| !d.is_empty()) {
        let (name, value) = d.split_once('=').unwrap_or((d, "1"));
        src = src.define(name, value);
    }
    src
}

/// `MOE_BENCH_STAMPS=1`: the stamped launch after each case's timing.
fn stamps() -> bool {
    std::env::var("MOE_BENCH_STAMPS").is_ok_and(|v| v == "1")
}

/// The slots' gate/ups and downs (the two records of each pair task, at its first box's and the
/// next), the tasks of used slots (an unused slot's task publishes without a tile, so its tile
/// stamp is 0): each milestone of `LIN_STAMP_*` after the first (the tile's start), median and
/// longest in us (SM clock).
fn print_stamps(g: &MoeGraph, words: &[u64], khz: u32) {
    let us = |c: u64| c as f64 * 1e3 / f64::from(khz);
    // The tile's start (word 0) is where the others are counted from.
    let names = &STAMP_MILESTONES[1..];
    for (part, what, k) in [(0, "gate/up", g.shape.hidden), (1, "down", g.shape.inter)] {
        let mut cols: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
        let (mut tasks, mut tiles) = (0, Vec::new());
        for t in g.plan.placement.lists().iter().flatten() {
            if t.kind != KIND_EXPERT_PAIR {
                continue;
            }
            let Some(ticks) = stamp_milestones(words, t.out.first as usize + part) else {
                continue;
            };
            tasks += 1;
            tiles.push(f64::from(pair_range(t.args[1 + part]).count));
            for (col, tick) in cols.iter_mut().zip(ticks) {
                col.extend(tick.map(us));
            }
        }
        if tasks == 0 {
            continue;
        }
        // A tile: 16 packed rows of k FP8 codes and two scales a k-block.
        let tile_kb = (16 * k + 8 * (k / 128)) as f64 / 1024.0;
        let mut text = format!(
            "    stamps {what} ({tasks} tasks of used slots, {:.0} KB median): us after the tile's start",
            median(&tiles) * tile_kb
        );
        for (name, col) in names.iter().zip(cols) {
            if !col.is_empty() {
                let max = col.iter().copied().fold(0.0, f64::max);
                text += &format!(", {name} {:.2}/{max:.2}", median(&col));
            }
        }
        println!("{text}");
    }
}
