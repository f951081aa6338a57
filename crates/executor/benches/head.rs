//! The head's fused launches on a GPU at a GLM-5.2 TP-8 rank's shapes: the tail (final norm,
//! lm_head's shard of 19360 x 6144 bf16, the argmax and the pick) and the dense MLP (post norm,
//! FP8 gate/up 2 x 1536 x 6144 with SwiGLU, down 6144 x 1536 with the residual) at 1 and 4 rows.
//! Each figure: the median of TIMED graph replays, the L2 flushed before each, of COPIES launches
//! back to back (each with its epoch node, on its own copy of the weights, so they stream from
//! HBM), divided by COPIES; beside it, in the same run, a copy kernel (`copy_16b`, 4 CTAs of 512
//! a SM) moving the same bytes (half read, half written) the same way, and the floor: the weight
//! bytes over the copy bandwidth. Weights are zeros (the time does not depend on their values).
//! Then one launch of a traced build (`MBX_TRACE`), the L2 flushed before it: when each phase's
//! tasks (the norm, each matrix, the argmax, the pick) started and ended, from the first task's
//! start.
//! Records go to `MONO_BENCH_JSON` (tables "head tail", "head dense MLP").
//!
//! `cargo bench -p executor --bench head` on a GPU machine; prints "skipped" without one.

use device::report::{Figure, Reporter};
use device::timing::ReplayTimer;
use device::{Args, Buffer, Device, Launch, Stream};
use executor::fused::head::{
    dense_mlp_part, tail_part, DenseShape, DenseWeights, HeadDescriptors, HeadLists, TailShape,
    TailWeights,
};
use executor::fused::head_gpu::{HeadKernel, HeadLaunch};
use executor::fused::{Handoff, LaunchGraph, PlannedLaunch};
use linear::gpu::LinMatrix;
use mailbox::gpu::Variant;
use mailbox::layout::BoxRange;
use model::weights::packed::{PackedLayout, Pairing};
use model::{ModelConfig, RankShapes, WeightFormat};

type Error = Box<dyn std::error::Error>;

const TIMED: usize = 20;
const COPIES: usize = 6;

struct Bench {
    dev: Device,
    stream: Stream,
    timer: ReplayTimer,
    kernel: HeadKernel,
    traced: HeadKernel,
    copy: device::Kernel,
    _copy_module: device::Module,
    bandwidth: f64,
    reporter: Reporter,
}

/// A packed weight of zeros: its bytes and its scales.
fn zeros(dev: &Device, layout: &PackedLayout) -> Result<(Buffer<u8>, Buffer<f32>), Error> {
    Ok((
        dev.alloc_zeroed(layout.bytes())?,
        dev.alloc_zeroed(layout.scales_len().max(1))?,
    ))
}

fn bytes_of(layout: &PackedLayout) -> usize {
    layout.bytes() + 4 * layout.scales_len()
}

impl Bench {
    /// Microseconds a launch: median over replays of a graph of COPIES launches from `issue`.
    fn graph_us(&self, issue: &dyn Fn(usize) -> Result<(), Error>) -> Result<f64, Error> {
        self.timer
            .launches_us(&self.dev, &self.stream, TIMED, COPIES, issue)
    }

    /// The copy kernel moving `bytes` (half each way), each launch from its own source.
    fn copy_us(&self, bytes: usize) -> Result<f64, Error> {
        let words = bytes / 32;
        let src = self.dev.alloc_zeroed::<[u32; 4]>(words * COPIES)?;
        let dst = self.dev.alloc_zeroed::<[u32; 4]>(words)?;
        let launch = Launch::new(self.dev.info().multiprocessors * 4, 512);
        self.graph_us(&|i| {
            let a = Args::new()
                .u64(src.device_ptr() + (i * words * 16) as u64)
                .buf(&dst)
                .u64(words as u64);
            Ok(self.stream.launch(&self.copy, launch, &a)?)
        })
    }

