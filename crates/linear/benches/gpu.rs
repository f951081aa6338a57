//! The linear task on the GPU at a GLM-5.2 TP-8 rank's matrices (`linear::shapes`), 1, 4 and 16
//! rows (lm_head 1 and 4): each alone over every SM; q_a, o_proj, an expert's gate/up and its down
//! as one chain (each waiting on the one before it); and the nine expert slices of one MoE layer (8
//! routed + the shared one: nine gate/up matrices, then nine downs each waiting on its gate/up)
//! with the router as one persistent launch. Tasks are placed by `layout::place_weighted`, and each
//! CTA gets all the shared memory the device allows (`LinearKernel::lds_budget`). Graph replays of
//! 16 launches, the weights rotated among enough copies to exceed 128 MB (cold in L2; 256 MB read
//! by `device::probes::L2Flush` before each replay, untimed), median of 10 replays per launch;
//! beside each, in the same run: a copy kernel (`copy_16b`, 4 CTAs of 512 a SM) moving the same
//! bytes (half read, half written) as graph replays of 16 launches, and the floor (bytes over the
//! measured copy bandwidth). A chain's graph starts with the mailbox's epoch node (its tasks wait
//! on boxes, which need a new tag each replay); the single matrices' do not.
//!
//! Then the timeline of one launch of each case from a kernel built with the mailbox trace: the
//! in-launch span (first task start to last end), the tasks' median and longest run, and when
//! the waiting tasks started and ended. With `MONO_TRACE_DIR` set, the 9-expert launches'
//! timelines are also written there as Chrome traces. With `MONO_BENCH_JSON` set, each figure is
//! also a record (`device::report`). Measurement options (`LIN_BENCH_*`: several builds beside
//! one copy baseline, the tile's clock stamps, a subset of cases) are documented at their readers
//! below and in PERF.md. Prints "skipped" without a GPU.
//! `cargo bench -p linear --bench gpu`

use device::report::{Figure, Reporter};
use device::timing::{median, ReplayTimer};
use device::{Args, Buffer, Device, Launch, Stream};
use linear::cases::{Pattern, Problem};
use linear::gpu::{
    source, DevicePlan, DeviceProblem, LinMatrix, LinearKernel, STAMP_MILESTONES, STAMP_WORDS,
};
use linear::layout::{lds_bytes, place_weighted, LaunchPlan, MatrixPlan};
use linear::shapes::{rank_matrices, RankMatrix};
use mailbox::gpu::{EpochNode, Variant};
use mailbox::trace::{self, CycleClock, TimeBase, Timeline};
use mailbox::{Tags, TaskTable};
use model::weights::packed::PackedWeight;

type Error = Box<dyn std::error::Error>;

const LAUNCHES: usize = 16;
const TIMED: usize = 10;
const COLD_BYTES: usize = 128 << 20;
const TABLE: &str = "linear (GLM-5.2 TP8 rank's matrices)";
const WHAT: &str = "linear task, graph replays, weights cold in L2";
const COPY: &str = "copy kernel moving the same bytes, same launch mode";
/// The most tasks a traced launch stamps.
const MAX_TASKS: usize = 4096;
/// Records the stamps buffer holds: one a box, since a task writes its record at its first box's.
const MAX_STAMP_RECORDS: usize = MAX_TASKS * mailbox::layout::BOXES_PER_LINE as usize;

/// One matrix of a launch: its problem, packed weight and the matrix it waits on.
struct Part<'a> {
    problem: Problem,
    packed: &'a PackedWeight,
    after: Option<usize>,
}

/// One build of the kernel (`LIN_BENCH_VARIANTS`): its name, plain and traced.
struct Build {
    name: String,
    kernel: LinearKernel,
    traced: LinearKernel,
}

