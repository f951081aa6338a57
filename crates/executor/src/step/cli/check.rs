//! `mono check`: the device step against the CPU reference step stepped with the device's top-k
//! lists and routed experts (every launch's rows beside the tolerance, the tokens of both, each
//! list or route that is not the reference's own a near-tie the measured score error explains), or with `--select` a large step's replays with every
//! full-indexer launch's selected slots checked against the reference select of its own scores.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use device::Device;
use mailbox::gpu::{DebugBound, Variant};
use model::weights::{Checkpoint, Synthetic, WeightSource};
use model::{ModelConfig, WeightFormat};

use super::{
    emulated_instead, first_layers, gpu_weights, no_gpu, open_device, open_emulator,
    scene_requests, with_step_of, BuiltStep, KernelChoice,
};
use crate::reference::cli::{reference_parameters, MAX_REFERENCE_PARAMETERS};
use crate::step::check::lists::{
    check_lists, nan_report, non_finite_output, read_front, FrontOutputs,
};
use crate::step::check::{compare_with_reference, poison_scratch, run_launches, CheckScene};
use crate::step::scene::SceneRequest;
use crate::step::weights::{DeviceWeights, WeightPlan};
use crate::step::{Result, StepError};

/// `mono check`'s flags.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// Model preset: tiny by default (the CPU reference holds every weight as f32); with
    /// --select, glm-5.2 by default.
    #[arg(long)]
    pub preset: Option<String>,
    /// A checkpoint folder (model.safetensors or its index and shards, with the published tensor
    /// names, and its config.json) for both steps instead of the preset's synthetic weights. An
    /// FP8 checkpoint's matrices stay FP8 on the device, codes and scales as stored.
    #[arg(long, conflicts_with = "select")]
    pub weights: Option<PathBuf>,
    /// Seed of the synthetic weights (and, with --select, of the caches and tokens).
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Requests, each with --rows rows.
    #[arg(long, default_value_t = 1)]
    pub requests: u32,
    /// Rows per request (1: plain decode; 4: MTP verify of 3 drafts).
    #[arg(long, default_value_t = 1)]
    pub rows: u32,
    /// Tokens each request has cached (default 20, or 8192 with --select).
    #[arg(long)]
    pub context: Option<u32>,
    /// Instead of the reference: run --replays steps of the preset's step (one rank of --tp,
    /// synthetic FP8 weights made on the GPU), and check every full-indexer launch's selected
    /// slots against the reference radix select of that launch's own scores, and every launch's
    /// output rows for values that are not finite.
    #[arg(long)]
    pub select: bool,
    /// Steps of --select.
    #[arg(long, default_value_t = 1000, requires = "select")]
    pub replays: u32,
    /// With --select: every this many steps one is run launch by launch and checked; the others
    /// are graph replays (1: every step checked).
    #[arg(long, default_value_t = 1, requires = "select")]
    pub check_every: u32,
    /// With --select: tensor-parallel size of the weights; the GPU holds rank 0's.
    #[arg(long, default_value_t = 8, requires = "select")]
    pub tp: usize,
    /// With --select: only the model's first this many layers and its head (every launch kind
    /// in a fraction of the memory: a glm-5.2 TP8 rank takes about 97 GB, its first 8 layers
    /// about 9).
    #[arg(long, requires = "select")]
    pub layers: Option<usize>,
}

/// `e`, a failure of step `step` run launch by launch, with where the failing launch's NaN
/// scores lie when it is a full-indexer launch that left any in the arena (select flags a NaN
/// without saying which key holds it); `names` are the launches' names, in the plans' order.
fn with_nan_report(e: StepError, step: u32, built: &BuiltStep, names: &[String]) -> StepError {
    let StepError::Launch { launch, message } = e else {
        return e;
    };
    let plan = names
        .iter()
        .position(|name| *name == launch)
        .and_then(|i| built.plans.get(i));
    let report = plan.and_then(|p| nan_report(p, &built.arena.arena).ok().flatten());
    StepError::Launch {
        launch,
        message: match report {
            Some(r) => format!("step {step}: {message} ({r})"),
            None => format!("step {step}: {message}"),
        },
    }
}

/// `mono check`; an error when the steps differ beyond the tolerance.
pub fn run_check(args: &CheckArgs) -> Result<(), String> {
    let default = if args.select { "glm-5.2" } else { "tiny" };
    let (cfg, from) = config(args, default).map_err(|e| e.to_string())?;
    let dev = open(args)?;
    let outcome = if args.select {
        check_select(&dev, args, &cfg, &from)
    } else {
        check_reference(&dev, args, &cfg, &from)
    };
    outcome.map_err(|e| e.to_string())
}

