//! The GPU side of `mono step`, `mono dump`, `mono compare`, `mono check` and `mono bench`.
//!
//! The step built here is the whole decode step of one rank: every layer's fused launch in order
//! (`super::layer`), the tail, and the greedy feed, over the rank's weights and hashed caches
//! holding each request's context. Synthetic weights are made on a GPU by the hash kernel, and on
//! the host backend by the same rule on the CPU, then uploaded (the same values either way); a
//! checkpoint folder's (`mono step --weights`) are cut for the rank on the host and uploaded.

mod bench;
mod check;
mod dump;
mod step;
mod trace;

pub use super::check::cache_format;
pub use bench::{run_bench, BenchArgs};
pub use check::{run_check, CheckArgs};
pub use dump::{run_compare, run_dump, DumpArgs};
pub use step::{make_weights, run_step, GpuArgs};
pub use trace::{run_trace, trace_step, StepTraced, TraceArgs};

use clap::Args;
use device::{BackendChoice, Device};
use mailbox::gpu::Variant;
use model::ModelConfig;

use super::graph::StepGraph;
use super::inputs::{Batch, FeedKernel, RequestInput, StepInputs};
use super::layer::step::{
    front_requests, plan_step, step_build, step_graph, StepArena, StepKernels, StepPieces,
};
use super::layer::{CacheImages, ModelWeights};
use super::scene::SceneRequest;
use super::weights::{DeviceWeights, WeightPlan};
use super::{Result, StepError};
use crate::fused::layer::LayerPlan;
use model::paging::{pages_through, PageTable, PAGE_TOKENS};
use model::WeightFormat;

/// The shape of a GPU step: preset, seed, and the batch.
#[derive(Debug, Clone, Args)]
pub struct StepShape {
    /// Model preset: glm-5, glm-5.2 or tiny.
    #[arg(long, default_value = "glm-5.2")]
    pub preset: String,
    /// Seed of the synthetic weights (made on a GPU by the hash kernel; on the host backend,
    /// MONO_BACKEND=host, the same values made on the CPU and uploaded) and of the caches.
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
    /// Tensor-parallel size of the weights; the GPU holds rank 0's.
    #[arg(long, default_value_t = 8)]
    pub tp: usize,
}

/// GPU 0, or the host backend where `MONO_BACKEND=host` asks for it: its grid then sized for a
/// step of `requests` x `rows`, as when a command finds no GPU (`MONO_HOST_CTAS` still sets it),
/// so that every command takes the same rows on the emulator whether it was asked for or not.
fn open_device(requests: u32, rows: u32) -> device::Result<Device> {
    match BackendChoice::from_env() {
        BackendChoice::Host => open_emulator(requests, rows),
        choice => Device::open_with(0, choice),
    }
}

/// Why a command found no GPU, when that is what `Device::open` failed with (no driver, or a
/// driver that reports none): the command may then run on the host backend.
fn no_gpu(e: &device::DeviceError) -> Option<String> {
    match e {
        device::DeviceError::NoDriver { detail } => Some(detail.clone()),
        device::DeviceError::NoDevice { .. } => Some(e.to_string()),
        _ => None,
    }
}

/// The host backend for a command that found no GPU, its grid sized for `requests` x `rows`
/// unless `MONO_HOST_CTAS` asks for another.
fn open_emulator(requests: u32, rows: u32) -> device::Result<Device> {
    Device::open_host(
        device::host::ctas_from_env().unwrap_or_else(|| emulated_ctas(requests, rows)),
    )
}

/// The smallest emulated grid, at least 4 CTAs, that a step of `requests` x `rows` takes: the
/// front half gives each row's key and query tasks a CTA of their own, and every group of a
/// request's rows a scoring run at least.
fn emulated_ctas(requests: u32, rows: u32) -> u32 {
    let all_rows = requests.saturating_mul(rows);
    let groups = requests.saturating_mul(rows.div_ceil(indexer::layout::MAX_GROUP_ROWS));
    (4..device::host::MAX_HOST_CTAS)
        .find(|&ctas| indexer::layout::max_runs(ctas, all_rows).is_some_and(|runs| runs >= groups))
        .unwrap_or(device::host::MAX_HOST_CTAS)
}

/// The device as a command's first line names it: a GPU with its architecture, the host backend
/// by its name alone.
fn device_name(dev: &Device) -> String {
    let info = dev.info();
    if info.backend == "host" {
        info.name.clone()
    } else {
        format!("{} ({})", info.name, info.arch)
    }
}

