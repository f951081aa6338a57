//! The front halves of a step on made-up activations, until the launches before them exist: for
//! every full-indexer layer an index-key cache holding each request's context as hashed keys, and
//! hashed key and query projections and gates for the step's rows. Everything is a function of
//! the seed (values by `model::weights::SyntheticRule` over made-up names), so two runs agree.

use device::{Buffer, Device};
use indexer::layout::CacheLayout;
use indexer::reference::IndexerDims;
use model::paging::{pages_through, PAGE_TOKENS};
use model::weights::SyntheticRule;
use model::{IndexerKind, ModelConfig};

use super::front::FrontStep;
use super::graph::{StepFrame, StepLaunch};
use super::inputs::{Batch, RequestInput};
use super::Result;
use crate::fused::front::{FrontGraph, FrontRequest};
use crate::fused::front_gpu::{FrontInputs, FrontKernel, FrontLaunch};

/// A request of the scene: `context` tokens cached, `rows` new rows this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SceneRequest {
    pub context: u32,
    pub rows: u32,
}

/// `n` hashed values of stream `name` (bf16-exact, within about +-2), times `scale`.
fn hashed(seed: u64, name: &str, n: usize, scale: f32) -> Vec<f32> {
    let rule = SyntheticRule::new(seed, name, &[1]);
    (0..n as u64).map(|i| rule.value(i) * scale).collect()
}

fn bf16_bits(values: &[f32]) -> Vec<u16> {
    values.iter().map(|v| (v.to_bits() >> 16) as u16).collect()
}

/// One full-indexer layer's front-half inputs.
struct LayerBuffers {
    layer: usize,
    key_proj: Buffer<u16>,
    query_proj: Buffer<u16>,
    gates: Buffer<f32>,
    norm_weight: Buffer<f32>,
    norm_bias: Buffer<f32>,
    cache: Buffer<u8>,
}

/// The scene's buffers and each layer's planned front half.
pub struct FrontScene {
    pub requests: Vec<FrontRequest>,
    pub cache_pages: u32,
    layers: Vec<LayerBuffers>,
    graphs: Vec<FrontGraph>,
}

impl FrontScene {
    /// Requests get consecutive pages in order; the caches hold their contexts.
    pub fn new(
        dev: &Device,
        cfg: &ModelConfig,
        kernel: &FrontKernel,
        requests: &[SceneRequest],
        seed: u64,
    ) -> Result<Self> {
        let dims = IndexerDims::new(cfg).map_err(crate::fused::front_gpu::FrontGpuError::from)?;
        let layout = CacheLayout::new(dims.head_dim as u32)
            .map_err(crate::fused::front_gpu::FrontGpuError::from)?;
        let mut next_page = 0;
        let front: Vec<FrontRequest> = requests
            .iter()
            .map(|r| {
                let count = pages_through(r.context + r.rows.max(1) - 1);
                let pages = (next_page..next_page + count).collect();
                next_page += count;
                FrontRequest {
                    context: r.context,
                    rows: r.rows,
                    pages,
                }
            })
            .collect();
        let cache = cache_bytes(&layout, &front, seed);
        let rows: usize = requests.iter().map(|r| r.rows as usize).sum();
        let mut layers = Vec::new();
        let mut graphs = Vec::new();
        for plan in cfg.layer_plan()? {
            if plan.indexer != IndexerKind::Full {
                continue;
            }
            let name = |what: &str| format!("scene.layer{}.{what}", plan.index);
            let (h, d) = (dims.heads, dims.head_dim);
            layers.push(LayerBuffers {
                layer: plan.index,
                key_proj: dev.upload(&bf16_bits(&hashed(seed, &name("key"), rows * d, 1.5)))?,
                query_proj: dev.upload(&bf16_bits(&hashed(
                    seed,
                    &name("query"),
                    rows * h * d,
                    0.5,
                )))?,
                gates: dev.upload(&hashed(seed, &name("gates"), rows * h, 0.5))?,
                norm_weight: dev.upload(
                    &hashed(seed, &name("norm"), d, 0.25)
                        .iter()
                        .map(|v| 1.0 + v)
                        .collect::<Vec<_>>(),
                )?,
                norm_bias: dev.upload(&hashed(seed, &name("bias"), d, 0.1))?,
                cache: dev.upload(&cache)?,
            });
            graphs.push(
                FrontGraph::new(cfg, &front, kernel.build_info(next_page))
                    .map_err(crate::fused::front_gpu::FrontGpuError::from)?,
            );
        }
        Ok(FrontScene {
            requests: front,
            cache_pages: next_page,
            layers,
            graphs,
        })
    }

