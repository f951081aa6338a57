//! The GPU side of `mono step`, `mono dump`, `mono compare` and `mono bench`.
//!
//! The step built here holds the launches that exist: the fused front half of every
//! full-indexer layer (on made-up activations, [`super::scene`]), then the greedy feed. The
//! attention and MoE halves, the dense MLP, the embedding and the tail join it as they are built
//! (each a [`super::StepLaunch`]); until the tail exists no launch writes the argmax, so the
//! tokens the feed moves on are zeros, and the output says so.

mod bench;
mod dump;
mod step;

pub use bench::{run_bench, BenchArgs};
pub use dump::{run_compare, run_dump, DumpArgs};
pub use step::{make_weights, run_step, GpuArgs};

use clap::Args;
use device::Device;
use mailbox::gpu::Variant;
use model::ModelConfig;

use super::graph::{StepFrame, StepGraph};
use super::inputs::{Feed, FeedKernel, StepInputs};
use super::scene::{FrontScene, SceneRequest};
use super::{Result, StepError};
use crate::fused::front_gpu::FrontKernel;

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