/// A GPU; without one, the host backend for the step against the reference (a large preset's
/// selections, `--select`, need a GPU).
fn open(args: &CheckArgs) -> Result<Device, String> {
    let no_gpu = match open_device(args.requests, args.rows) {
        Ok(dev) => return Ok(dev),
        Err(e) => no_gpu(&e).ok_or_else(|| e.to_string())?,
    };
    if args.select {
        return Err(format!(
            "no GPU ({no_gpu}); `mono check --select` runs a large preset's step and needs one"
        ));
    }
    match open_emulator(args.requests, args.rows) {
        Ok(dev) => {
            println!("{}", emulated_instead("check", &no_gpu, &dev));
            Ok(dev)
        }
        Err(e) => Err(format!(
            "no GPU ({no_gpu}) and no CPU emulator of one ({e}); `mono step --cpu` runs the CPU \
             reference step alone"
        )),
    }
}

/// Debug builds: a wait that gives up names its task instead of hanging the check.
fn variant() -> Variant {
    Variant {
        debug: Some(DebugBound {
            poll_limit: 1 << 22,
            trap: false,
        }),
        ..Variant::default()
    }
}

/// The config: beside the checkpoint, else the preset; its first `--layers` layers where asked.
fn config(args: &CheckArgs, default: &str) -> Result<(ModelConfig, String)> {
    let beside = args
        .weights
        .as_ref()
        .map(|dir| dir.join("config.json"))
        .filter(|p| p.is_file());
    let (cfg, from) = match (beside, &args.preset) {
        (Some(path), _) => (ModelConfig::from_file(&path)?, path.display().to_string()),
        (None, preset) => {
            let name = preset.as_deref().unwrap_or(default);
            (ModelConfig::preset(name)?, format!("preset {name}"))
        }
    };
    first_layers(cfg, from, args.layers)
}

fn check_reference(dev: &Device, args: &CheckArgs, cfg: &ModelConfig, from: &str) -> Result<()> {
    let parameters = reference_parameters(cfg).map_err(StepError::Invalid)?;
    if parameters > MAX_REFERENCE_PARAMETERS {
        return Err(StepError::Invalid(format!(
            "{from} has {parameters} parameters; the CPU reference holds them all as f32 and \
             takes at most {MAX_REFERENCE_PARAMETERS} (--preset tiny; --select checks a large \
             preset's selections without the reference)"
        )));
    }
    let context = args.context.unwrap_or(20);
    let requests = scene_requests(args.requests, args.rows, context)?;
    println!(
        "mono check on {}: {from}, {} request(s) x {} row(s), context {context}",
        super::device_name(dev),
        args.requests,
        args.rows
    );
    let started = Instant::now();
    let (source, format, weights_from): (Box<dyn WeightSource>, _, String) = match &args.weights {
        Some(dir) => {
            let checkpoint = Checkpoint::open(dir)?;
            let format = super::checkpoint_format(&checkpoint, WeightFormat::Bf16);
            let from = format!("checkpoint {} ({format:?} on the device)", dir.display());
            (Box::new(checkpoint), format, from)
        }
        None => (
            Box::new(Synthetic::new(cfg, args.seed, WeightFormat::Bf16)?),
            WeightFormat::Bf16,
            format!("synthetic bf16 weights, seed {}", args.seed),
        ),
    };
    let scene = CheckScene::new(cfg, source.as_ref(), &requests)?;
    let plan = WeightPlan::new(cfg, 1, 0, format)?;
    let weights = match &args.weights {
        Some(_) => DeviceWeights::from_source(
            dev,
            plan,
            source.as_ref(),
            args.seed,
            &mut super::step::print_progress,
        )?,
        None => DeviceWeights::from_host(dev, plan, args.seed)?,
    };
    println!(
        "{weights_from}; the reference's prefill and step ({:?} MLA cache) and the device's \
         weights in {:.1} s",
        scene.cache,
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let run = run_launches(
        dev,
        &scene,
        &weights,
        &scene.every_launch(),
        variant(),
        &mut |_| Ok(()),
    )?;
    println!(
        "the device step: {} launches, chained, in {:.1} s (kernels built; each launch finds its \
         own arena bytes filled with 0xff and is read back)",
        run.launches.len(),
        started.elapsed().as_secs_f64()
    );
    let report = compare_with_reference(&scene, &run);
    print!("{report}");
    if report.passed() {
        println!("the device step follows the CPU reference step");
        Ok(())
    } else {
        Err(StepError::Invalid(
            "the device step differs from the CPU reference step beyond the tolerance".into(),
        ))
    }
}

/// A copy of `out` with one list entry changed, and one with row 0's best score made its worst:
/// each must be caught.
fn corruption_control(plan: &crate::fused::layer::LayerPlan, out: &FrontOutputs) -> Result<()> {
    let mut lists = out.clone();
    lists.lists[0] = if lists.lists[0] == 0 { 1 } else { 0 };
    let caught = check_lists(plan, &lists)?;
    let ix = plan
        .index
        .as_ref()
        .ok_or_else(|| StepError::Invalid("the launch runs no indexer".into()))?;
    let len = ix.front.lens[0] as usize;
    let mut scores = out.clone();
    let row = &mut scores.scores[..len];
    let (best, _) =
        row.iter().enumerate().fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &s)| if s > b.1 { (i, s) } else { b },
        );
    let worst = row
        .iter()
        .copied()
        .filter(|s| s.is_finite())
        .fold(0f32, f32::min);
    row[best] = worst - 1.0;
    let score_caught = check_lists(plan, &scores)?;
    match (caught, score_caught) {
        (Some(a), Some(b)) => {
            println!("negative control: a changed slot list is caught ({a}); row 0's best score made its worst is caught ({b})");
            Ok(())
        }
        (None, _) => Err(StepError::Invalid(
            "negative control: a changed slot list was not caught".into(),
        )),
        (_, None) if len <= plan.slices.dims.topk as usize => {
            println!(
                "negative control: a changed slot list is caught; row 0 has {len} keys, no more \
                 than k, so every key is selected whatever its score"
            );
            Ok(())
        }
        (_, None) => Err(StepError::Invalid(
            "negative control: a corrupted score was not caught".into(),
        )),
    }
}

