//! The whole step of every launch: each layer of the config in order, then the tail, planned
//! (`fused::layer::LayerPlan`), bound ([`LayerLaunch`]) and joined with the greedy feed in one
//! [`StepGraph`].
//!
//! The step's inputs live in [`StepInputs`] (the host rewrites them between replays, the feed
//! moves them on); the first launch copies them into the arena's step slices (tokens, positions,
//! the new tokens' slots, the page table, and the rope frequencies), and the tail copies its
//! picked tokens out to `StepInputs::argmax` for the feed.

use device::{Buffer, Device};
use mailbox::gpu::Variant;
use mla::layout::SplitChoice;
use model::numerics::rope_inv_freq;
use model::traffic::LaunchKind;
use model::{CacheFormat, ModelConfig};

use super::caches::StepCaches;
use super::launch::{Copy, LaunchParts, LayerKernel, LayerLaunch};
use super::weights::ModelWeights;
use crate::fused::front::FrontRequest;
use crate::fused::layer::{LaunchAt, LayerBuild, LayerPlan, StepDims};
use crate::step::graph::{StepFrame, StepGraph, StepLaunch};
use crate::step::inputs::{Batch, Feed, FeedKernel, StepInputs};
use crate::step::{Result, StepError};

/// The most distinct cache slots one attention split of the step's launches holds
/// (`LayerBuild::union`), the same in every build of them.
pub const SPLIT_UNION: usize = 128;

/// The build of a step of `batch` on `dev` for rank `rank` of `tp` (weights in `weights`'s
/// format), its caches of `cache_pages` pages in `cache`.
pub fn step_build(
    dev: &Device,
    cfg: &ModelConfig,
    batch: &Batch,
    weights: &ModelWeights,
    cache: CacheFormat,
    cache_pages: u32,
) -> LayerBuild {
    let rows: usize = batch.requests.iter().map(|r| r.tokens.len()).sum();
    LayerBuild {
        ctas: dev.info().multiprocessors,
        tp: weights.plan.tp,
        rank: weights.plan.rank,
        weights: weights.plan.format,
        cache,
        cache_pages,
        step: StepDims::new(
            cfg,
            rows as u32,
            batch.requests.len() as u32,
            batch.pages_per_request,
        ),
        union: SPLIT_UNION,
        choice: split_choice(cfg),
    }
}

/// The attention's split: the measured fastest at GLM-5's k, its block of slots the largest that
/// divides k and is no larger than the measured one (a split's wait covers `block` slot boxes of
/// its row, so a row's splits must end at k exactly).
pub fn split_choice(cfg: &ModelConfig) -> SplitChoice {
    let best = SplitChoice::MEASURED_FASTEST;
    let k = (cfg.index_topk as u32).max(1);
    let block = (1..=best.block.min(k))
        .rev()
        .find(|b| k % b == 0)
        .unwrap_or(1);
    SplitChoice { block, ..best }
}

/// The requests of `batch` as the planner takes them: over the pages each request has, not its
/// rows' positions. A request's rows are planned at the last positions its pages hold (`pages *
/// page_tokens - rows ..`), so the score runs cover every page it has and select's row lengths
/// reach past every position its rows may take; the kernels read the rows' true positions from the
/// step slice (the indexer masks the keys past each row's position with -inf, which select never
/// picks, and the attention skips the -1 entries after fewer than k). So the launches hold for
/// every step whose rows lie within the request's pages, as the greedy feed moves them on.
///
/// A request whose rows already pass its pages is planned at its own positions, where the
/// planner refuses it (`FrontError::ContextPastPages`): nothing runs.
pub fn front_requests(batch: &Batch) -> Vec<FrontRequest> {
    batch
        .requests
        .iter()
        .map(|r| {
            let rows = r.tokens.len() as u32;
            let capacity = (r.pages.len() as u32).saturating_mul(batch.page_tokens);
            FrontRequest {
                context: r.first_position.max(capacity.saturating_sub(rows)),
                rows,
                pages: r.pages.clone(),
            }
        })
        .collect()
}

/// Every launch of the step planned: each layer, then the tail.
pub fn plan_step(
    cfg: &ModelConfig,
    requests: &[FrontRequest],
    build: &LayerBuild,
) -> Result<Vec<LayerPlan>> {
    (0..cfg.num_hidden_layers)
        .map(LaunchAt::Layer)
        .chain([LaunchAt::Tail])
        .map(|at| {
            LayerPlan::plan(cfg, at, requests, build)
                .map_err(|e| StepError::Invalid(format!("{at:?}: {e}")))
        })
        .collect()
}

/// The kernel of every launch kind a step uses, built once each.
pub struct StepKernels {
    pub kernels: Vec<LayerKernel>,
}

