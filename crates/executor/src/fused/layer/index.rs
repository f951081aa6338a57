//! A full-indexer layer's indexer inside its launch: the three projections the indexer's tasks
//! read, as linear tasks (spec §3.1; `indexer::reference::key` and `query`), then the front half
//! ([`FrontPart`]) with its key and query tasks waiting on them:
//!
//! - `wk`: key_proj `[rows][index_head_dim]` bf16 = W_k x̂, x̂ the attention's normed input rows;
//! - `weights_proj`: gates `[rows][index_n_heads]` f32 = W_w x̂ (the linear's f32 output; the
//!   constant (H_I · d_I)^-1/2 is the indexer's `weight_scale`, applied by the query task);
//! - `wq_b`: query_proj `[rows][index_n_heads * index_head_dim]` bf16 = W_qb c^Q, c^Q the
//!   attention's q latent (q_a's output) normalised by the tile as it stages it, as q_b does: a
//!   norm task between q_a and wq_b was a link of about 7 us on the index chain.
//!
//! The reference rounds the gates to bf16 (`IndexerOptions::bf16_projections`); the linear's
//! f32 output keeps them unrounded, a difference of at most 2^-9 relative in each head weight.

use super::super::attention::{whole, HalfPlan, PackedAt};
use super::super::front::{FrontBuild, FrontPart, FrontRequest};
use super::super::graph::{ArenaSlice, Completion, LaunchGraph};
use super::super::head::matrix_tasks_on;
use super::LayerError;
use indexer::layout::ProjectionWaits;
use linear::gpu::{LinMatrix, FLAG_FP8, FLAG_OUT_F32};
use mailbox::layout::BoxRange;
use model::weights::packed::TILE_ROWS;
use model::ModelConfig;

/// The indexer's widths in a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexDims {
    pub rows: u32,
    pub heads: u32,
    pub head_dim: u32,
    pub hidden: u32,
    pub q_lora: u32,
}

/// The projections, planned: their matrices, outputs and completion boxes.
#[derive(Clone, Copy, Debug)]
pub struct IndexProjections {
    pub dims: IndexDims,
    /// Indices in the launch's matrix list.
    pub wq_b: u32,
    pub wk: u32,
    pub weights_proj: u32,
    /// The inputs: the attention's normed rows (x̂) and q_a's output rows, arena offsets.
    pub hidden_normed: u64,
    pub q_a: u64,
    /// The q latent norm's eps (wq_b normalises q_a's output with it).
    pub q_norm_eps: f32,
    pub key_proj: ArenaSlice,
    pub query_proj: ArenaSlice,
    pub gates: ArenaSlice,
    pub key_done: Completion,
    pub query_done: Completion,
    pub gates_done: Completion,
}

/// The indexer of a full layer in its launch: the projections and the front half.
#[derive(Clone, Debug)]
pub struct IndexPart {
    pub projections: IndexProjections,
    pub front: FrontPart,
    /// `[rows][front.plan.stride]` f32: the scores select reads (`idx_args::scores`).
    pub scores: ArenaSlice,
    /// `[rows][select::gpu::FLAG_NAMES.len()]` u32: select's flags.
    pub select_flags: ArenaSlice,
}

/// The device addresses of the projections' packed weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexWeights {
    pub wq_b: PackedAt,
    pub wk: PackedAt,
    pub weights_proj: PackedAt,
    /// The attention's q latent norm weight (bf16 `[q_lora]`).
    pub q_a_norm: u64,
}

fn tiles(n: u32) -> u32 {
    n.div_ceil(TILE_ROWS as u32)
}