struct Bench {
    dev: Device,
    stream: Stream,
    timer: ReplayTimer,
    builds: Vec<Build>,
    /// `LIN_STAMP_BUF` of the traced builds: LIN_STAMP_WORDS a task, at its first box's record.
    stamps: Buffer<u64>,
    lds: u32,
    copy: device::Kernel,
    _copy_module: device::Module,
    epoch: EpochNode,
    bandwidth: f64,
    report: Reporter,
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
        let copies = COLD_BYTES.div_ceil(words * 16).clamp(1, LAUNCHES);
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

    /// The launch's placement over every SM, by bytes.
    fn plan(&self, parts: &[Part]) -> Result<LaunchPlan, Error> {
        let plans: Vec<MatrixPlan> = parts
            .iter()
            .map(|p| MatrixPlan {
                tiles: p.packed.layout.tiles() as u32,
                after: p.after,
            })
            .collect();
        let tile_bytes: Vec<u64> = parts.iter().map(|p| tile_bytes(p.packed)).collect();
        Ok(place_weighted(
            &plans,
            &tile_bytes,
            self.dev.info().multiprocessors,
        )?)
    }

    /// Every part uploaded once, its x the y of the part it waits on.
    fn upload(&self, parts: &[Part]) -> Result<Vec<DeviceProblem>, Error> {
        let mut bufs: Vec<DeviceProblem> = Vec::new();
        for p in parts {
            let mut b = DeviceProblem::upload(&self.dev, &p.problem, p.packed)?;
            if let Some(a) = p.after {
                b.matrix.x = bufs[a].y.device_ptr();
                b.matrix.x_stride = bufs[a].matrix.y_stride;
            }
            bufs.push(b);
        }
        Ok(bufs)
    }

    /// One launch of `parts` by `kernel`, weights in enough copies to be cold: us a launch and
    /// bytes.
    fn linear_us(&self, kernel: &LinearKernel, parts: &[Part]) -> Result<(f64, usize), Error> {
        let bytes: usize = parts.iter().map(|p| weight_bytes(p.packed)).sum();
        let copies = COLD_BYTES.div_ceil(bytes).clamp(1, LAUNCHES);
        self.check_lds(kernel, parts)?;
        let mut sets: Vec<(Vec<DeviceProblem>, Buffer<LinMatrix>)> = Vec::new();
        for _ in 0..copies {
            let bufs = self.upload(parts)?;
            let mut mats: Vec<LinMatrix> = bufs.iter().map(|b| b.matrix).collect();
            if x_warm() {
                // Every copy reads the first copy's x rows (and residual), which stay in L2 as a
                // step's activations would.
                if let Some((first, _)) = sets.first() {
                    for (m, (mat, b)) in mats.iter_mut().zip(first.iter()).enumerate() {
                        if parts[m].after.is_none() {
                            mat.x = b.matrix.x;
                        }
                        mat.residual = b.matrix.residual;
                    }
                }
            }
            let mats = self.dev.upload(&mats)?;
            sets.push((bufs, mats));
        }
        let plan = self.plan(parts)?;
        let first: Vec<LinMatrix> = sets[0].0.iter().map(|b| b.matrix).collect();
        let on_device = DevicePlan::new(&self.dev, kernel, &plan, &first, self.lds)?;
        let waits = parts.iter().any(|p| p.after.is_some());
        let tags = Tags::new(LAUNCHES as u32)?;
        let us = self.graph_us(&|i| {
            if waits && i == 0 {
                self.epoch
                    .enqueue(&self.stream, &on_device.epoch, &on_device.scratch, tags)?;
            }
            let mats = &sets[i % copies].1;
            Ok(on_device.launch_with(&self.stream, kernel, tags, i as u32, mats)?)
        })?;
        Ok((us, bytes))
    }

    fn check_lds(&self, kernel: &LinearKernel, parts: &[Part]) -> Result<(), Error> {
        for p in parts {
            let need = lds_bytes(kernel.threads(), p.problem.k, p.problem.rows)?;
            if need > self.lds {
                return Err(format!(
                    "{}: {need} bytes of LDS, {} given",
                    p.problem.name, self.lds
                )
                .into());
            }
        }
        Ok(())
    }