/// What a command says when it runs on the host backend for want of a GPU.
fn emulated_instead(command: &str, no_gpu: &str, dev: &Device) -> String {
    format!(
        "mono {command}: no GPU ({no_gpu}); the device step's own kernels on {} emulated CTAs on \
         CPU threads instead (seconds a step)",
        dev.info().multiprocessors
    )
}

fn config(preset: &str) -> Result<ModelConfig> {
    Ok(ModelConfig::preset(preset)?)
}

/// `cfg`, named `from`, as its first `layers` layers and its head where `--layers` asks, named so:
/// every launch kind of a model on a GPU that cannot hold the whole rank.
fn first_layers(
    cfg: ModelConfig,
    from: String,
    layers: Option<usize>,
) -> Result<(ModelConfig, String)> {
    match layers {
        Some(n) => Ok((
            cfg.first_layers(n)
                .map_err(|e| StepError::Invalid(format!("--layers {n}: {e}")))?,
            format!("{from}, its first {n} layers"),
        )),
        None => Ok((cfg, from)),
    }
}

/// The rank's weights made on the device and bound for the step's launches.
pub struct GpuWeights {
    pub device: DeviceWeights,
    pub bound: ModelWeights,
}

/// Makes rank `rank` of `tp`'s synthetic weights on `dev` and binds them: on a GPU by the hash
/// kernel (progress on stderr); on the host backend by the same rule on the CPU, uploaded (the
/// hash kernel on CPU threads takes a minute at the tiny preset).
pub fn gpu_weights(
    dev: &Device,
    cfg: &ModelConfig,
    tp: usize,
    rank: usize,
    format: WeightFormat,
    seed: u64,
) -> Result<GpuWeights> {
    let device = if dev.info().backend == "host" {
        DeviceWeights::from_host(dev, WeightPlan::new(cfg, tp, rank, format)?, seed)?
    } else {
        make_weights(dev, cfg, tp, rank, format, seed)?
    };
    bind_weights(dev, cfg, device)
}

/// Rank `rank` of `tp`'s weights from an opened checkpoint folder (`Checkpoint::open`): each
/// tensor's shard cut from the whole tensor, quantised or packed on the host and uploaded, with
/// progress on stderr, then bound. A tensor missing or of the wrong shape is refused by name
/// before the arena is uploaded. The weight format is `asked`, or FP8 where the checkpoint stores
/// FP8 matrices (kept as stored: bf16 cannot hold them); it is returned.
pub fn checkpoint_weights(
    dev: &Device,
    cfg: &ModelConfig,
    tp: usize,
    rank: usize,
    asked: WeightFormat,
    source: &model::weights::Checkpoint,
) -> Result<(GpuWeights, WeightFormat)> {
    let format = checkpoint_format(source, asked);
    let plan = WeightPlan::new(cfg, tp, rank, format)?;
    let device = DeviceWeights::from_source(dev, plan, source, 0, &mut step::print_progress)?;
    Ok((bind_weights(dev, cfg, device)?, format))
}

/// The weight format for `checkpoint`: FP8 where it stores FP8, else `asked`.
pub fn checkpoint_format(
    checkpoint: &model::weights::Checkpoint,
    asked: WeightFormat,
) -> WeightFormat {
    if checkpoint.stores_fp8() {
        WeightFormat::Fp8
    } else {
        asked
    }
}

fn bind_weights(dev: &Device, cfg: &ModelConfig, device: DeviceWeights) -> Result<GpuWeights> {
    let started = std::time::Instant::now();
    let bound = ModelWeights::bind(dev, cfg, &device)?;
    eprintln!(
        "weights bound for every launch (derived forms {:.2} GB) in {:.1} s",
        bound.forms.buffer.len() as f64 / 1e9,
        started.elapsed().as_secs_f64()
    );
    Ok(GpuWeights { device, bound })
}

/// Builds the whole step (every layer's launch, the tail, the greedy feed) for `requests` over
/// hashed caches and hands it to `body` with its inputs. `steps` is how many steps `body` runs
/// (eager, replayed or launch by launch): the greedy feed moves every row on by its request's
/// rows each step, so each request gets the pages of its last step's positions too (past them a
/// new token's cache slot would be -1).
///
/// The launches' task lists are planned once, over those pages (`front_requests`), and read the
/// rows' positions on the device: each replay after the feed decodes the next step.
fn with_step<T>(
    dev: &Device,
    cfg: &ModelConfig,
    weights: &GpuWeights,
    requests: &[SceneRequest],
    seed: u64,
    steps: u32,
    body: impl FnOnce(&mut StepGraph, &StepInputs) -> Result<T>,
) -> Result<T> {
    let kernels = KernelChoice::default();
    with_step_of(
        dev,
        cfg,
        weights,
        requests,
        seed,
        steps,
        kernels,
        |graph, built| body(graph, built.inputs),
    )
}

