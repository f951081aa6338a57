//! One fused launch a layer (and the tail's), composed from the parts in one [`LaunchGraph`](super::LaunchGraph)
//! with one global order (ARCHITECTURE.md section 5). [`LayerPlan::plan`] builds every launch kind
//! of `model::traffic::LaunchKind`:
//!
//! ```text
//! [embed (layer 0)] -> attention latents (q_a, kv_a normalising their x; KV norm; [full: the
//!       input norm, the indexer's input])
//!   -> [full indexer: wk, weights_proj, wq_b as linear tasks; wq_b norms q_a's output itself]
//!   -> [full indexer: index keys, queries, scores, select; the key and query tasks wait on the
//!       projections' completion lines]
//!   -> attention queries (q_b normalising q_a's output, q rope, W_UK; in a full-indexer launch
//!       behind the front half's tasks on their CTAs, so that scoring starts with the query)
//!   -> [full: a Slots task a row waiting on select's list box of its row | shared: one Slots task
//!       publishing the lists an earlier full layer's select left in the step slices]
//!   -> attention (cache writes, splits, combines), W_UV, o_proj + residual
//!   -> dense MLP (its post-attention norm included) | MoE (its router k-splits, shared and
//!       routed gate/ups normalising h by the post-attention norm as they stage it)
//!   -> the layer's output rows in the step's residual stream
//! tail: final norm, lm_head shard, argmax, pick (its input: the last layer's output rows)
//! ```
//!
//! # The step's arena
//!
//! All launches of a step share ONE activation arena (they run in stream order, so one launch's
//! slices may reuse another's bytes; the arena is as large as the largest launch's
//! `PlannedLaunch::arena.bytes`). Every launch's graph reserves the same step slices first, in the
//! same order and of sizes that depend only on the build ([`StepDims`]: the most rows, requests and
//! pages a step of the build has, never the batch in hand), so they sit at the same offsets in
//! every launch ([`StepSlices::reserve`]):
//!
//! - `tokens [max_rows] u32`, `positions [max_rows] u32`, `new_slots [max_rows] u32` (the cache
//!   slot of each row's new token), `inv_freq [rope / 2] f64` (one table: the MLA's and the
//!   indexer's ropes have the same dims and theta), the page table `[max_requests][pages_per_request]
//!   u32` (the MLA cache and the index-key cache number their pages alike, so one table serves
//!   both), all written by the host before a step (the greedy feed writes `tokens` on the device);
//! - `slot_lists [max_rows][topk] i32`: written by a full-indexer layer's select, read by its own
//!   attention (after select's list box of the row) and by the shared-indexer layers after it
//!   (which wait on nothing: an earlier launch wrote them);
//! - `hidden [2][max_rows][hidden] bf16`: the residual stream, ping-pong. Layer i reads
//!   `hidden[i % 2]` and its last part (the dense MLP or the MoE) writes `hidden[(i + 1) % 2]`;
//!   layer 0's embedding writes `hidden[0]` first; the tail reads `hidden[layers % 2]`.
//!
//! Two refinements over a contract of the step's rows: the slices are sized by the build's
//! maxima, so a captured step keeps its offsets for any batch of the build; and a row's slices
//! are the first `rows` rows of them (`StepSlices::rows_of`), so the parts see dense
//! `[rows][...]` tensors. Everything after the step slices is the launch's own.
//!
//! Every task that needs a row's position reads it from `positions` (the MLA's ropes and cache
//! writes through `new_slots`, the indexer's ropes, its new keys' slots and the -inf past each row
//! through `idx_args::positions`); none is planned from it. The front half is planned over the
//! pages each request has (`step::layer::step::front_requests`: the rows at the last positions
//! its pages hold), so its score runs and select's row lengths cover every position the pages
//! allow. A captured step therefore holds for every position its pages allow: the greedy feed
//! moves the positions on the device and the next replay decodes the next step.
//!
//! Outside the arena, per layer: the MLA cache and the index-key cache of that layer.
//!
//! # What the binding fills
//!
//! [`LayerPlan`] exposes the checked [`PlannedLaunch`], each part's plan (with its own `bind`,
//! `matrices` or `mla_args`), the launch's matrix list ([`LayerMatrix`]: which index is which
//! tensor, by checkpoint name), the expert banks ([`ExpertBank`]), the vector weights
//! ([`LayerVector`]), the head stage's descriptor lists ([`HeadLists`]) and the stages in the
//! order of the kernel's arguments ([`layer_stages`], [`layer_source`]).

