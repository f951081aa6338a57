//! `mono dump` and `mono compare`.

use std::path::PathBuf;

use clap::Args;

use super::{config, first_layers, gpu_weights, open_device, scene_requests, with_step, StepShape};
use crate::step::digest::{compare, Comparison, Dump};
use crate::step::{Result, StepError};
use model::WeightFormat;

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
    /// Only the model's first this many layers and its head: every launch kind's digests on a GPU
    /// that cannot hold the whole rank (a glm-5.2 TP8 rank takes about 97 GB; 40 layers fit 80 GB).
    #[arg(long)]
    pub layers: Option<usize>,
}

/// `mono dump`: the digests of every launch's outputs in one step, launched launch by launch
/// after `--replays` replays of the captured step.
pub fn run_dump(args: &DumpArgs) -> Result<(), String> {
    dump(args).map_err(|e| e.to_string())
}

fn dump(args: &DumpArgs) -> Result<()> {
    let s = &args.shape;
    let (cfg, model) = first_layers(config(&s.preset)?, s.preset.clone(), args.layers)?;
    let dev = open_device(s.requests, s.rows)?;
    let requests = scene_requests(s.requests, s.rows, s.context)?;
    let weights = gpu_weights(&dev, &cfg, s.tp, 0, WeightFormat::Fp8, s.seed)?;
    // The eager step and the replays before the dumped step, and the dumped step.
    let steps = args.replays.saturating_add(2);
    let dump = with_step(
        &dev,
        &cfg,
        &weights,
        &requests,
        s.seed,
        steps,
        |graph, _| {
            // Without replays the dumped step is the first: a launch that fails is named.
            if args.replays > 0 {
                graph.run_eager()?;
                graph.capture()?;
                graph.replay(args.replays)?;
            }
            graph.dump_step()
        },
    )?;
    let dump = dump
        .with_header("preset", &model)
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
