//! `mono`: the monokernel command line.

use clap::{Parser, Subcommand, ValueEnum};
use executor::{info, kernels};
use model::traffic::{Formats, Load};
use model::{CacheFormat, ModelConfig, WeightFormat};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "mono",
    version,
    about = "GLM-5-class decode as one persistent GPU kernel per layer"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Fp8,
    Bf16,
}

#[derive(Subcommand)]
enum Command {
    /// Decode steps. On a GPU: the preset's synthetic weights made on the device (one rank's; on
    /// the host backend, MONO_BACKEND=host, the same values made on the CPU and uploaded), or a
    /// checkpoint folder's (--weights) sharded for the rank and uploaded; step 0's launches run
    /// directly, then captured as one graph that the later steps replay; each step's time and
    /// tokens.
    /// Without a GPU: the same step's kernels on the host backend (CPU threads, a grid sized
    /// for the rows; tiny preset by default), where g++ builds them. With --cpu (or without a
    /// GPU and g++): one CPU reference step, with per-layer progress and the argmax tokens.
    Step {
        #[command(flatten)]
        args: executor::reference::cli::StepArgs,
        #[command(flatten)]
        gpu: executor::step::cli::GpuArgs,
    },
    /// SHA-256 of every tensor each launch of a GPU step writes, one launch at a time.
    Dump(executor::step::cli::DumpArgs),
    /// The device step against the CPU reference step on the same weights, caches and rows
    /// (tiny preset, or --weights DIR): each launch's largest error beside the tolerance, the
    /// tokens of both; fails when they differ beyond it. Runs on a GPU; without one, on the CPU
    /// emulator (its grid sized for the rows; MONO_BACKEND=host asks for it anywhere). With
    /// --select: a large preset's step replayed, every full-indexer launch's selected slots
    /// checked against the reference select of its own scores.
    Check(executor::step::cli::CheckArgs),
    /// Compare two dumps: equal, or the first launch and tensor that differ.
    Compare { first: PathBuf, second: PathBuf },
    /// Time the GPU step from graph replays beside its HBM floor, and each launch kind.
    Bench(executor::step::cli::BenchArgs),
    /// Per-rank shapes, the bytes each launch kind must read, and their HBM floors.
    Info {
        /// Model preset: glm-5, glm-5.2 or tiny.
        #[arg(long, default_value = "glm-5", conflicts_with = "config")]
        preset: String,
        /// A Hugging Face config.json instead of a preset.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Tensor-parallel size (1, 2, 4 or 8); the figures are for one rank.
        #[arg(long, default_value_t = 1)]
        tp: usize,
        /// Query rows per launch (one per request).
        #[arg(long, default_value_t = 1)]
        rows: u64,
        /// Rows per request (MTP verify: draft steps + 1); --rows counts requests times this.
        #[arg(long, default_value_t = 1)]
        rows_per_request: u64,
        /// Cached tokens each request sees, this step's rows included.
        #[arg(long, default_value_t = 4096)]
        context: u64,
        #[arg(long, value_enum, default_value = "fp8")]
        weights: Format,
        #[arg(long, value_enum, default_value = "fp8")]
        cache: Format,
        /// HBM bandwidth for the floors, TB/s (default: the H200 copy figure).
        #[arg(long, default_value_t = 3.99)]
        bandwidth: f64,
        /// CTAs the launches' chains are planned for (one a SM; 132 on an H100 or H200 SXM).
        #[arg(long, default_value_t = 132)]
        ctas: u32,
        /// Microseconds a hand-off costs, for the chain floors (default: a grid-wide hand-off on
        /// the H200, BENCHMARKS.md's dependent reads).
        #[arg(long, default_value_t = 0.95)]
        hand_off_us: f64,
        /// Also describe the GPU of this machine.
        #[arg(long)]
        gpu: bool,
    },
    /// Record every task's start and end in one decode step and draw them: OUT/step.json (Chrome /
    /// Perfetto trace events, a process per launch in time order, a track per CTA; open in
    /// ui.perfetto.dev), OUT/step.svg (a row per CTA, a bar per task coloured by stage and kind,
    /// the launches marked, a time axis in microseconds) and OUT/kinds.svg (the first launch of
    /// each kind); prints each launch kind's time, its stages' shares and the idle CTA share.
    /// The step is built as `mono step` builds it, every kernel a traced build; MONO_BACKEND=host
    /// runs it on CPU threads (--preset tiny --tp 1). --synthetic traces a synthetic placement.
    Trace(executor::step::cli::TraceArgs),
    /// Build every kernel for sm_90a and gfx950 and print registers, spills, scratch and shared memory.
    /// The builds run a thread a core, each reported on stderr as it ends.
    Kernels {
        /// Targets to build for.
        #[arg(long, default_values_t = kernels::TARGETS.map(String::from))]
        target: Vec<String>,
        /// Build only the sources whose path contains this (repeatable), e.g. fused_layer_moe_shared.
        #[arg(long)]
        only: Vec<String>,
        /// Write each built image to `DIR/<target>/` (sm_90a: .cubin for `nvdisasm -gi`; gfx950:
        /// .hsaco for `llvm-objdump -d`).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Fail when a compiler is missing instead of skipping its target.
        #[arg(long)]
        require_compilers: bool,
    },
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Step { args, gpu } => executor::step::cli::run_step(&args, &gpu),
        Command::Dump(args) => executor::step::cli::run_dump(&args),
        Command::Check(args) => executor::step::cli::run_check(&args),
        Command::Compare { first, second } => executor::step::cli::run_compare(&first, &second),
        Command::Bench(args) => executor::step::cli::run_bench(&args),
        Command::Info {
            preset,
            config,
            tp,
            rows,
            rows_per_request,
            context,
            weights,
            cache,
            bandwidth,
            ctas,
            hand_off_us,
            gpu,
        } => {
            let (cfg, name) = match &config {
                Some(path) => (ModelConfig::from_file(path), path.display().to_string()),
                None => (ModelConfig::preset(&preset), preset.clone()),
            };
            let cfg = cfg.map_err(|e| e.to_string())?;
            if rows == 0 || rows_per_request == 0 || rows % rows_per_request != 0 {
                return Err(format!("--rows ({rows}) must be a positive multiple of --rows-per-request ({rows_per_request})"));
            }
            if !bandwidth.is_finite() || bandwidth <= 0.0 {
                return Err(format!("--bandwidth must be positive, got {bandwidth}"));
            }
            if !hand_off_us.is_finite() || hand_off_us < 0.0 {
                return Err(format!(
                    "--hand-off-us must be 0 or more, got {hand_off_us}"
                ));
            }
            if ctas == 0 {
                return Err("--ctas must be at least 1".into());
            }
            let cache_format = match cache {
                Format::Fp8 => CacheFormat::Fp8,
                Format::Bf16 => CacheFormat::Bf16,
            };
            let cache_flag = match cache {
                Format::Fp8 => "`--cache fp8`",
                Format::Bf16 => "`--cache bf16`",
            };
            cfg.check_mla_cache(cache_format, cache_flag)
                .map_err(|e| e.to_string())?;
            let req = info::InfoRequest {
                config: cfg,
                preset_name: name,
                tp,
                load: Load {
                    requests: rows / rows_per_request,
                    rows_per_request,
                    context,
                },
                formats: Formats {
                    weights: match weights {
                        Format::Fp8 => WeightFormat::Fp8,
                        Format::Bf16 => WeightFormat::Bf16,
                    },
                    cache: cache_format,
                },
                bandwidth: bandwidth * 1e12,
                ctas,
                hand_off_us,
            };
            print!("{}", info::render(&req).map_err(|e| e.to_string())?);
            if gpu {
                print!("{}", info::render_gpu());
            }
            Ok(())
        }
        Command::Trace(args) => executor::step::cli::run_trace(&args),
        Command::Kernels {
            target,
            only,
            out,
            require_compilers,
        } => {
            let require = require_compilers
                || std::env::var("MONO_REQUIRE_COMPILERS").is_ok_and(|v| v == "1");
            let targets: Vec<&str> = target.iter().map(String::as_str).collect();
            let choice = kernels::BuildChoice { only, images: out };
            let table = kernels::build(&targets, require, &choice);
            print!("{}", table.render());
            if table.failures.is_empty() {
                Ok(())
            } else {
                Err(format!("{} kernel build(s) failed", table.failures.len()))
            }
        }
    }
}

fn main() -> ExitCode {
    // Output piped into `head` and the like ends the process quietly when the reader goes, as
    // for any command-line tool, instead of a panic at the next line printed.
    #[cfg(unix)]
    // SAFETY: restores the default action of one signal before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mono: {e}");
            ExitCode::FAILURE
        }
    }
}
