//! The GPU side of `mono step`, `mono dump`, `mono compare` and `mono bench`.
//!
//! The step built here holds the launches that exist: the fused front half of every
//! full-indexer layer (on made-up activations, [`super::scene`]), then the greedy feed. The
//! attention and MoE halves, the dense MLP, the embedding and the tail join it as they are built
//! (each a [`super::StepLaunch`]); until the tail exists no launch writes the argmax, so the
//! tokens the feed moves on are zeros, and the output says so.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use device::report::{Figure, Reporter};
use device::{Device, DeviceError};
use mailbox::gpu::Variant;
use model::traffic::{step_traffic, Formats, Load};
use model::{CacheFormat, ModelConfig, RankShapes, WeightFormat};

use super::bench::{time_step, StepTimes};
use super::digest::{compare, Comparison, Dump};
use super::graph::{StepFrame, StepGraph};
use super::inputs::{Feed, FeedKernel, StepInputs};
use super::scene::{FrontScene, SceneRequest};
use super::weights::{DeviceWeights, Progress, WeightKernels, WeightPlan};
use super::{Result, StepError};
use crate::fused::front_gpu::FrontKernel;
use crate::reference::cli::StepArgs;

/// What `mono step` takes beyond the CPU step's flags.
#[derive(Debug, Clone, Args)]
pub struct GpuArgs {
    /// The CPU reference step even when a GPU is present.
    #[arg(long)]
    pub cpu: bool,
    /// Decode steps (graph replays) on the GPU.
    #[arg(long, default_value_t = 4)]
    pub steps: u32,
    /// Requests of the GPU step, each with --rows rows.
    #[arg(long, default_value_t = 1)]
    pub requests: u32,
    /// Tensor-parallel size of the weights; the GPU holds one rank's.
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// The rank whose weights the GPU holds.
    #[arg(long, default_value_t = 0)]
    pub rank: usize,
    /// Do not make the weights (no launch of the step reads them yet).
    #[arg(long)]
    pub no_weights: bool,
}

/// The shape of a GPU step: preset, seed, and the batch.
#[derive(Debug, Clone, Args)]
pub struct StepShape {
    /// Model preset: glm-5, glm-5.2 or tiny.
    #[arg(long, default_value = "glm-5.2")]
    pub preset: String,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Requests, each with --rows rows.
    #[arg(long, default_value_t = 1)]
    pub requests: u32,
    /// Rows per request (1: plain decode; 4: MTP verify of 3 drafts).
    #[arg(long, default_value_t = 1)]
    pub rows: u32,
    /// Tokens each request has cached.
    #[arg(long, default_value_t = 8192)]
    pub context: u32,
}

fn open_device() -> Result<Device> {
    Ok(Device::open(0)?)
}

fn config(preset: &str) -> Result<ModelConfig> {
    Ok(ModelConfig::preset(preset)?)
}

/// Builds the step for `requests` and hands it to `body` with its inputs.
fn with_step<T>(
    dev: &Device,
    cfg: &ModelConfig,
    requests: &[SceneRequest],
    seed: u64,
    body: impl FnOnce(&mut StepGraph, &StepInputs) -> Result<T>,
) -> Result<T> {
    let kernel = FrontKernel::build(dev, cfg, Variant::default(), None)?;
    let scene = FrontScene::new(dev, cfg, &kernel, requests, seed)?;
    let inputs = StepInputs::new(dev, &scene.batch(seed, cfg.vocab_size))?;
    let feed_kernel = FeedKernel::build(dev)?;
    let frame = StepFrame::new(dev, scene.launch_count(), scene.scratch_boxes())?;
    let launches = scene.launches(dev, &kernel, &frame, 0)?;
    let feed = Feed {
        kernel: &feed_kernel,
        inputs: &inputs,
    };
    let mut graph = StepGraph::new(dev, frame, launches, Some(feed), Variant::default())?;
    body(&mut graph, &inputs)
}