    /// The timeline of one launch by `traced` (the L2 flushed first), summarised in one line.
    fn timeline(&self, traced: &LinearKernel, name: &str, parts: &[Part]) -> Result<String, Error> {
        let bufs = self.upload(parts)?;
        let plan = self.plan(parts)?;
        let mats: Vec<LinMatrix> = bufs.iter().map(|b| b.matrix).collect();
        let on_device = DevicePlan::new(&self.dev, traced, &plan, &mats, self.lds)?;
        let buffer = on_device.table.trace_buffer(&self.dev)?;
        let tags = Tags::new(1)?;
        for _ in 0..2 {
            self.epoch
                .enqueue(&self.stream, &on_device.epoch, &on_device.scratch, tags)?;
            self.timer.flush().enqueue(&self.dev, &self.stream)?;
            self.stream
                .memset(self.stamps.device_ptr(), 0, self.stamps.bytes())?;
            on_device.launch_traced(&self.stream, traced, tags, 0, &buffer)?;
            self.stream.sync()?;
        }
        let decoded = trace::decode(&plan.placement.table(), &buffer.download()?)?;
        let base = CycleClock::from_khz(self.dev.info().clock_khz)
            .map_or(TimeBase::Timer, TimeBase::Cycles);
        let line = Timeline::new(&decoded, base, name, &|k| trace::kind_name(k));
        if let Ok(dir) = std::env::var("MONO_TRACE_DIR") {
            if name.starts_with("9 experts") {
                let file = format!("{dir}/{}.json", name.replace([' ', ','], "_"));
                std::fs::write(file, trace::chrome::json(&line))?;
            }
        }
        let waiting = |position: u32| {
            let task = &plan.placement.table().tasks[position as usize];
            parts[task.args[0] as usize].after.is_some()
        };
        if stamps() {
            let words = self.stamps.download()?;
            let table = plan.placement.table();
            text_stamps(&line, &table, parts, &words, self.dev.info().clock_khz);
        }
        let runs: Vec<f64> = line.bars.iter().map(|b| b.end_us - b.start_us).collect();
        let longest = runs.iter().copied().fold(0.0, f64::max);
        let mut text = format!(
            "span {:.2} us, {} tasks: median {:.2} us, longest {:.2} us",
            line.end_us(),
            runs.len(),
            median(&runs),
            longest
        );
        let firsts: Vec<f64> = (0..line.ctas)
            .filter_map(|c| {
                line.bars
                    .iter()
                    .filter(|b| b.span.cta == c)
                    .map(|b| b.start_us)
                    .reduce(f64::min)
            })
            .collect();
        if !firsts.is_empty() {
            let last = firsts.iter().copied().fold(0.0, f64::max);
            text += &format!("; CTAs' first task from 0 to {last:.2} us");
        }
        let (free, wait): (Vec<_>, Vec<_>) =
            line.bars.iter().partition(|b| !waiting(b.span.position));
        if !wait.is_empty() {
            let free_end = free.iter().map(|b| b.end_us).fold(0.0, f64::max);
            let starts: Vec<f64> = wait.iter().map(|b| b.start_us).collect();
            let wait_end = wait.iter().map(|b| b.end_us).fold(0.0, f64::max);
            text += &format!(
                "; tasks that wait on none end by {free_end:.2} us, the waiting ones start at {:.2} us (median) and end by {wait_end:.2} us",
                median(&starts)
            );
        }
        Ok(text)
    }