impl StepKernels {
    pub fn build(
        dev: &Device,
        cfg: &ModelConfig,
        build: &LayerBuild,
        plans: &[LayerPlan],
        variant: Variant,
    ) -> Result<Self> {
        Self::build_as(dev, cfg, build, plans, variant, false, false)
    }

    /// Every kind's kernel built to record its tasks' starts and ends (`mono trace`), and with
    /// `tiles` the milestones of its linear tiles too.
    pub fn build_traced(
        dev: &Device,
        cfg: &ModelConfig,
        build: &LayerBuild,
        plans: &[LayerPlan],
        variant: Variant,
        tiles: bool,
    ) -> Result<Self> {
        Self::build_as(dev, cfg, build, plans, variant, true, tiles)
    }

    fn build_as(
        dev: &Device,
        cfg: &ModelConfig,
        build: &LayerBuild,
        plans: &[LayerPlan],
        variant: Variant,
        traced: bool,
        tiles: bool,
    ) -> Result<Self> {
        // Each kind with the most boxes any of its launches takes.
        let mut kinds: Vec<(LaunchKind, u32)> = Vec::new();
        for p in plans {
            let boxes = p.launch.layout.boxes();
            match kinds.iter_mut().find(|k| k.0 == p.kind) {
                Some(k) => k.1 = k.1.max(boxes),
                None => kinds.push((p.kind, boxes)),
            }
        }
        let sources = kinds
            .iter()
            .map(|&(kind, _)| LayerKernel::source(dev, cfg, build, kind, variant, traced))
            .collect::<Result<Vec<_>>>()?;
        // The kinds compile at once; a tile-stamped build's source names its buffer, made as it
        // is built, so those compile one by one.
        if !tiles {
            dev.prewarm(&sources.iter().collect::<Vec<_>>());
        }
        let kernels = kinds
            .into_iter()
            .zip(sources)
            .map(|((kind, boxes), source)| {
                let tile_boxes = tiles.then_some(boxes);
                LayerKernel::from_source(dev, build, kind, variant, source, traced, tile_boxes)
            })
            .collect::<Result<_>>()?;
        Ok(StepKernels { kernels })
    }

    pub fn of(&self, kind: LaunchKind) -> Result<&LayerKernel> {
        self.kernels
            .iter()
            .find(|k| k.kind == kind)
            .ok_or_else(|| StepError::Invalid(format!("no kernel built for {}", kind.name())))
    }
}

/// The device buffers a step shares: the activation arena and the rope frequencies it copies in.
pub struct StepArena {
    pub arena: Buffer<u8>,
    inv_freq: Buffer<f64>,
}

impl StepArena {
    /// An arena as large as the largest launch's.
    pub fn new(dev: &Device, cfg: &ModelConfig, plans: &[LayerPlan]) -> Result<Self> {
        let bytes = plans
            .iter()
            .map(|p| p.launch.arena.bytes)
            .max()
            .unwrap_or(1);
        Ok(StepArena {
            arena: dev.alloc_zeroed(bytes.max(1) as usize)?,
            inv_freq: dev.upload(&rope_inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta))?,
        })
    }
}

/// What a step graph is made of: the built pieces it borrows.
pub struct StepPieces<'a> {
    pub cfg: &'a ModelConfig,
    pub build: &'a LayerBuild,
    pub kernels: &'a StepKernels,
    pub weights: &'a ModelWeights,
    pub caches: &'a StepCaches,
    pub arena: &'a StepArena,
    pub inputs: &'a StepInputs,
    pub feed: Option<&'a FeedKernel>,
    pub variant: Variant,
}

