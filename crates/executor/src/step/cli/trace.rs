//! `mono trace`: every task of one decode step timed in the kernels (traced builds of every
//! launch kind), drawn as a Chrome / Perfetto trace and SVG pictures, with a summary of where each
//! launch kind's time goes; or, with `--synthetic`, a synthetic placement (`crate::trace`).

use std::path::PathBuf;

use clap::Args;
use device::Device;
use mailbox::gpu::Variant;
use mailbox::trace::{CycleClock, TimeBase, Timeline};
use model::WeightFormat;

use super::{
    config, first_layers, gpu_weights, open_device, scene_requests, with_step_of, KernelChoice,
    StepShape,
};
use crate::step::graph::TracedLaunch;
use crate::step::Result;
use crate::trace::step::{
    decode_step, kinds_timeline, step_timeline, summary, write_step, DecodedLaunch, StepFiles,
};
use crate::trace::tiles::{tile_rows, tiles_summary, tiles_tsv, us_per_tick_seen, TileRow};

/// `mono trace`'s flags.
#[derive(Debug, Clone, Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub shape: StepShape,
    /// Folder for the drawings.
    #[arg(long)]
    pub out: PathBuf,
    /// bf16 weights (default FP8).
    #[arg(long)]
    pub bf16_weights: bool,
    /// Trace a synthetic placement (a random DAG of hash tasks, seeded by --seed) instead of the
    /// step: on the CPU emulator, and on the GPU when one is present.
    #[arg(long)]
    pub synthetic: bool,
    /// The synthetic placement's CTAs (default: 8 on the emulator, one per SM on the GPU).
    #[arg(long, requires = "synthetic")]
    pub ctas: Option<u32>,
    /// The synthetic placement's tasks per CTA.
    #[arg(long, default_value_t = 8, requires = "synthetic")]
    pub tasks_per_cta: u32,
    /// The synthetic placement on the emulator only, even when a GPU is present.
    #[arg(long, requires = "synthetic")]
    pub no_gpu: bool,
    /// Also each linear tile's milestones (input wait over, x staged, first and last batch,
    /// stored, published, the slowest group's last batch: us after the tile's start), of the last
    /// launch of each kind: OUT/tiles.tsv
    /// and a line a matrix in the summary. The stamps cost the tiles a little time.
    #[arg(long, conflicts_with = "synthetic")]
    pub tiles: bool,
    /// Only the model's first this many layers and its head: every launch kind's trace on a GPU
    /// that cannot hold the whole rank (a glm-5.2 TP8 rank takes about 97 GB; 40 layers fit 80 GB).
    #[arg(long, conflicts_with = "synthetic")]
    pub layers: Option<usize>,
}

/// A traced step: its launches as read back and decoded, the drawings and the summary, and with
/// tiles asked for, the linear tiles' milestones (their table in `tiles_tsv`).
pub struct StepTraced {
    pub raw: Vec<TracedLaunch>,
    pub launches: Vec<DecodedLaunch>,
    pub timeline: Timeline,
    pub files: StepFiles,
    pub summary: String,
    pub tiles: Vec<TileRow>,
    pub tiles_tsv: Option<PathBuf>,
}

/// `mono trace`.
pub fn run_trace(args: &TraceArgs) -> Result<(), String> {
    if args.synthetic {
        let req = crate::trace::SyntheticRequest {
            ctas: args.ctas,
            tasks_per_cta: args.tasks_per_cta,
            seed: args.shape.seed,
        };
        for w in crate::trace::run_synthetic(&req, &args.out, !args.no_gpu)? {
            println!(
                "{}\n  {}\n  {}",
                w.summary,
                w.json.display(),
                w.svg.display()
            );
        }
        return Ok(());
    }
    let dev = open_device(args.shape.requests, args.shape.rows).map_err(|e| {
        format!("{e}; MONO_BACKEND=host runs the step's kernels on CPU threads (--preset tiny)")
    })?;
    let format = if args.bf16_weights {
        WeightFormat::Bf16
    } else {
        WeightFormat::Fp8
    };
    let traced = trace_step(
        &dev,
        &args.shape,
        format,
        Variant::default(),
        &args.out,
        args.tiles,
        args.layers,
    )
    .map_err(|e| e.to_string())?;
    print!("{}", traced.summary);
    let f = &traced.files;
    println!(
        "  {}\n  {}\n  {}",
        f.json.display(),
        f.svg.display(),
        f.kinds_svg.display()
    );
    if let Some(tsv) = &traced.tiles_tsv {
        println!("  {}", tsv.display());
    }
    Ok(())
}

