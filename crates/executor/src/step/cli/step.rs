//! `mono step` on a GPU: the rank's weights made there, then the step replayed.

use std::path::Path;
use std::time::Instant;

use clap::{Args, ValueEnum};
use device::Device;
use mailbox::gpu::Variant;
use model::weights::Checkpoint;
use model::{ModelConfig, WeightFormat};

use super::{
    checkpoint_weights, emulated_instead, first_layers, gpu_weights, no_gpu, open_device,
    open_emulator, scene_requests, with_step,
};
use crate::fused::front_gpu::FrontKernel;
use crate::reference::cli::{
    check_rows, reference_parameters, step_config, Numerics, StepArgs, MAX_REFERENCE_PARAMETERS,
};
use crate::step::weights::{DeviceWeights, Progress, WeightKernels, WeightPlan};
use crate::step::Result;

const DEFAULT_STEPS: u32 = 4;
const DEFAULT_REQUESTS: u32 = 1;
const DEFAULT_TP: usize = 1;
const DEFAULT_RANK: usize = 0;

/// What `mono step` takes beyond the CPU step's flags.
#[derive(Debug, Clone, Args)]
pub struct GpuArgs {
    /// The CPU reference step even when a GPU is present.
    #[arg(long)]
    pub cpu: bool,
    /// Decode steps on the GPU: the first launched directly, the rest replays of the graph
    /// captured after it.
    #[arg(long, default_value_t = DEFAULT_STEPS)]
    pub steps: u32,
    /// Requests of the GPU step, each with --rows rows.
    #[arg(long, default_value_t = DEFAULT_REQUESTS)]
    pub requests: u32,
    /// Tensor-parallel size of the weights; the GPU holds one rank's.
    #[arg(long, default_value_t = DEFAULT_TP)]
    pub tp: usize,
    /// The rank whose weights the GPU holds.
    #[arg(long, default_value_t = DEFAULT_RANK)]
    pub rank: usize,
    /// Only the model's first this many layers and its head (the device step, on a GPU or the
    /// emulator): every launch kind on a GPU that cannot hold the whole rank (a glm-5.2 TP8 rank
    /// takes about 97 GB; 40 layers fit 80 GB). The tokens are then not the model's.
    #[arg(long)]
    pub layers: Option<usize>,
}

impl GpuArgs {
    /// Refuses, on every machine, flags the GPU step could not run with: no replays, no
    /// requests, a TP the shapes do not shard for, a rank outside it.
    pub fn check(&self) -> Result<(), String> {
        if self.steps == 0 {
            return Err("--steps must be at least 1".to_owned());
        }
        if self.requests == 0 {
            return Err("--requests must be at least 1".to_owned());
        }
        if !model::SUPPORTED_TP.contains(&self.tp) {
            return Err(format!(
                "--tp {}: supported TP degrees are {:?}",
                self.tp,
                model::SUPPORTED_TP
            ));
        }
        if self.rank >= self.tp {
            return Err(format!(
                "--rank {} is not a rank of --tp {}",
                self.rank, self.tp
            ));
        }
        Ok(())
    }