/// The step graph of `plans` (each layer in order, then the tail) over `pieces`.
pub fn step_graph<'a>(
    dev: &Device,
    pieces: &StepPieces<'a>,
    plans: Vec<LayerPlan>,
) -> Result<StepGraph<'a>> {
    let scratch = plans
        .iter()
        .map(|p| u64::from(p.launch.layout.boxes()))
        .max()
        .unwrap_or(1);
    let frame = StepFrame::new(dev, plans.len() as u32, scratch)?;
    let arena = &pieces.arena.arena;
    let base = arena.device_ptr();
    let inputs = pieces.inputs;
    let parts = LaunchParts {
        cfg: pieces.cfg,
        build: pieces.build,
        weights: pieces.weights,
        caches: pieces.caches,
        arena,
        scale: None,
    };
    let last = plans.len() - 1;
    let mut launches: Vec<Box<dyn StepLaunch + 'a>> = Vec::new();
    for (i, plan) in plans.into_iter().enumerate() {
        let s = plan.slices;
        let before = if i == 0 {
            let copy = |slice: crate::fused::ArenaSlice, src: u64, bytes: usize| Copy {
                dst: base + slice.offset,
                src,
                bytes: bytes.min(slice.bytes as usize),
            };
            vec![
                copy(s.tokens, inputs.tokens.device_ptr(), inputs.tokens.bytes()),
                copy(
                    s.positions,
                    inputs.positions.device_ptr(),
                    inputs.positions.bytes(),
                ),
                copy(s.new_slots, inputs.slots.device_ptr(), inputs.slots.bytes()),
                copy(
                    s.page_table,
                    inputs.page_table.device_ptr(),
                    inputs.page_table.bytes(),
                ),
                copy(
                    s.inv_freq,
                    pieces.arena.inv_freq.device_ptr(),
                    pieces.arena.inv_freq.bytes(),
                ),
            ]
        } else {
            Vec::new()
        };
        let after = if i == last && plan.tail.is_some() {
            vec![Copy {
                dst: inputs.argmax.device_ptr(),
                src: base + plan.out.data.offset,
                bytes: inputs.argmax.bytes().min(plan.out.data.bytes as usize),
            }]
        } else {
            Vec::new()
        };
        let kernel = pieces.kernels.of(plan.kind)?;
        let slot = frame.slot(i as u32)?;
        let launch = LayerLaunch::new(dev, kernel, plan, &parts, slot, before, after)?;
        launches.push(Box::new(launch));
    }
    let feed = pieces.feed.map(|kernel| Feed { kernel, inputs });
    StepGraph::new(dev, frame, launches, feed, pieces.variant)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::inputs::RequestInput;
    use model::paging::PAGE_TOKENS;

    fn batch(first_position: u32, rows: usize, pages: u32) -> Batch {
        Batch {
            requests: vec![
                RequestInput {
                    tokens: vec![1; rows],
                    first_position,
                    pages: (0..pages).collect(),
                },
                RequestInput {
                    tokens: vec![2],
                    first_position: 3,
                    pages: vec![pages],
                },
            ],
            page_tokens: PAGE_TOKENS,
            pages_per_request: pages,
        }
    }

    fn build(cfg: &ModelConfig, b: &Batch) -> LayerBuild {
        LayerBuild {
            ctas: 132,
            tp: 1,
            rank: 0,
            weights: model::WeightFormat::Bf16,
            cache: CacheFormat::Bf16,
            cache_pages: 64,
            step: StepDims::new(cfg, 8, 2, b.pages_per_request),
            union: SPLIT_UNION,
            choice: split_choice(cfg),
        }
    }

    #[test]
    fn the_front_half_is_planned_over_the_pages_a_request_has() {
        let b = batch(70, 4, 3);
        let requests = front_requests(&b);
        // 3 pages hold positions 0..192: the 4 rows are planned at 188..192; one page, at 63.
        assert_eq!(
            (requests[0].context, requests[0].rows, requests[1].context),
            (3 * PAGE_TOKENS - 4, 4, PAGE_TOKENS - 1)
        );
        let cfg = ModelConfig::preset("tiny").unwrap();
        let plan = LayerPlan::plan(&cfg, LaunchAt::Layer(0), &requests, &build(&cfg, &b)).unwrap();
        let front = &plan.index.as_ref().unwrap().front;
        // The runs cover every page, select's rows reach the last position the pages hold.
        let pages: u32 = front
            .plan
            .runs
            .iter()
            .filter(|r| front.plan.groups[r.group as usize].request == 0)
            .map(|r| r.n_pages)
            .sum();
        assert_eq!(pages, 3);
        assert_eq!(front.lens, vec![189, 190, 191, 192, 64]);
    }

    #[test]
    fn a_request_past_its_pages_is_refused_before_anything_runs() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let b = batch(190, 4, 3);
        let err = plan_step(&cfg, &front_requests(&b), &build(&cfg, &b))
            .unwrap_err()
            .to_string();
        assert!(err.contains("request 0: its 190 cached tokens and 4 new ones need 4 pages; its page table has 3"), "{err}");
    }

    #[test]
    fn the_split_block_divides_k_and_an_odd_k_plans() {
        let mut cfg = ModelConfig::preset("tiny").unwrap();
        for (k, block) in [(2048, 64), (16, 16), (100, 50), (97, 1), (96, 48)] {
            cfg.index_topk = k;
            assert_eq!(split_choice(&cfg).block, block, "k {k}");
        }
        // k = 100 with the measured block of 64 would reach past k; 50 plans.
        cfg.index_topk = 100;
        let b = batch(70, 4, 3);
        let plan = LayerPlan::plan(
            &cfg,
            LaunchAt::Layer(0),
            &front_requests(&b),
            &build(&cfg, &b),
        );
        assert!(plan.is_ok(), "{:?}", plan.err());
    }
}