fn scene_requests(requests: u32, rows: u32, context: u32) -> Result<Vec<SceneRequest>> {
    if requests == 0 || rows == 0 {
        return Err(StepError::Invalid(
            "a step needs at least one request of at least one row".into(),
        ));
    }
    Ok(vec![SceneRequest { context, rows }; requests as usize])
}

fn print_progress(p: &Progress) {
    let gb = |b: usize| b as f64 / 1e9;
    let rate = gb(p.bytes_done) / p.elapsed.as_secs_f64().max(1e-9);
    eprint!(
        "\rweights: {:>6.2} / {:.2} GB, {} / {} tensors, {:.1} s ({rate:.1} GB/s)",
        gb(p.bytes_done),
        gb(p.bytes),
        p.tensors_done,
        p.tensors,
        p.elapsed.as_secs_f64()
    );
    if p.tensors_done == p.tensors {
        eprintln!();
    }
}

/// Makes rank `rank` of `tp`'s synthetic weights on `dev`, with progress on stderr.
pub fn make_weights(
    dev: &Device,
    cfg: &ModelConfig,
    tp: usize,
    rank: usize,
    format: WeightFormat,
    seed: u64,
) -> Result<DeviceWeights> {
    let plan = WeightPlan::new(cfg, tp, rank, format)?;
    let kernels = WeightKernels::build(dev)?;
    DeviceWeights::generate(dev, &kernels, plan, seed, &mut print_progress)
}

/// `mono step`: on a GPU unless `--cpu` or none is found, else the CPU reference step.
pub fn run_step(args: &StepArgs, gpu: &GpuArgs) -> Result<(), String> {
    if gpu.cpu {
        return crate::reference::cli::run(args);
    }
    let dev = match Device::open(0) {
        Ok(dev) => dev,
        Err(e @ (DeviceError::NoDriver { .. } | DeviceError::NoDevice { .. })) => {
            println!("mono step: no GPU ({e}); the CPU reference step instead");
            return crate::reference::cli::run(args);
        }
        Err(e) => return Err(e.to_string()),
    };
    // The step's launches are built for the GLM-5 family's shapes; a preset they do not take (the
    // tiny one) runs on the CPU, saying why.
    let cfg = config(&args.preset).map_err(|e| e.to_string())?;
    if args.weights.is_none() && args.config.is_none() {
        if let Err(e) = FrontKernel::build(&dev, &cfg, Variant::default(), None) {
            println!(
                "mono step: the GPU step does not take preset {} ({e}); the CPU reference step \
                 instead (--preset glm-5.2 for the GPU)",
                args.preset
            );
            return crate::reference::cli::run(args);
        }
    }
    run_gpu_step(&dev, args, gpu).map_err(|e| e.to_string())
}

fn run_gpu_step(dev: &Device, args: &StepArgs, gpu: &GpuArgs) -> Result<()> {
    if args.weights.is_some() || args.config.is_some() {
        return Err(StepError::Invalid(
            "--weights and --config: loading a checkpoint or a config onto the GPU is not built \
             yet; add --cpu for the CPU reference step"
                .into(),
        ));
    }
    let cfg = config(&args.preset)?;
    let info = dev.info();
    println!(
        "mono step on {} ({}): preset {}, {} request(s) x {} row(s), context {}",
        info.name, info.arch, args.preset, gpu.requests, args.rows, args.context
    );
    let format = if args.fp8_weights {
        WeightFormat::Fp8
    } else {
        WeightFormat::Bf16
    };
    let _weights = if gpu.no_weights {
        None
    } else {
        let started = Instant::now();
        let w = make_weights(dev, &cfg, gpu.tp, gpu.rank, format, args.seed)?;
        println!(
            "weights: rank {} of TP {}, {:?}, {:.2} GB in {} tensors, made on the GPU in {:.1} s",
            gpu.rank,
            gpu.tp,
            format,
            w.plan.bytes as f64 / 1e9,
            w.plan.tensors.len(),
            started.elapsed().as_secs_f64()
        );
        Some(w)
    };
    let requests = scene_requests(gpu.requests, args.rows as u32, args.context as u32)?;
    with_step(dev, &cfg, &requests, args.seed, |graph, inputs| {
        println!(
            "step: {} launches ({}) and the greedy feed, captured as one graph",
            graph.launches().len(),
            graph
                .launches()
                .first()
                .map_or("none".into(), |l| format!("{} ...", l.name()))
        );
        println!(
            "not in the step yet: embedding, attention and MoE halves, dense MLP, tail; no launch \
             writes the argmax, so the fed tokens are zeros"
        );
        graph.run_eager()?;
        graph.capture()?;
        for s in 0..gpu.steps {
            let ms = graph.time_replays(dev, 1)?[0];
            let rows = inputs.read()?;
            println!(
                "step {s}: {ms:.3} ms; next positions {:?}, tokens {:?}",
                rows.positions, rows.tokens
            );
        }
        Ok(())
    })
}