fn check_select(dev: &Device, args: &CheckArgs, cfg: &ModelConfig, from: &str) -> Result<()> {
    let context = args.context.unwrap_or(8192);
    let requests: Vec<SceneRequest> = scene_requests(args.requests, args.rows, context)?;
    let every = args.check_every.max(1);
    println!(
        "mono check --select on {}: {from}, TP {} rank 0, {} request(s) x {} row(s), context \
         {context}, {} steps (one in {every} launch by launch and checked)",
        dev.info().name,
        args.tp,
        args.requests,
        args.rows,
        args.replays
    );
    let weights = gpu_weights(dev, cfg, args.tp, 0, WeightFormat::Fp8, args.seed)?;
    let steps = args.replays.saturating_add(1);
    with_step_of(
        dev,
        cfg,
        &weights,
        &requests,
        args.seed,
        steps,
        KernelChoice::default(),
        |graph, built| {
            let full: Vec<usize> = (0..built.plans.len())
                .filter(|&i| built.plans[i].index.is_some())
                .collect();
            println!(
                "{} launches a step, {} with the full indexer",
                built.plans.len(),
                full.len()
            );
            graph.run_eager()?;
            graph.capture()?;
            let poisoned = poison_scratch(graph, &built.plans[0], built.arena)?;
            println!(
                "each launch run launch by launch finds its own {:.1} MB of the arena (past the \
                 step's slices) filled with 0xff: a read of bytes it did not write shows as NaN",
                poisoned as f64 / 1e6
            );
            let names: Vec<String> = graph.launches().iter().map(|l| l.name()).collect();
            let started = Instant::now();
            let (mut checked, mut replayed, mut lists) = (0u32, 0u32, 0u64);
            let mut control = false;
            for step in 0..args.replays {
                if step % every != 0 {
                    graph.replay(1)?;
                    replayed += 1;
                    continue;
                }
                let run = graph.run_inspected(&mut |i, launch| {
                    let plan = &built.plans[i];
                    if let Some(bad) = non_finite_output(plan, &built.arena.arena)? {
                        return Err(StepError::Invalid(format!(
                            "step {step}, {}: {bad}",
                            launch.name()
                        )));
                    }
                    let Some(out) = read_front(plan, &built.arena.arena)? else {
                        return Ok(());
                    };
                    if let Some(m) = check_lists(plan, &out)? {
                        return Err(StepError::Invalid(format!(
                            "step {step}, {}: {m}",
                            launch.name()
                        )));
                    }
                    if !control {
                        corruption_control(plan, &out)?;
                        control = true;
                    }
                    lists += u64::from(plan.rows);
                    Ok(())
                });
                if let Err(e) = run {
                    return Err(with_nan_report(e, step, built, &names));
                }
                checked += 1;
                if checked % 100 == 0 {
                    println!(
                        "step {}: {checked} steps checked, {lists} row lists, {:.1} s",
                        step + 1,
                        started.elapsed().as_secs_f64()
                    );
                }
            }
            let secs = started.elapsed().as_secs_f64();
            println!(
                "{} steps in {secs:.1} s: {checked} launch by launch with every full-indexer \
                 launch's lists checked ({lists} row lists, each equal to the reference select \
                 of its launch's scores), {replayed} graph replays; epoch now {}",
                args.replays,
                graph.frame().epoch()?
            );
            Ok(())
        },
    )
}