    /// Times `launches` (one a copy of the weights) against the copy of `bytes`, prints the line
    /// and writes the record.
    fn line(
        &self,
        table: &str,
        rows: u32,
        bytes: usize,
        launches: &[HeadLaunch],
    ) -> Result<(), Error> {
        let us = self.graph_us(&|i| Ok(launches[i].enqueue(&self.kernel, &self.stream)?))?;
        let copy = self.copy_us(bytes)?;
        let floor = bytes as f64 / self.bandwidth * 1e6;
        println!(
            "{table:<16} {rows:>4} {:>9.2} {floor:>9.2} {copy:>9.2} {us:>9.2} {:>8.3} {:>8.3}",
            bytes as f64 / 1e6,
            us / copy,
            us / floor
        );
        self.phases(&launches[0])?;
        let case = format!("{rows} row{}", if rows == 1 { "" } else { "s" });
        self.reporter.write(
            &Figure::new(table, &case, "fused launch (epoch node + launch)", us, "us")
                .floor(floor, "weight bytes / copy bandwidth")
                .baseline(copy, "copy of the same bytes, same graph mode"),
        )?;
        Ok(())
    }
}

impl Bench {
    /// One traced launch, the L2 flushed before it: each phase's first start and last end.
    fn phases(&self, launch: &HeadLaunch) -> Result<(), Error> {
        self.timer.flush().enqueue(&self.dev, &self.stream)?;
        let trace = launch.trace(&self.dev, &self.traced, &self.stream)?;
        let tasks = launch.tasks();
        let t0 = trace.spans.iter().map(|s| s.start_ns).min().unwrap_or(0);
        // Phases in the order their first task started: a head kind, or a linear matrix.
        let mut phases: Vec<(String, u64, u64, usize)> = Vec::new();
        for span in &trace.spans {
            let task = &tasks.tasks[span.position as usize];
            let name = match span.kind {
                linear::layout::KIND_TILES => format!("matrix {}", task.args[0]),
                head::layout::KIND_EMBED => "embed".into(),
                head::layout::KIND_NORM => "norm".into(),
                head::layout::KIND_ARGMAX => "argmax".into(),
                head::layout::KIND_PICK => "pick".into(),
                kind => mailbox::trace::kind_name(kind),
            };
            match phases.iter_mut().find(|p| p.0 == name) {
                Some(p) => {
                    p.1 = p.1.min(span.start_ns);
                    p.2 = p.2.max(span.end_ns);
                    p.3 += 1;
                }
                None => phases.push((name, span.start_ns, span.end_ns, 1)),
            }
        }
        phases.sort_by_key(|p| p.1);
        let line: Vec<String> = phases
            .iter()
            .map(|(name, start, end, n)| {
                format!(
                    "{name} x{n} {:.1}-{:.1}",
                    (start - t0) as f64 / 1e3,
                    (end - t0) as f64 / 1e3
                )
            })
            .collect();
        println!(
            "    phases (us from the first task's start): {}",
            line.join(", ")
        );
        Ok(())
    }
}

fn planned_tail(
    ctas: u32,
    shape: TailShape,
) -> Result<(PlannedLaunch, HeadLists, executor::fused::head::TailPlan), Error> {
    let mut g = LaunchGraph::new(ctas)?;
    let mut lists = HeadLists::default();
    let x = g.arena("tail_x", u64::from(shape.rows * shape.hidden) * 2)?;
    let input = Handoff {
        data: x,
        ready: BoxRange::default(),
    };
    let plan = tail_part(&mut g, &mut lists, shape, input)?;
    Ok((g.finish()?, lists, plan))
}