pub mod check;
pub mod index;
mod plan;
pub mod slices;
pub mod source;
pub mod weights;

pub use index::{IndexDims, IndexPart, IndexProjections, IndexWeights};
pub use slices::{SliceError, StepDims, StepSlices};
pub use source::{layer_source, layer_stages, SOURCE_NAME};
pub use weights::{ExpertBank, LayerMatrix, LayerVector, MatrixSource, VectorUse};

use super::attention::{HalfError, HalfPlan};
use super::front::FrontError;
use super::graph::{GraphError, Handoff, PlannedLaunch};
use super::head::{DensePlan, EmbedPlan, HeadLists, HeadPartError, TailPlan};
use super::moe::{MoeGraphError, MoePart};
use mailbox::Stage;
use mla::layout::SplitChoice;
use model::traffic::LaunchKind;
use model::{CacheFormat, WeightFormat};

/// Which launch of the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchAt {
    Layer(usize),
    Tail,
}

/// What the step's launches are built for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerBuild {
    /// CTAs of the grid (one a SM).
    pub ctas: u32,
    pub tp: usize,
    /// The rank's index in the TP group (its lm_head shard).
    pub rank: usize,
    pub weights: WeightFormat,
    /// The MLA cache's records.
    pub cache: CacheFormat,
    /// Pages of each layer's caches (both caches have as many).
    pub cache_pages: u32,
    pub step: StepDims,
    /// The attention's split (`HalfBuild`): most distinct slots a split holds, and the cut.
    pub union: usize,
    pub choice: SplitChoice,
}

/// A launch that cannot be planned, found before anything runs.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("model: {0}")]
    Model(#[from] model::ModelError),
    #[error("layer {layer}: the model has {layers} layers")]
    NoSuchLayer { layer: usize, layers: usize },
    #[error("batch: {0}")]
    Batch(String),
    #[error("step slices: {0}")]
    Slices(#[from] SliceError),
    #[error("launch graph: {0}")]
    Graph(#[from] GraphError),
    #[error("attention: {0}")]
    Half(#[from] HalfError),
    #[error("front half: {0}")]
    Front(#[from] FrontError),
    #[error("MoE: {0}")]
    Moe(#[from] MoeGraphError),
    #[error("head: {0}")]
    Head(#[from] HeadPartError),
    #[error("matrix list: {0}")]
    Matrices(String),
    #[error("fused source: {0}")]
    Source(String),
}

/// One launch of the step, planned and checked, with everything its binding needs.
#[derive(Clone, Debug)]
pub struct LayerPlan {
    pub at: LaunchAt,
    pub kind: LaunchKind,
    /// Rows of the step.
    pub rows: u32,
    pub slices: StepSlices,
    pub launch: PlannedLaunch,
    /// Layer 0's embedding (into `hidden[0]`).
    pub embed: Option<EmbedPlan>,
    pub attention: Option<HalfPlan>,
    /// A full-indexer layer's projections and front half.
    pub index: Option<IndexPart>,
    pub moe: Option<MoePart>,
    pub dense: Option<DensePlan>,
    pub tail: Option<TailPlan>,
    /// Lengths of the head stage's descriptor lists.
    pub head_lists: HeadLists,
    /// The launch's matrix list, by index (`lin_args.mats[i]` is `matrices[i]`).
    pub matrices: Vec<LayerMatrix>,
    /// The expert banks, by bank (`lin_args.experts[b]` is `banks[b]`); empty but on MoE layers.
    pub banks: Vec<ExpertBank>,
    pub vectors: Vec<LayerVector>,
    /// The stages, in the order of the fused kernel's arguments after `mbx_launch`.
    pub stages: Vec<Stage>,
    /// What the launch hands on: the layer's output rows (in `hidden[(i + 1) % 2]`), or the
    /// tail's token ids.
    pub out: Handoff,
}
