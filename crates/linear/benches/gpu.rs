//! The linear task on the GPU at a GLM-5.2 TP-8 rank's matrices (`linear::shapes`), 1, 4 and 16
//! rows (lm_head 1 and 4), each alone over every SM, and the nine expert slices of one MoE layer (8 routed + the
//! shared one: nine gate/up matrices, then nine downs each waiting on its gate/up) as one
//! persistent launch. Graph replays of 16 launches, the weights rotated among enough copies to
//! exceed 128 MB (cold in L2; a 256 MB memset before each replay, untimed), median of 10
//! replays per launch; beside each, in the same run: a copy kernel (`copy_16b`, 4 CTAs of 512 a
//! SM) moving the same bytes (half read, half written) as graph replays of 16 launches, and the
//! floor (bytes over the measured copy bandwidth). The chain's graph starts with the mailbox's
//! epoch node (its tasks wait on boxes, which need a new tag each replay); the single matrices'
//! do not. Prints "skipped" without a GPU.
//! `cargo bench -p linear --bench gpu`

use device::{Args, Buffer, Device, Launch, Stream};
use linear::cases::{Pattern, Problem};
use linear::gpu::{DevicePlan, DeviceProblem, LinMatrix, LinearKernel};
use linear::layout::{lds_bytes, place, MatrixPlan};
use linear::shapes::rank_matrices;
use mailbox::gpu::{EpochNode, Variant};
use mailbox::Tags;

type Error = Box<dyn std::error::Error>;

const LAUNCHES: usize = 16;
const TIMED: usize = 10;
const COLD_BYTES: usize = 128 << 20;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Bench {
    dev: Device,
    stream: Stream,
    flush: Buffer<u8>,
    kernel: LinearKernel,
    copy: device::Kernel,
    _copy_module: device::Module,
    epoch: EpochNode,
    bandwidth: f64,
}