fn main() -> Result<(), Error> {
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("head bench skipped: {e}");
            return Ok(());
        }
    };
    let bandwidth = device::probes::copy_bandwidth(&dev, 256 << 20)?.bytes_per_s;
    let copy_module = dev.build(&device::probes::copy_source())?;
    let bench = Bench {
        stream: dev.new_stream()?,
        timer: ReplayTimer::new(&dev)?,
        kernel: HeadKernel::build(&dev, Variant::default(), None)?,
        traced: HeadKernel::build_traced(&dev, Variant::default())?,
        copy: copy_module.kernel("copy_16b")?,
        _copy_module: copy_module,
        bandwidth,
        reporter: Reporter::from_env(&dev.info().name),
        dev,
    };
    let dev = &bench.dev;
    let r = RankShapes::new(&ModelConfig::preset("glm-5.2")?, 8)?;
    let hidden = r.config.hidden_size as u32;
    let eps = r.config.rms_norm_eps as f32;
    let ctas = bench.kernel.ctas();
    let threads = bench.kernel.shape().threads;
    println!(
        "{}: copy bandwidth {:.2} TB/s (read + written); us a launch, graph replays of {COPIES}, weights cold",
        dev.info().name,
        bandwidth / 1e12
    );
    println!(
        "{:<16} {:>4} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "launch", "rows", "MB", "floor", "copy", "fused", "x copy", "x floor"
    );
    for rows in [1, 4] {
        let shape = TailShape {
            rows,
            hidden,
            vocab_rows: r.vocab_rows as u32,
            shard: 0,
            shards: 8,
            eps,
            format: WeightFormat::Bf16,
        };
        let layout = PackedLayout::new(
            shape.format,
            Pairing::Plain,
            shape.vocab_rows as usize,
            hidden as usize,
        )?;
        let (planned, lists, plan) = planned_tail(ctas, shape)?;
        let lds = plan.lds_bytes(threads)?;
        let norm = dev.alloc_zeroed::<u16>(hidden as usize)?;
        let mut keep = Vec::new();
        let mut launches = Vec::new();
        for _ in 0..COPIES {
            let (w, s) = zeros(dev, &layout)?;
            let weights = TailWeights {
                final_norm: norm.device_ptr(),
                lm_head: w.device_ptr(),
                lm_head_scales: s.device_ptr(),
            };
            launches.push(HeadLaunch::new(
                dev,
                &bench.kernel,
                &planned,
                lds,
                |arena| {
                    let mut mats = vec![LinMatrix::default(); planned.matrices as usize];
                    let mut d = HeadDescriptors::new(&lists);
                    plan.bind(arena, &weights, &mut mats, &mut d);
                    (mats, d)
                },
            )?);
            keep.push((w, s));
        }
        bench.line("head tail", rows, bytes_of(&layout), &launches)?;
    }
    for rows in [1, 4] {
        let shape = DenseShape {
            rows,
            hidden,
            intermediate: r.dense_intermediate as u32,
            eps,
            format: WeightFormat::Fp8,
            residual: true,
        };
        let inter = shape.intermediate as usize;
        let gu = PackedLayout::new(shape.format, Pairing::GateUp, inter, hidden as usize)?;
        let dn = PackedLayout::new(shape.format, Pairing::Plain, hidden as usize, inter)?;
        let mut g = LaunchGraph::new(ctas)?;
        let mut lists = HeadLists::default();
        let h = g.arena("dense_h", u64::from(rows * hidden) * 2)?;
        let input = Handoff {
            data: h,
            ready: BoxRange::default(),
        };
        let plan = dense_mlp_part(&mut g, &mut lists, shape, input)?;
        let lds = plan.lds_bytes(threads)?;
        let planned = g.finish()?;
        let norm = dev.alloc_zeroed::<u16>(hidden as usize)?;
        let mut keep = Vec::new();
        let mut launches = Vec::new();
        for _ in 0..COPIES {
            let (gw, gs) = zeros(dev, &gu)?;
            let (dw, ds) = zeros(dev, &dn)?;
            let weights = DenseWeights {
                post_norm: norm.device_ptr(),
                gate_up: gw.device_ptr(),
                gate_up_scales: gs.device_ptr(),
                down: dw.device_ptr(),
                down_scales: ds.device_ptr(),
            };
            launches.push(HeadLaunch::new(
                dev,
                &bench.kernel,
                &planned,
                lds,
                |arena| {
                    let mut mats = vec![LinMatrix::default(); planned.matrices as usize];
                    let mut d = HeadDescriptors::new(&lists);
                    plan.bind(arena, &weights, &mut mats, &mut d);
                    (mats, d)
                },
            )?);
            keep.push((gw, gs, dw, ds));
        }
        bench.line(
            "head dense MLP",
            rows,
            bytes_of(&gu) + bytes_of(&dn),
            &launches,
        )?;
    }
    Ok(())
}