/// Plans the projections after the attention's latents (`half`'s input norm and q_a boxes).
pub fn index_projections(
    g: &mut LaunchGraph,
    cfg: &ModelConfig,
    half: &HalfPlan,
) -> Result<IndexProjections, LayerError> {
    let dims = IndexDims {
        rows: half.rows,
        heads: cfg.index_n_heads as u32,
        head_dim: cfg.index_head_dim as u32,
        hidden: cfg.hidden_size as u32,
        q_lora: cfg.q_lora_rank as u32,
    };
    let rows = u64::from(dims.rows);
    let key_proj = g.arena("index_key_proj", rows * u64::from(dims.head_dim) * 2)?;
    let query_proj = g.arena(
        "index_query_proj",
        rows * u64::from(dims.heads * dims.head_dim) * 2,
    )?;
    let gates = g.arena("index_gates", rows * u64::from(dims.heads) * 4)?;
    let one = |r: &mailbox::layout::Region<u32>| r.slot(0).expect("one box");
    let after_norm = [one(&half.boxes.norm_hidden)];
    let after_q_a = [whole(&half.boxes.q_a)];
    let (wk, weights_proj, wq_b) = (g.matrix(), g.matrix(), g.matrix());
    // The three go to the CTAs that ran one of q_a and kv_a (the others also ran the other, or
    // a norm): wk and the gates first, a task a CTA, then wq_b, which heads the indexer's chain
    // (the query task waits on all of it), split over as many of the rest as there are.
    let key_tiles = tiles(dims.head_dim);
    let gate_tiles = tiles(dims.heads);
    let first = g.by_load();
    let (key_ctas, rest) = first.split_at((key_tiles as usize).clamp(1, first.len()));
    let rest = if rest.is_empty() { &first[..] } else { rest };
    let key_done = matrix_tasks_on(g, "index_wk_done", wk, key_tiles, &after_norm, key_ctas)?;
    let gates_done = matrix_tasks_on(
        g,
        "index_weights_proj_done",
        weights_proj,
        gate_tiles,
        &after_norm,
        rest,
    )?;
    let least = g.least_loaded();
    let wq_b_ctas = if 2 * least.len() as u32 >= g.ctas() {
        least
    } else {
        g.by_load()
    };
    let query_done = matrix_tasks_on(
        g,
        "index_wq_b_done",
        wq_b,
        tiles(dims.heads * dims.head_dim),
        &after_q_a,
        &wq_b_ctas,
    )?;
    Ok(IndexProjections {
        dims,
        wq_b,
        wk,
        weights_proj,
        hidden_normed: half.arena.hidden_normed,
        q_a: half.arena.q_a,
        q_norm_eps: half.dims.latent_eps as f32,
        key_proj,
        query_proj,
        gates,
        key_done,
        query_done,
        gates_done,
    })
}

impl IndexProjections {
    /// What the key and query tasks wait on.
    pub fn waits(&self) -> ProjectionWaits {
        ProjectionWaits {
            key: vec![self.key_done.all()],
            query: vec![self.query_done.all(), self.gates_done.all()],
        }
    }

    /// The front half after the projections, its key and query tasks waiting on them, row 0's
    /// key task on CTA `key_cta` and the rest of the rows' key and query tasks on the CTAs after
    /// it ([`FrontPart::plan_waiting`]).
    pub fn front(
        self,
        g: &mut LaunchGraph,
        cfg: &ModelConfig,
        requests: &[FrontRequest],
        build: FrontBuild,
        key_cta: Option<u32>,
    ) -> Result<IndexPart, LayerError> {
        let front = FrontPart::plan_waiting(g, cfg, requests, build, &self.waits(), key_cta)?;
        let rows = u64::from(self.dims.rows);
        let scores = g.arena("index_scores", rows * u64::from(front.plan.stride) * 4)?;
        let select_flags = g.arena(
            "select_flags",
            rows * select::gpu::FLAG_NAMES.len() as u64 * 4,
        )?;
        Ok(IndexPart {
            projections: self,
            front,
            scores,
            select_flags,
        })
    }

    /// The projections' entries of the matrix list (index, descriptor), activations at `arena`.
    pub fn matrices(
        &self,
        arena: u64,
        w: &IndexWeights,
    ) -> Result<[(u32, LinMatrix); 3], LayerError> {
        let d = &self.dims;
        let m = |p: &PackedAt, x: u64, k: u32, y: u64, n: u32, out_f32: bool| LinMatrix {
            w: p.w,
            scales: p.scales,
            x: arena + x,
            y: arena + y,
            residual: 0,
            row_scale: 0,
            k,
            n,
            tiles: tiles(n),
            rows: d.rows,
            x_stride: k,
            y_stride: n,
            flags: if p.fp8 { FLAG_FP8 } else { 0 } | if out_f32 { FLAG_OUT_F32 } else { 0 },
            ..LinMatrix::default()
        };
        let heads = d.heads * d.head_dim;
        let wq_b = m(
            &w.wq_b,
            self.q_a,
            d.q_lora,
            self.query_proj.offset,
            heads,
            false,
        )
        .with_rmsnorm(w.q_a_norm, d.q_lora, 0, self.q_norm_eps)
        .map_err(|e| LayerError::Matrices(format!("wq_b: {e}")))?;
        Ok([
            (
                self.wk,
                m(
                    &w.wk,
                    self.hidden_normed,
                    d.hidden,
                    self.key_proj.offset,
                    d.head_dim,
                    false,
                ),
            ),
            (
                self.weights_proj,
                m(
                    &w.weights_proj,
                    self.hidden_normed,
                    d.hidden,
                    self.gates.offset,
                    d.heads,
                    true,
                ),
            ),
            (self.wq_b, wq_b),
        ])
    }
}

impl IndexPart {
    /// Row `row`'s list box (select's), what the attention's Slots task of the row waits on.
    pub fn list_ready(&self, row: u32) -> Option<BoxRange> {
        self.front.list_ready(row)
    }
}