    /// The case by every build, beside one copy baseline; only the `default` build (no defines
    /// of its own) writes records.
    fn line(&self, name: &str, rows: usize, parts: &[Part]) -> Result<(), Error> {
        if !wanted(name) {
            return Ok(());
        }
        let bytes: usize = parts.iter().map(|p| weight_bytes(p.packed)).sum();
        let copy = self.copy_us(bytes)?;
        let floor = bytes as f64 / self.bandwidth * 1e6;
        for build in &self.builds {
            let (us, _) = self.linear_us(&build.kernel, parts)?;
            let timeline = self.timeline(&build.traced, name, parts)?;
            println!(
                "{:<40} {rows:>4} {:>9.2} {floor:>9.2} {copy:>9.2} {us:>9.2} {:>8.3} {:>8.3}",
                format!("{name} [{}]", build.name),
                bytes as f64 / 1e6,
                us / copy,
                us / floor
            );
            println!("    timeline: {timeline}");
            if build.name != "default" {
                continue;
            }
            let case = format!(
                "{name}, {rows} row{}, {:.2} MB",
                if rows == 1 { "" } else { "s" },
                bytes as f64 / 1e6
            );
            let how = format!(
                "weight bytes over the copy bandwidth measured in the same call ({:.2} TB/s)",
                self.bandwidth / 1e12
            );
            self.report.write(
                &Figure::new(TABLE, &case, WHAT, us, "us")
                    .floor(floor, &how)
                    .baseline(copy, COPY)
                    .note(&format!(
                        "{:.2} x the copy; one traced launch: {timeline}",
                        us / copy
                    )),
            )?;
        }
        Ok(())
    }
}

/// `LIN_BENCH_DEFINES` (`NAME=VALUE,...`): defines every kernel of the run is built with (the
/// tile's and the task's measurement knobs, `kernels/ops/linear.h`, `kernels/lin_task.h`).
fn defines() -> Vec<(String, i64)> {
    parse_defines(&std::env::var("LIN_BENCH_DEFINES").unwrap_or_default())
}

/// `LIN_BENCH_VARIANTS` (`NAME:DEFINES;NAME:DEFINES...`, DEFINES as `LIN_BENCH_DEFINES`): the
/// builds each case runs on, beside one copy baseline. Without it, one build named `default`.
fn variants() -> Vec<(String, Vec<(String, i64)>)> {
    match std::env::var("LIN_BENCH_VARIANTS") {
        Ok(v) if !v.trim().is_empty() => v
            .split(';')
            .map(|b| {
                let (name, defs) = b.split_once(':').unwrap_or((b, ""));
                (name.trim().to_string(), parse_defines(defs))
            })
            .collect(),
        _ => vec![("default".into(), Vec::new())],
    }
}

