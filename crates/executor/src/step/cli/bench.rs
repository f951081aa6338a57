//! `mono bench`: the step's replays beside the floors, and each launch kind's time.

use std::fmt::Write as _;
use std::io::Write;

use clap::Args;
use device::pages::PageSweep;
use device::report::{Figure, Reporter};
use device::Device;
use model::traffic::{step_traffic, Formats, Load};
use model::{CacheFormat, RankShapes, WeightFormat};

use super::{config, first_layers, gpu_weights, no_gpu, scene_requests, with_step};
use crate::step::bench::{time_step, StepTimes};
use crate::step::{Result, StepError};

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
    /// Also time each launch kind with the TLBs swept before each launch (a load every 64 KB of
    /// a region of this many GB; 0: not), beside its time as the step leaves them: how much of a
    /// launch is its pages' translations.
    #[arg(long, default_value_t = 0)]
    pub sweep_tlb_gb: usize,
    /// Only the model's first this many layers and its head: a step of every launch kind on a GPU
    /// that cannot hold the whole rank (a glm-5.2 TP8 rank takes about 97 GB; 40 layers fit 80 GB).
    /// Not the whole step's figure: the report and the records name the layers.
    #[arg(long)]
    pub layers: Option<usize>,
}

/// `mono bench`: per case the step's replay time beside its launches' floor and the whole
/// step's floor, and each launch kind's time; records to `MONO_BENCH_JSON` (table "step").
pub fn run_bench(args: &BenchArgs) -> Result<(), String> {
    bench(args).map_err(|e| e.to_string())
}

fn bench(args: &BenchArgs) -> Result<()> {
    let (cfg, label) = first_layers(config(&args.preset)?, args.preset.clone(), args.layers)?;
    let part = args
        .layers
        .map_or_else(String::new, |n| format!(", {n} layers"));
    let dev = Device::open(0).map_err(|e| match no_gpu(&e) {
        Some(why) => StepError::Invalid(format!("mono bench times a GPU and found none ({why})")),
        None => e.into(),
    })?;
    if dev.info().backend == "host" {
        // Its copy probe alone would take minutes, and no figure it gave would be a GPU's.
        return Err(StepError::Invalid(
            "mono bench times a GPU, and the host backend emulates one on CPU threads: run it \
             where a GPU is (mono step, check, dump and trace run on the emulator)"
                .into(),
        ));
    }
    let shapes = RankShapes::new(&cfg, args.tp)?;
    let plan = cfg.layer_plan()?;
    let copy = device::probes::copy_bandwidth(&dev, 1 << 30)?.bytes_per_s;
    let reporter = Reporter::from_env(&dev.info().name);
    println!(
        "mono bench on {}: copy bandwidth {:.2} TB/s (measured now; floors use it)",
        dev.info().name,
        copy / 1e12
    );
    let weights = gpu_weights(&dev, &cfg, args.tp, 0, WeightFormat::Fp8, args.seed)?;
    let sweep = match args.sweep_tlb_gb {
        0 => None,
        gb => Some(PageSweep::new(&dev, gb << 30)?),
    };
    for &context in &args.contexts {
        for &rows in &args.rows {
            let requests = scene_requests(1, rows, context)?;
            // The eager step, the warm-up and timed replays, the launch-by-launch steps and the
            // inspected one.
            let (warmup, direct) = (3, 5);
            let steps = 1 + warmup + args.replays + direct + 1;
            let times = with_step(
                &dev,
                &cfg,
                &weights,
                &requests,
                args.seed,
                steps,
                |graph, _| {
                    graph.run_eager()?;
                    graph.capture()?;
                    time_step(&dev, graph, warmup, args.replays, direct, sweep.as_ref())
                },
            )?;
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
            report_case(
                &reporter,
                (&label, &part),
                context,
                rows,
                copy,
                whole,
                &times,
            )?;
        }
    }
    Ok(())
}