/// Builds the step of `shape` on `dev` with every launch kind's kernel traced (`variant`
/// otherwise), runs one step to warm up, then one traced step, and writes its drawings to `out`;
/// with `tiles`, the linear tiles' milestones too (`out/tiles.tsv`, `crate::trace::tiles`); with
/// `layers`, the model's first that many layers and its head.
pub fn trace_step(
    dev: &Device,
    shape: &StepShape,
    format: WeightFormat,
    variant: Variant,
    out: &std::path::Path,
    tiles: bool,
    layers: Option<usize>,
) -> Result<StepTraced> {
    let invalid = crate::step::StepError::Invalid;
    let (cfg, _) = first_layers(config(&shape.preset)?, shape.preset.clone(), layers)?;
    let requests = scene_requests(shape.requests, shape.rows, shape.context)?;
    let weights = gpu_weights(dev, &cfg, shape.tp, 0, format, shape.seed)?;
    let kernels = KernelChoice {
        variant,
        traced: true,
        tiles,
    };
    let info = dev.info();
    // The host backend's cycles are its nanoseconds; a GPU's SM cycles are finer than its timer.
    let base = match CycleClock::from_khz(info.clock_khz) {
        Some(clock) if info.arch != "host" => TimeBase::Cycles(clock),
        _ => TimeBase::Timer,
    };
    // A tile stamp's tick: an SM cycle, or the host's nanosecond.
    let us_per_tick = match base {
        TimeBase::Cycles(clock) => 1e-3 / clock.ghz(),
        TimeBase::Timer => 1e-3,
    };
    let (raw, tile_rows_read) = with_step_of(
        dev,
        &cfg,
        &weights,
        &requests,
        shape.seed,
        2,
        kernels,
        |graph, built| {
            graph.run_eager()?;
            let raw = graph.run_traced()?;
            // Each kind's records are its last launch's: every tile task rewrites its own.
            let mut rows = Vec::new();
            for k in &built.kernels.kernels {
                let Some(words) = k.take_tile_stamps()? else {
                    continue;
                };
                if let Some(last) = raw.iter().rev().find(|l| l.kind == k.kind.name()) {
                    let tick = us_per_tick_seen(last).unwrap_or(us_per_tick);
                    rows.extend(tile_rows(last, &words, tick));
                }
            }
            Ok((raw, rows))
        },
    )?;
    let launches = decode_step(&raw).map_err(invalid)?;
    let what = format!(
        "{} TP{} rank 0, {} x {} row(s), context {}, {}",
        shape.preset, shape.tp, shape.requests, shape.rows, shape.context, info.name
    );
    let timeline = step_timeline(&launches, base, &format!("{what}: one decode step"));
    let kinds = kinds_timeline(
        &launches,
        base,
        &format!("{what}: each launch kind's first, end to end"),
    );
    let files = write_step(out, &timeline, &kinds).map_err(invalid)?;
    let mut summary = summary(&launches, &timeline);
    let tiles_tsv = if tiles {
        let path = out.join("tiles.tsv");
        std::fs::write(&path, tiles_tsv(&tile_rows_read))
            .map_err(|e| invalid(format!("{}: {e}", path.display())))?;
        summary.push_str(
            "linear tiles of each kind's last launch, medians, us after the tile's start:\n",
        );
        summary.push_str(&tiles_summary(&tile_rows_read));
        Some(path)
    } else {
        None
    };
    Ok(StepTraced {
        raw,
        launches,
        timeline,
        files,
        summary,
        tiles: tile_rows_read,
        tiles_tsv,
    })
}