fn parse_defines(list: &str) -> Vec<(String, i64)> {
    list.split(',')
        .filter_map(|d| {
            let (name, value) = d.split_once('=')?;
            Some((name.trim().to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// `LIN_BENCH_X=warm`: every replayed launch reads one copy of x and the residual (warm in L2, as
/// a step's activations are); otherwise each copy of the weights has its own (cold).
fn x_warm() -> bool {
    std::env::var("LIN_BENCH_X").is_ok_and(|v| v == "warm")
}

/// `LIN_BENCH_STAMPS=1`: the traced launch also writes the tile's clock stamps (`LIN_STAMPS`).
fn stamps() -> bool {
    std::env::var("LIN_BENCH_STAMPS").is_ok_and(|v| v == "1")
}

/// `LIN_BENCH_CASES` (name prefixes, separated by `;`): only those cases.
fn wanted(name: &str) -> bool {
    std::env::var("LIN_BENCH_CASES")
        .map_or(true, |v| v.split(';').any(|c| name.starts_with(c.trim())))
}

/// Bytes a launch streams for a packed weight: codes (or bf16) and scales.
fn weight_bytes(w: &PackedWeight) -> usize {
    w.bytes.len() + 4 * w.scales.len()
}

fn tile_bytes(w: &PackedWeight) -> u64 {
    (weight_bytes(w) / w.layout.tiles()) as u64
}

/// The problem of `m` at `rows`, seeded by `seed` (the weights depend on the seed alone).
fn problem(m: &RankMatrix, rows: usize, seed: u64) -> Result<Problem, Error> {
    Ok(Problem::new(
        Pattern::Random,
        m.format,
        m.pairing,
        m.n,
        m.k,
        rows,
        m.finish,
        seed,
    )?)
}

/// Matrices and their packed weights, made once for every row count.
struct Weights {
    matrices: Vec<RankMatrix>,
    /// None for a matrix no wanted case reads (lm_head, unless asked for).
    packed: Vec<Option<PackedWeight>>,
    /// Nine gate/ups, nine downs.
    experts: Vec<PackedWeight>,
}

impl Weights {
    fn new() -> Result<Self, Error> {
        let matrices = rank_matrices("glm-5.2", 8)?;
        let packed = matrices
            .iter()
            .map(|m| {
                if m.name == "lm_head" && !wanted(m.name) {
                    return Ok(None);
                }
                Ok(Some(problem(m, 1, 1)?.packed()?))
            })
            .collect::<Result<_, Error>>()?;
        let (gu, down) = (&matrices[2], &matrices[3]);
        let mut experts = Vec::new();
        for (m, seed) in (0..9)
            .map(|e| (gu, e))
            .chain((0..9).map(|e| (down, 100 + e)))
        {
            experts.push(problem(m, 1, seed)?.packed()?);
        }
        Ok(Weights {
            matrices,
            packed,
            experts,
        })
    }

    fn part(&self, i: usize, rows: usize, after: Option<usize>) -> Result<Part<'_>, Error> {
        let packed = self.packed[i]
            .as_ref()
            .ok_or_else(|| format!("{} was not packed", self.matrices[i].name))?;
        Ok(Part {
            problem: problem(&self.matrices[i], rows, 1)?,
            packed,
            after,
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
    let bandwidth = device::probes::copy_bandwidth(&dev, 256 << 20)?.bytes_per_s;
    let copy_module = dev.build(&device::probes::copy_source())?;
    let stamps_buf = dev.alloc_zeroed::<u64>(STAMP_WORDS * MAX_STAMP_RECORDS)?;
    let mut sources = Vec::new();
    for (name, own) in variants() {
        let with_defines = |mut src: device::KernelSource| {
            for (d, value) in defines().into_iter().chain(own.iter().cloned()) {
                src = src.define(&d, value);
            }
            src
        };
        let plain = with_defines(source(512, Variant::default()));
        let mut traced = with_defines(trace::traced(source(512, Variant::default())));
        if stamps() {
            traced = traced
                .define("LIN_STAMPS", 1)
                .define("LIN_STAMP_BUF", stamps_buf.device_ptr());
        }
        sources.push((name, plain, traced));
    }
    dev.prewarm(
        &sources
            .iter()
            .flat_map(|(_, p, t)| [p, t])
            .collect::<Vec<_>>(),
    );
    let mut builds = Vec::new();
    for (name, plain, traced) in sources {
        builds.push(Build {
            name,
            kernel: LinearKernel::build_source(&dev, 512, plain)?,
            traced: LinearKernel::build_source(&dev, 512, traced)?,
        });
    }
    let mut lds = u32::MAX;
    for b in &builds {
        lds = lds
            .min(b.kernel.lds_budget(&dev)?)
            .min(b.traced.lds_budget(&dev)?);
    }
    let bench = Bench {
        stream: dev.new_stream()?,
        timer: ReplayTimer::new(&dev)?,
        builds,
        stamps: stamps_buf,
        lds,
        copy: copy_module.kernel("copy_16b")?,
        _copy_module: copy_module,
        epoch: EpochNode::build(&dev, Variant::default())?,
        bandwidth,
        report: Reporter::from_env(&format!(
            "{} ({} SMs), {}",
            dev.info().name,
            dev.info().multiprocessors,
            dev.info().driver_version
        )),
        dev,
    };
    println!(
        "{}: copy bandwidth {:.2} TB/s (read + written); us a launch, graph replays, weights cold; {} bytes of LDS a CTA",
        bench.dev.info().name,
        bandwidth / 1e12,
        bench.lds
    );
    println!(
        "{:<28} {:>4} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "matrix", "rows", "MB", "floor", "copy", "linear", "x copy", "x floor"
    );
    let w = Weights::new()?;
    let only: Option<Vec<usize>> = std::env::var("LIN_BENCH_ROWS")
        .ok()
        .map(|v| v.split(',').filter_map(|r| r.parse().ok()).collect());
    for rows in [1, 4, 16] {
        if only.as_ref().is_some_and(|o| !o.contains(&rows)) {
            continue;
        }
        for (i, m) in w.matrices.iter().enumerate() {
            if (rows > 4 && m.name == "lm_head") || !wanted(m.name) {
                continue;
            }
            bench.line(m.name, rows, &[w.part(i, rows, None)?])?;
        }
        // q_a, o_proj, an expert's gate/up and its down, each waiting on the one before it (q_a's
        // y is wider than o_proj's k: o_proj reads its first columns).
        let chain: Vec<Part> = [0usize, 1, 2, 3]
            .iter()
            .enumerate()
            .map(|(n, &i)| w.part(i, rows, n.checked_sub(1)))
            .collect::<Result<_, _>>()?;
        if chain_fits(&chain) {
            bench.line("q_a, o_proj, gate/up, down chain", rows, &chain)?;
        }
        // The nine expert slices of a MoE layer and the router: gate/up 0..9, the router, then
        // down e after gate/up e.
        let (gu, down) = (&w.matrices[2], &w.matrices[3]);
        let mut layer = Vec::new();
        for e in 0..9 {
            layer.push(Part {
                problem: problem(gu, rows, e as u64)?,
                packed: &w.experts[e],
                after: None,
            });
        }
        for e in 0..9 {
            layer.push(Part {
                problem: problem(down, rows, 100 + e as u64)?,
                packed: &w.experts[9 + e],
                after: Some(e),
            });
        }
        bench.line("9 experts, one launch", rows, &layer)?;
        // The router reads the layer's input as the gate/ups do: it joins their step.
        layer.insert(9, w.part(4, rows, None)?);
        bench.line("9 experts + router, one launch", rows, &layer)?;
    }
    Ok(())
}

/// Whether each matrix of a chain can read its x from the y before it: that y has at least k
/// columns.
fn chain_fits(chain: &[Part]) -> bool {
    chain.windows(2).all(|p| p[0].problem.n >= p[1].problem.k)
}

/// The tile's clock stamps (`LIN_STAMPS`), a line per matrix of the launch: when its tasks
/// start (the timeline's clock, us from the launch's first task; median and last), then each
/// milestone's median and longest in us after the task's start (SM clock): the descriptor read
/// and first loads issued, the input wait over, x staged, the first and the last batch multiplied
/// (or slot landed), the last epilogue stored, the boxes published, the slowest group's last batch
/// multiplied, the task's end. A milestone a task does not reach (0) is left out.
fn text_stamps(line: &Timeline, table: &TaskTable, parts: &[Part], words: &[u64], khz: u32) {
    let ghz = f64::from(khz) / 1e6;
    let marks = STAMP_MILESTONES.len();
    let names: Vec<&str> = STAMP_MILESTONES.iter().copied().chain(["end"]).collect();
    for (m, p) in parts.iter().enumerate() {
        let mut starts = Vec::new();
        let mut cols: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
        for bar in &line.bars {
            let span = &bar.span;
            let task = &table.tasks[span.position as usize];
            let record = task.out.first as usize;
            if task.args[0] as usize != m || words.len() < (record + 1) * STAMP_WORDS {
                continue;
            }
            let w = &words[record * STAMP_WORDS..(record + 1) * STAMP_WORDS];
            starts.push(bar.start_us);
            let us = |c: u64| c.wrapping_sub(span.start_cycles) as f64 / ghz / 1e3;
            for (j, col) in cols.iter_mut().enumerate().take(marks) {
                if w[j] != 0 {
                    col.push(us(w[j]));
                }
            }
            cols[marks].push(us(span.end_cycles));
        }
        if starts.is_empty() {
            continue;
        }
        let last = starts.iter().copied().fold(0.0, f64::max);
        let mut text = format!(
            "    stamps {m} {} ({} tasks): start {:.2} (last {last:.2})",
            p.problem.name,
            starts.len(),
            median(&starts)
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