fn report_case(
    reporter: &Reporter,
    (preset, part): (&str, &str),
    context: u32,
    rows: u32,
    copy: f64,
    whole_step_bytes: u64,
    times: &StepTimes,
) -> Result<()> {
    let case = format!(
        "{}{part}",
        device::report::rows_case(u64::from(context), rows)
    );
    let ms = |bytes: u64| bytes as f64 / copy * 1e3;
    let (floor_ms, most_ms) = (ms(times.chosen_bytes), ms(times.floor_bytes));
    let step_ms = times.step_ms();
    println!(
        "{preset} {case}: step {step_ms:.3} ms (median of {} replays); its launches' floor \
         {floor_ms:.3} ms ({:.1} MB, the experts the rows chose), ratio {:.2}{}; with every expert \
         the rows may touch {most_ms:.3} ms; the whole step's floor (all launches, TP rank bytes \
         from model::traffic, every expert the rows may touch) {:.3} ms",
        times.replays_ms.len(),
        times.chosen_bytes as f64 / 1e6,
        step_ms / floor_ms,
        if times.without_floor > 0 {
            format!(" ({} launches without a floor)", times.without_floor)
        } else {
            String::new()
        },
        ms(whole_step_bytes)
    );
    let mut figures = vec![Figure::new("step", &case, "step replay", step_ms, "ms")
        .floor(
            floor_ms,
            "bytes of the launches in the step over the copy bandwidth, the routed experts those \
             the rows chose",
        )
        .note(&format!(
            "{preset}; every layer's launch and the tail, synthetic FP8 weights, one rank (no \
             all-reduce); floor with every expert the rows may touch {most_ms:.3} ms; whole step \
             floor (model::traffic) {:.3} ms",
            ms(whole_step_bytes)
        ))];
    for k in &times.kinds {
        let floor = match &k.chosen {
            Some((bytes, _)) => Some(*bytes),
            None => k.floor_bytes,
        };
        let mut note = format!("{} a step, launched directly", k.count);
        if let Some((_, choices)) = &k.chosen {
            let mut experts: Vec<u32> = choices.iter().map(|c| c.experts).collect();
            experts.sort_unstable();
            let most = choices.iter().map(|c| c.most_experts).max().unwrap_or(0);
            let _ = write!(
                note,
                "; distinct experts a launch {}-{} (median {}) of at most {most}",
                experts[0],
                experts[experts.len() - 1],
                experts[experts.len() / 2]
            );
            if let Some(b) = k.floor_bytes {
                let _ = write!(note, "; floor with {most} experts {:.4} ms", ms(b));
            }
        }
        let mut figure = Figure::new("step", &case, &k.kind, k.ms, "ms").note(&note);
        if let Some(f) = floor {
            let how = if k.chosen.is_some() {
                "bytes of one launch over the copy bandwidth, the routed experts those its rows \
                 chose (mean of the launches)"
            } else {
                "bytes of one launch over the copy bandwidth"
            };
            figure = figure.floor(ms(f), how);
        }
        println!(
            "  {}: {:.3} ms each (median){}{}; {note}",
            k.kind,
            k.ms,
            k.swept_ms.map_or(String::new(), |s| format!(
                ", {s:.3} with the TLBs swept before it"
            )),
            floor.map_or(String::new(), |f| format!("; floor {:.4} ms", ms(f)))
        );
        if let Some(swept) = k.swept_ms {
            figures.push(
                Figure::new(
                    "step",
                    &case,
                    &format!("{}, the TLBs swept before each launch", k.kind),
                    swept,
                    "ms",
                )
                .baseline(k.ms, "the same launches as the step leaves the TLBs")
                .note(&format!("{} a step, launched directly", k.count)),
            );
        }
        figures.push(figure);
    }
    for f in figures {
        reporter.write(&f)?;
    }
    let _ = std::io::stdout().flush();
    Ok(())
}