/// `mono dump`'s flags.
#[derive(Debug, Clone, Args)]
pub struct DumpArgs {
    #[command(flatten)]
    pub shape: StepShape,
    /// Replays of the captured step before the dumped one.
    #[arg(long, default_value_t = 2)]
    pub replays: u32,
    /// Where to write the digests (stdout without it).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `mono dump`: the digests of every launch's outputs in one step, launched launch by launch
/// after `--replays` replays of the captured step.
pub fn run_dump(args: &DumpArgs) -> Result<(), String> {
    dump(args).map_err(|e| e.to_string())
}

fn dump(args: &DumpArgs) -> Result<()> {
    let s = &args.shape;
    let cfg = config(&s.preset)?;
    let dev = open_device()?;
    let requests = scene_requests(s.requests, s.rows, s.context)?;
    let dump = with_step(&dev, &cfg, &requests, s.seed, |graph, _| {
        graph.run_eager()?;
        graph.capture()?;
        graph.replay(args.replays)?;
        graph.dump_step()
    })?;
    let dump = dump
        .with_header("preset", &s.preset)
        .with_header("seed", &s.seed.to_string())
        .with_header(
            "batch",
            &format!("{} x {} rows, context {}", s.requests, s.rows, s.context),
        )
        .with_header("replays before", &args.replays.to_string())
        .with_header("device", &dev.info().name);
    let text = dump.to_text()?;
    match &args.out {
        Some(path) => std::fs::write(path, text)
            .map_err(|e| StepError::Invalid(format!("writing {}: {e}", path.display())))?,
        None => print!("{text}"),
    }
    Ok(())
}

/// `mono compare A B`: whether two dumps are bitwise equal, else the first difference.
pub fn run_compare(a: &PathBuf, b: &PathBuf) -> Result<(), String> {
    let read = |p: &PathBuf| -> Result<Dump> {
        let text = std::fs::read_to_string(p)
            .map_err(|e| StepError::Invalid(format!("reading {}: {e}", p.display())))?;
        Dump::parse(&text, &p.display().to_string())
    };
    let (da, db) = (
        read(a).map_err(|e| e.to_string())?,
        read(b).map_err(|e| e.to_string())?,
    );
    let result = compare(&da, &db);
    println!("{result}");
    match result {
        Comparison::Equal { .. } => Ok(()),
        Comparison::Differ { .. } => Err("the dumps differ".into()),
    }
}

/// `mono bench`'s flags.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    #[arg(long, default_value = "glm-5.2")]
    pub preset: String,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// TP of the whole step's floor (one rank's bytes).
    #[arg(long, default_value_t = 8)]
    pub tp: usize,
    /// Contexts to time.
    #[arg(long, value_delimiter = ',', default_values_t = [8192u32, 131_072])]
    pub contexts: Vec<u32>,
    /// Rows per request to time (one request).
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 4])]
    pub rows: Vec<u32>,
    /// Timed replays per case.
    #[arg(long, default_value_t = 50)]
    pub replays: u32,
}