    /// The flags set away from their defaults that only the GPU step reads, as given.
    fn gpu_only(&self) -> Vec<String> {
        [
            (self.steps != DEFAULT_STEPS).then(|| format!("--steps {}", self.steps)),
            (self.requests != DEFAULT_REQUESTS).then(|| format!("--requests {}", self.requests)),
            (self.tp != DEFAULT_TP).then(|| format!("--tp {}", self.tp)),
            (self.rank != DEFAULT_RANK).then(|| format!("--rank {}", self.rank)),
            self.layers.map(|n| format!("--layers {n}")),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The CPU reference step, saying which of the given flags it does not use.
fn run_cpu_step(args: &StepArgs, gpu: &GpuArgs) -> Result<(), String> {
    let unused = gpu.gpu_only();
    if !unused.is_empty() {
        println!(
            "mono step: the CPU reference step runs one step of one request over the whole model; \
             {} apply to the GPU step only",
            unused.join(", ")
        );
    }
    crate::reference::cli::run(args)
}

/// A progress line on stderr, rewritten in place; a newline once every tensor is done.
pub(super) fn print_progress(p: &Progress) {
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

/// `mono step`: on a GPU unless `--cpu`; without one, the same step on the CPU emulator where it
/// can run, else the CPU reference step.
pub fn run_step(args: &StepArgs, gpu: &GpuArgs) -> Result<(), String> {
    gpu.check()?;
    // The model, the rows and the checkpoint folder are checked before any device is opened, so
    // that a wrong flag is the first thing said on every machine.
    let (cfg, from) = step_config(args)?;
    let (cfg, from) = if gpu.cpu {
        (cfg, from)
    } else {
        first_layers(cfg, from, gpu.layers).map_err(|e| e.to_string())?
    };
    check_rows(args, &cfg)?;
    if !gpu.cpu && args.numerics != Numerics::Engines {
        return Err(format!(
            "--numerics {} picks the CPU reference step's switches; the device step computes as \
             the engines do. Add --cpu for the CPU reference step",
            numerics_name(args.numerics)
        ));
    }
    let checkpoint = match &args.weights {
        Some(dir) => Some((
            dir.as_path(),
            Checkpoint::open(dir).map_err(|e| e.to_string())?,
        )),
        None => None,
    };
    if gpu.cpu {
        return run_cpu_step(args, gpu);
    }
    let dev = match open_device(gpu.requests, args.rows as u32) {
        Ok(dev) => dev,
        Err(e) => {
            let why = no_gpu(&e).ok_or_else(|| e.to_string())?;
            return run_without_gpu(args, gpu, &cfg, &from, checkpoint, &why);
        }
    };
    run_device_step(&dev, args, gpu, &cfg, &from, checkpoint)
}

fn numerics_name(numerics: Numerics) -> String {
    numerics
        .to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_owned())
}

/// No GPU: the device step's own kernels on CPU threads (the host backend, its grid sized for
/// the step's rows unless `MONO_HOST_CTAS` says otherwise), for a model the CPU can hold and
/// where g++ builds the kernels; else the CPU reference step, which says what it takes.
fn run_without_gpu(
    args: &StepArgs,
    gpu: &GpuArgs,
    cfg: &ModelConfig,
    from: &str,
    checkpoint: Option<(&Path, Checkpoint)>,
    no_gpu: &str,
) -> Result<(), String> {
    if reference_parameters(cfg)? > MAX_REFERENCE_PARAMETERS {
        return run_cpu_step(args, gpu);
    }
    match open_emulator(gpu.requests, args.rows as u32) {
        Ok(dev) => {
            println!(
                "{}; --cpu runs the CPU reference step",
                emulated_instead("step", no_gpu, &dev)
            );
            run_device_step(&dev, args, gpu, cfg, from, checkpoint)
        }
        Err(e) => {
            println!(
                "mono step: no GPU ({no_gpu}) and no CPU emulator ({e}); the CPU reference step \
                 instead"
            );
            run_cpu_step(args, gpu)
        }
    }
}

/// The step on `dev` (a GPU or the host backend), for the shapes its launches take.
fn run_device_step(
    dev: &Device,
    args: &StepArgs,
    gpu: &GpuArgs,
    cfg: &ModelConfig,
    from: &str,
    checkpoint: Option<(&Path, Checkpoint)>,
) -> Result<(), String> {
    // The step's launches are built for the shapes the front half's kernel takes; a model it
    // does not take runs on the CPU, saying why.
    if let Err(e) = FrontKernel::build(dev, cfg, Variant::default(), None) {
        println!(
            "mono step: the device step does not take {from} ({e}); the CPU reference step \
             instead (--preset glm-5.2 for the GPU)"
        );
        return run_cpu_step(args, gpu);
    }
    run_gpu_step(dev, args, gpu, cfg, from, checkpoint).map_err(|e| e.to_string())
}

fn run_gpu_step(
    dev: &Device,
    args: &StepArgs,
    gpu: &GpuArgs,
    cfg: &ModelConfig,
    from: &str,
    checkpoint: Option<(&Path, Checkpoint)>,
) -> Result<()> {
    println!(
        "mono step on {}: {from}, {} request(s) x {} row(s), context {}",
        super::device_name(dev),
        gpu.requests,
        args.rows,
        args.context
    );
    let started = Instant::now();
    let (weights, format, made) = match checkpoint {
        Some((dir, source)) => {
            let (weights, format) =
                checkpoint_weights(dev, cfg, gpu.tp, gpu.rank, args.weight_format(), &source)?;
            let made = format!("loaded from checkpoint {}", dir.display());
            (weights, format, made)
        }
        None => {
            let format = args.weight_format();
            let weights = gpu_weights(dev, cfg, gpu.tp, gpu.rank, format, args.seed)?;
            let made = format!(
                "synthetic (seed {}), made {}",
                args.seed,
                if dev.info().backend == "host" {
                    "on the CPU"
                } else {
                    "on the GPU"
                }
            );
            (weights, format, made)
        }
    };
    println!(
        "weights: rank {} of TP {}, {:?}, {:.2} GB in {} tensors, {made} and bound in {:.1} s",
        gpu.rank,
        gpu.tp,
        format,
        weights.device.plan.bytes as f64 / 1e9,
        weights.device.plan.tensors.len(),
        started.elapsed().as_secs_f64()
    );
    let requests = scene_requests(gpu.requests, args.rows as u32, args.context as u32)?;
    with_step(
        dev,
        cfg,
        &weights,
        &requests,
        args.seed,
        gpu.steps,
        |graph, inputs| {
            println!(
                "step: {} launches ({} ... {}) and the greedy feed, captured as one graph after \
                 step 0, which runs them directly; the cross-rank all-reduce is not in it (one GPU \
                 holds one rank)",
                graph.launches().len(),
                graph.launches().first().map_or("none".into(), |l| l.name()),
                graph.launches().last().map_or("none".into(), |l| l.name()),
            );
            let report = |s: u32, ms: f64, how: &str| -> Result<()> {
                let rows = inputs.read()?;
                println!(
                    "step {s}: {ms:.3} ms ({how}); next positions {:?}, tokens {:?}",
                    rows.positions, rows.tokens
                );
                Ok(())
            };
            report(0, graph.time_eager(dev)?, "launched directly")?;
            if gpu.steps > 1 {
                graph.capture()?;
            }
            for s in 1..gpu.steps {
                report(s, graph.time_replays(dev, 1)?[0], "graph replay")?;
            }
            Ok(())
        },
    )
}