    /// Each full-indexer layer's planned front half, in step order.
    pub fn graphs(&self) -> &[FrontGraph] {
        &self.graphs
    }

    /// Front-half launches in the step: one per full-indexer layer.
    pub fn launch_count(&self) -> u32 {
        self.layers.len() as u32
    }

    /// The scratch boxes the launches need.
    pub fn scratch_boxes(&self) -> u64 {
        self.graphs
            .iter()
            .map(|g| u64::from(g.layout.boxes()))
            .max()
            .unwrap_or(0)
    }

    /// The launches, as launches `first_index..` of `frame`'s step.
    pub fn launches<'a>(
        &'a self,
        dev: &Device,
        kernel: &'a FrontKernel,
        frame: &StepFrame,
        first_index: u32,
    ) -> Result<Vec<Box<dyn StepLaunch + 'a>>> {
        let mut out: Vec<Box<dyn StepLaunch + 'a>> = Vec::new();
        for (i, (l, graph)) in self.layers.iter().zip(&self.graphs).enumerate() {
            let inputs = FrontInputs {
                key_proj: &l.key_proj,
                query_proj: &l.query_proj,
                gates: &l.gates,
                norm_weight: &l.norm_weight,
                norm_bias: &l.norm_bias,
                cache: &l.cache,
            };
            let slot = frame.slot(first_index + i as u32)?;
            let launch = FrontLaunch::in_step(dev, kernel, graph.clone(), &inputs, &slot)?;
            out.push(Box::new(FrontStep {
                name: format!("layer {} front half", l.layer),
                kernel,
                launch,
            }));
        }
        Ok(out)
    }

    /// The step inputs of the scene's rows: tokens hashed from the seed, positions after the
    /// contexts, the requests' pages.
    pub fn batch(&self, seed: u64, vocab: usize) -> Batch {
        let requests = self
            .requests
            .iter()
            .enumerate()
            .map(|(q, r)| RequestInput {
                tokens: hashed(seed, &format!("scene.tokens{q}"), r.rows as usize, 1.0)
                    .iter()
                    .map(|v| (v.to_bits() >> 16) % vocab as u32)
                    .collect(),
                first_position: r.context,
                pages: r.pages.clone(),
            })
            .collect();
        Batch {
            requests,
            page_tokens: PAGE_TOKENS,
            pages_per_request: self
                .requests
                .iter()
                .map(|r| r.pages.len() as u32)
                .max()
                .unwrap_or(1),
        }
    }
}

/// The index-key cache: each request's context as hashed E4M3 keys (NaN codes moved to their
/// neighbour) with power-of-two scales; the new rows' slots are left zero for the launch to write.
fn cache_bytes(layout: &CacheLayout, requests: &[FrontRequest], seed: u64) -> Vec<u8> {
    let pages: usize = requests.iter().map(|r| r.pages.len()).sum();
    let mut bytes = vec![0u8; pages * layout.page_bytes() as usize];
    let d = layout.head_dim() as usize;
    let rule = SyntheticRule::new(seed, "scene.index_keys", &[1]);
    let mut i = 0u64;
    for r in requests {
        for t in 0..r.context {
            let page = r.pages[(t / PAGE_TOKENS) as usize];
            let at = layout.key_offset(page, t % PAGE_TOKENS) as usize;
            for c in &mut bytes[at..at + d] {
                let code = (rule.value(i) * 64.0) as i8 as u8;
                *c = if code & 0x7f == 0x7f { code ^ 1 } else { code };
                i += 1;
            }
            let scale = 2f32.powi(-2 - (bytes[at] % 5) as i32);
            let s = layout.scale_offset(page, t % PAGE_TOKENS) as usize;
            bytes[s..s + 4].copy_from_slice(&scale.to_ne_bytes());
        }
    }
    bytes
}