/// `mono bench`: per case the step's replay time beside its launches' floor and the whole
/// step's floor, and each launch kind's time; records to `MONO_BENCH_JSON` (table "step").
pub fn run_bench(args: &BenchArgs) -> Result<(), String> {
    bench(args).map_err(|e| e.to_string())
}

fn bench(args: &BenchArgs) -> Result<()> {
    let cfg = config(&args.preset)?;
    let dev = open_device()?;
    let shapes = RankShapes::new(&cfg, args.tp)?;
    let plan = cfg.layer_plan()?;
    let copy = device::probes::copy_bandwidth(&dev, 1 << 30)?.bytes_per_s;
    let reporter = Reporter::from_env(&dev.info().name);
    println!(
        "mono bench on {}: copy bandwidth {:.2} TB/s (measured now; floors use it)",
        dev.info().name,
        copy / 1e12
    );
    for &context in &args.contexts {
        for &rows in &args.rows {
            let requests = scene_requests(1, rows, context)?;
            let times = with_step(&dev, &cfg, &requests, args.seed, |graph, _| {
                graph.run_eager()?;
                graph.capture()?;
                time_step(&dev, graph, 3, args.replays, 5)
            })?;
            let load = Load {
                requests: 1,
                rows_per_request: u64::from(rows),
                context: u64::from(context),
            };
            let formats = Formats {
                weights: WeightFormat::Fp8,
                cache: CacheFormat::Fp8,
            };
            let whole = step_traffic(&shapes, &plan, formats, load).total_bytes();
            report_case(&reporter, &args.preset, context, rows, copy, whole, &times)?;
        }
    }
    Ok(())
}

fn report_case(
    reporter: &Reporter,
    preset: &str,
    context: u32,
    rows: u32,
    copy: f64,
    whole_step_bytes: u64,
    times: &StepTimes,
) -> Result<()> {
    let case = format!(
        "{} x {rows} row{}",
        device::report::keys_label(u64::from(context)),
        if rows > 1 { "s" } else { "" }
    );
    let floor_ms = times.floor_bytes as f64 / copy * 1e3;
    let step_ms = times.step_ms();
    println!(
        "{preset} {case}: step {step_ms:.3} ms (median of {} replays); its launches' floor \
         {floor_ms:.3} ms ({:.1} MB), ratio {:.2}{}; the whole step's floor (all launches, TP rank \
         bytes from model::traffic) {:.3} ms",
        times.replays_ms.len(),
        times.floor_bytes as f64 / 1e6,
        step_ms / floor_ms,
        if times.without_floor > 0 {
            format!(" ({} launches without a floor)", times.without_floor)
        } else {
            String::new()
        },
        whole_step_bytes as f64 / copy * 1e3
    );
    let mut figures = vec![Figure::new("step", &case, "step replay", step_ms, "ms")
        .floor(
            floor_ms,
            "bytes of the launches in the step over the copy bandwidth",
        )
        .note(&format!(
            "{preset}; launches in the step so far: front halves only; whole step floor {:.3} ms",
            whole_step_bytes as f64 / copy * 1e3
        ))];
    for k in &times.kinds {
        let mut figure = Figure::new("step", &case, &k.kind, k.ms, "ms")
            .note(&format!("{} a step, launched directly", k.count));
        let floor = k.floor_bytes.map(|b| b as f64 / copy * 1e3);
        if let Some(f) = floor {
            figure = figure.floor(f, "bytes of one launch over the copy bandwidth");
        }
        println!(
            "  {}: {} a step, {:.3} ms each (median, launched directly){}",
            k.kind,
            k.count,
            k.ms,
            floor.map_or(String::new(), |f| format!("; floor {f:.4} ms"))
        );
        figures.push(figure);
    }
    for f in figures {
        reporter.write(&f)?;
    }
    let _ = std::io::stdout().flush();
    Ok(())
}