impl Bench {
    /// Microseconds a launch: median over replays of a graph of LAUNCHES launches from `issue`.
    fn graph_us(&self, issue: &dyn Fn(usize) -> Result<(), Error>) -> Result<f64, Error> {
        let s = &self.stream;
        s.begin_capture()?;
        for i in 0..LAUNCHES {
            issue(i)?;
        }
        let graph = s.end_capture()?;
        graph.upload(s)?;
        let (t0, t1) = (self.dev.timer()?, self.dev.timer()?);
        let mut times = Vec::new();
        for i in 0..=TIMED {
            s.memset(self.flush.device_ptr(), i as u8, self.flush.bytes())?;
            t0.record(s)?;
            graph.launch(s)?;
            t1.record(s)?;
            t1.sync()?;
            if i > 0 {
                times.push(f64::from(t0.elapsed_ms(&t1)?) * 1e3 / LAUNCHES as f64);
            }
        }
        Ok(median(times))
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

    /// One launch of `problems` (matrix m after `after[m]`), weights in enough copies to be cold.
    fn linear_us(&self, problems: &[(Problem, Option<usize>)]) -> Result<(f64, usize), Error> {
        let packed: Vec<_> = problems
            .iter()
            .map(|(p, _)| p.packed())
            .collect::<Result<_, _>>()?;
        let bytes: usize = packed
            .iter()
            .map(|w| w.bytes.len() + 4 * w.scales.len())
            .sum();
        let copies = COLD_BYTES.div_ceil(bytes).clamp(1, LAUNCHES);
        let lds = problems
            .iter()
            .map(|(p, _)| lds_bytes(self.kernel.threads(), p.k, p.rows))
            .try_fold(0, |a, b| b.map(|b| a.max(b)))?;
        let mut sets: Vec<(Vec<DeviceProblem>, Buffer<LinMatrix>)> = Vec::new();
        for _ in 0..copies {
            let mut bufs: Vec<DeviceProblem> = Vec::new();
            for ((p, after), w) in problems.iter().zip(&packed) {
                let mut b = DeviceProblem::upload(&self.dev, p, w)?;
                if let Some(a) = after {
                    b.matrix.x = bufs[*a].y.device_ptr();
                }
                bufs.push(b);
            }
            let mats: Vec<LinMatrix> = bufs.iter().map(|b| b.matrix).collect();
            let mats = self.dev.upload(&mats)?;
            sets.push((bufs, mats));
        }
        let plans: Vec<MatrixPlan> = problems
            .iter()
            .zip(&packed)
            .map(|((_, after), w)| MatrixPlan {
                tiles: w.layout.tiles() as u32,
                after: *after,
            })
            .collect();
        let plan = place(&plans, self.dev.info().multiprocessors)?;
        let first: Vec<LinMatrix> = sets[0].0.iter().map(|b| b.matrix).collect();
        let on_device = DevicePlan::new(&self.dev, &self.kernel, &plan, &first, lds)?;
        let waits = problems.iter().any(|(_, a)| a.is_some());
        let tags = Tags::new(LAUNCHES as u32)?;
        let us = self.graph_us(&|i| {
            if waits && i == 0 {
                self.epoch
                    .enqueue(&self.stream, &on_device.epoch, &on_device.scratch, tags)?;
            }
            let mats = &sets[i % copies].1;
            Ok(on_device.launch_with(&self.stream, &self.kernel, tags, i as u32, mats)?)
        })?;
        Ok((us, bytes))
    }

    fn line(
        &self,
        name: &str,
        rows: usize,
        problems: &[(Problem, Option<usize>)],
    ) -> Result<(), Error> {
        let (us, bytes) = self.linear_us(problems)?;
        let copy = self.copy_us(bytes)?;
        let floor = bytes as f64 / self.bandwidth * 1e6;
        println!(
            "{name:<28} {rows:>4} {:>9.2} {floor:>9.2} {copy:>9.2} {us:>9.2} {:>8.3} {:>8.3}",
            bytes as f64 / 1e6,
            us / copy,
            us / floor
        );
        Ok(())
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
    let bench = Bench {
        stream: dev.new_stream()?,
        flush: dev.alloc_zeroed::<u8>(256 << 20)?,
        kernel: LinearKernel::build(&dev, 512, Variant::default())?,
        copy: copy_module.kernel("copy_16b")?,
        _copy_module: copy_module,
        epoch: EpochNode::build(&dev, Variant::default())?,
        bandwidth,
        dev,
    };
    println!(
        "{}: copy bandwidth {:.2} TB/s (read + written); us a launch, graph replays, weights cold",
        bench.dev.info().name,
        bandwidth / 1e12
    );
    println!(
        "{:<28} {:>4} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "matrix", "rows", "MB", "floor", "copy", "linear", "x copy", "x floor"
    );
    let matrices = rank_matrices("glm-5.2", 8)?;
    for rows in [1, 4, 16] {
        for m in matrices.iter().filter(|m| rows <= 4 || m.name != "lm_head") {
            let p = Problem::new(
                Pattern::Random,
                m.format,
                m.pairing,
                m.n,
                m.k,
                rows,
                m.finish,
                1,
            )?;
            bench.line(m.name, rows, &[(p, None)])?;
        }
        // The nine expert slices of a MoE layer: gate/up 0..9, then down e after gate/up e.
        let (gu, down) = (&matrices[2], &matrices[3]);
        let mut chain = Vec::new();
        for e in 0..9u64 {
            let p = Problem::new(
                Pattern::Random,
                gu.format,
                gu.pairing,
                gu.n,
                gu.k,
                rows,
                gu.finish,
                e,
            )?;
            chain.push((p, None));
        }
        for e in 0..9 {
            let p = Problem::new(
                Pattern::Random,
                down.format,
                down.pairing,
                down.n,
                down.k,
                rows,
                down.finish,
                100 + e as u64,
            )?;
            chain.push((p, Some(e)));
        }
        bench.line("9 experts, one launch", rows, &chain)?;
    }
    Ok(())
}