/// What a step graph was built from, for a body that reads the arena after a launch.
struct BuiltStep<'a> {
    inputs: &'a StepInputs,
    kernels: &'a StepKernels,
    /// Every launch's plan, in step order.
    plans: &'a [LayerPlan],
    arena: &'a StepArena,
}

/// How [`with_step_of`] builds the launch kinds' kernels (by default: untraced, the default variant).
#[derive(Clone, Copy, Debug, Default)]
struct KernelChoice {
    variant: Variant,
    /// Every task's start and end recorded (`mono trace`).
    traced: bool,
    /// With `traced`, every linear tile's milestones too (`mono trace --tiles`).
    tiles: bool,
}

/// [`with_step`] with the kernels built as `kernels` says, the body also given the plans and
/// the arena.
#[allow(clippy::too_many_arguments)]
fn with_step_of<T>(
    dev: &Device,
    cfg: &ModelConfig,
    weights: &GpuWeights,
    requests: &[SceneRequest],
    seed: u64,
    steps: u32,
    kernels: KernelChoice,
    body: impl FnOnce(&mut StepGraph, &BuiltStep) -> Result<T>,
) -> Result<T> {
    let choice = kernels;
    let mut next_page = 0;
    let pages: Vec<Vec<u32>> = requests
        .iter()
        .map(|r| {
            let last = r
                .context
                .saturating_add(r.rows.max(1).saturating_mul(steps.max(1)))
                - 1;
            let count = pages_through(last);
            let p = (next_page..next_page + count).collect();
            next_page += count;
            p
        })
        .collect();
    let batch = Batch {
        requests: requests
            .iter()
            .zip(&pages)
            .enumerate()
            .map(|(q, (r, p))| RequestInput {
                tokens: (0..r.rows)
                    .map(|i| {
                        (seed as u32 ^ (q as u32 * 7919 + i * 104_729)) % cfg.vocab_size as u32
                    })
                    .collect(),
                first_position: r.context,
                pages: p.clone(),
            })
            .collect(),
        page_tokens: PAGE_TOKENS,
        pages_per_request: pages.iter().map(Vec::len).max().unwrap_or(1) as u32,
    };
    let table = PageTable::new(&pages)?;
    let contexts: Vec<u32> = requests.iter().map(|r| r.context).collect();
    let format = cache_format(cfg);
    let started = std::time::Instant::now();
    let caches = CacheImages::synthetic(cfg, format, &table, &contexts, seed)?.upload(dev)?;
    let build = step_build(dev, cfg, &batch, &weights.bound, format, caches.pages);
    let plans = plan_step(cfg, &front_requests(&batch), &build)?;
    eprintln!(
        "step planned: {} launches, caches of {} pages ({format:?}, the context's entries hashed \
         from seed {seed}, not a prefill: `mono check` runs the CPU reference's own) in {:.1} s",
        plans.len(),
        caches.pages,
        started.elapsed().as_secs_f64()
    );
    eprintln!(
        "building the launch kinds' kernels (a cold build takes minutes; the module cache in {} \
         keeps them, MONO_CACHE moves it)",
        dev.cache().dir().display()
    );
    let started = std::time::Instant::now();
    let kernels = if choice.traced {
        StepKernels::build_traced(dev, cfg, &build, &plans, choice.variant, choice.tiles)?
    } else {
        StepKernels::build(dev, cfg, &build, &plans, choice.variant)?
    };
    eprintln!(
        "{} launch kinds' kernels built in {:.1} s",
        kernels.kernels.len(),
        started.elapsed().as_secs_f64()
    );
    let arena = StepArena::new(dev, cfg, &plans)?;
    let inputs = StepInputs::new(dev, &batch)?;
    let feed_kernel = FeedKernel::build(dev)?;
    let pieces = StepPieces {
        cfg,
        build: &build,
        kernels: &kernels,
        weights: &weights.bound,
        caches: &caches,
        arena: &arena,
        inputs: &inputs,
        feed: Some(&feed_kernel),
        variant: choice.variant,
    };
    let mut graph = step_graph(dev, &pieces, plans.clone())?;
    let built = BuiltStep {
        inputs: &inputs,
        kernels: &kernels,
        plans: &plans,
        arena: &arena,
    };
    body(&mut graph, &built)
}

fn scene_requests(requests: u32, rows: u32, context: u32) -> Result<Vec<SceneRequest>> {
    if requests == 0 || rows == 0 {
        return Err(StepError::Invalid(
            "a step needs at least one request of at least one row".into(),
        ));
    }
    Ok(vec![SceneRequest { context, rows }; requests as usize])
}
