//! The attention half of a layer as fused-launch tasks (spec §2.1-2.8), from the layer's input
//! rows to x + o_proj(attention): q_a and kv_a (linear tasks normalising their x, the input rows,
//! by the input RMSNorm as they stage it: `FLAG_RMSNORM`), q_b (normalising q_a's output by the q
//! latent's RMSNorm the same way), the rope of the queries' rope parts, the absorption of q_nope through W_UK (a
//! linear task a head), the KV latent's RMSNorm with the rope of its key, the cache write, the
//! sparse attention over each row's selected slots (splits and combines), W_UV (a linear task a
//! head) and o_proj with the residual. Every task waits on the completion boxes of its inputs and
//! publishes its own; linear tasks load their first weights before they wait.
//!
//! W_UK\[h\] is `[nope, latent]`; its absorption `q_abs = W_UK[h]ᵀ q_nope` is a linear of
//! K = nope (192 at GLM-5 width, 48 in the tiny preset), which the linear tile takes in whole
//! 128-element blocks. It runs as the linear of W_UK\[h\]ᵀ padded with zero columns to
//! [`HalfDims::uk_k`] over the head's q_b output, its x rows the head's nope part only: the tile
//! stages zeros past them (`LinMatrix::with_short_rows`), so the padding's products are zeros
//! whatever follows (the head's rope part, the next head, or past the last row bytes of other
//! launches). At GLM-5 TP8 that streams 2 MB of bf16 W_UK instead of 1.5 MB.
//!
//! The two norms stay out of the dependent chain: a linear task computes its rows' inverse RMS
//! itself (the bits the norm task would write), so q_a and kv_a wait on the input rows and q_b on
//! q_a, not on a one-CTA norm task between them. The input norm task is planned only for a
//! launch whose indexer reads the normed input rows ([`HalfPlan::begin`]'s `keep_norms`; its
//! wq_b norms q_a's output itself, as q_b does), and nothing of the half's own chain waits on it.
//!
//! The global order: the input norm, q_a, kv_a, the KV norm ([`HalfPlan::begin`]),
//! q_b, the q rope, W_UK ([`HalfPhases::queries`]), the attention's cache writes, splits and
//! combines, W_UV, o_proj ([`HalfPhases::attend`]); every task on the CTA after the one before
//! (round robin), so that every matrix streams on as many CTAs as it has tasks, but for the links
//! that follow an uneven one: q_a and kv_a hold more tiles than the grid has CTAs (GLM-5 TP8:
//! 128 + 36 on 132), so q_b goes to the CTAs that ran one of them, and W_UK a task a CTA to half
//! of the CTAs with the fewest tasks; the cache writes, splits and combines each to the CTA with
//! the fewest tasks so far, so that the splits gather their records beside W_UK rather than after
//! it, a split to a CTA that holds the fewest of them (all on distinct CTAs where the grid has
//! room: tasks counted are not time, and where every CTA is done with its earlier tasks before
//! the splits' inputs arrive, a CTA with fewer of them would take a second split and run it a
//! whole split after the others); the norms, each waiting on a whole matrix, go behind its last
//! task, and the q rope to the CTA with the fewest tasks after q_b (it waits on q_b alone). A
//! layer launch puts the indexer's projections after the first phase and the front half after
//! the second, on CTAs the second leaves free ([`HalfPhases::queries_sparing`]).
//!
//! The slot lists: a half alone, or a layer that reuses an earlier layer's lists, publishes them
//! with one Slots task ahead of the input norm (they are in memory before the launch); a layer
//! whose select runs in the same launch publishes each row's with a Slots task of its own in the
//! last phase, waiting on select's list box of the row (`FrontPart::list_ready`).

use super::{fused_source, ArenaSlice, CtaShape, GraphError, Handoff, LaunchGraph};
use device::KernelSource;
use linear::gpu::{LinMatrix, FLAG_FP8, FLAG_RESIDUAL};
use linear::layout::{split_tiles, KIND_TILES};
use mailbox::gpu::Variant;
use mailbox::layout::{BoxRange, LayoutBuilder, Region, BOXES_PER_LINE};
use mailbox::{Stage, StageKernel, Task};
use mla::gpu::{MlaArgs, MlaHalfArgs};
use mla::layout::{
    AttendPlan, AttendShape, AttendWaits, MlaBoxes, MlaKind, NormOf, RequestRows, SplitChoice,
};
use mla::CacheLayout;
use model::numerics::RopeStyle;
use model::weights::packed::TILE_ROWS;
use model::{CacheFormat, ModelConfig, RankShapes, WEIGHT_BLOCK};

/// Bad input, found before anything runs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HalfError {
    #[error("model: {0}")]
    Model(String),
    #[error("MLA: {0}")]
    Mla(String),
    #[error("launch graph: {0}")]
    Graph(String),
    #[error("the input rows' slice holds {have} bytes; the half reads {need}")]
    Input { have: u64, need: u64 },
    #[error("{0}")]
    Shape(String),
    #[error("a step needs 1 to {max} rows; this one has {rows}")]
    Rows { rows: u32, max: u32 },
    #[error("request {request}: {selected} selected slots a row, but its last row, at position {position}, has at most {max}")]
    Selected {
        request: usize,
        selected: u32,
        position: u32,
        max: u32,
    },
}

/// The widths of one rank's attention half (spec §1.5 at TP `tp`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HalfDims {
    pub hidden: usize,
    pub q_lora: usize,
    /// Heads of the rank.
    pub heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    pub latent: usize,
    pub cache: CacheFormat,
    pub rope_theta: f64,
    pub rope_style: RopeStyle,
    /// eps of the input norm (rms_norm_eps).
    pub hidden_eps: f64,
    /// eps of the latent norms (the engines' rms_norm_eps; spec §2.12).
    pub latent_eps: f64,
}

impl HalfDims {
    pub fn new(cfg: &ModelConfig, tp: usize, cache: CacheFormat) -> Result<Self, HalfError> {
        let rank = RankShapes::new(cfg, tp).map_err(|e| HalfError::Model(e.to_string()))?;
        Ok(HalfDims {
            hidden: cfg.hidden_size,
            q_lora: cfg.q_lora_rank,
            heads: rank.heads,
            nope: cfg.qk_nope_head_dim,
            rope: cfg.qk_rope_head_dim,
            v: cfg.v_head_dim,
            latent: cfg.kv_lora_rank,
            cache,
            rope_theta: cfg.rope_theta,
            rope_style: RopeStyle::from_interleave(cfg.rope_interleave),
            hidden_eps: cfg.rms_norm_eps,
            latent_eps: cfg.rms_norm_eps,
        })
    }

    pub fn qk(&self) -> usize {
        self.nope + self.rope
    }

    /// K of the W_UK linear: nope padded to whole 128-element blocks.
    pub fn uk_k(&self) -> usize {
        self.nope.next_multiple_of(WEIGHT_BLOCK)
    }

    /// The cache's record layout.
    pub fn cache_layout(&self) -> Result<CacheLayout, HalfError> {
        let cfg = ModelConfig {
            kv_lora_rank: self.latent,
            qk_rope_head_dim: self.rope,
            ..ModelConfig::preset("glm-5").map_err(|e| HalfError::Model(e.to_string()))?
        };
        CacheLayout::new(&cfg, self.cache).map_err(|e| HalfError::Mla(e.to_string()))
    }

    /// The attention tasks' shape (`union`: most distinct slots a split holds).
    pub fn attend_shape(&self, union: usize) -> Result<AttendShape, HalfError> {
        AttendShape::new(self.cache_layout()?, self.heads, union)
            .map_err(|e| HalfError::Mla(e.to_string()))
    }
}

/// The matrices of the half, in the launch's matrix list from [`HalfPlan::first_matrix`]: q_a,
/// kv_a, q_b, W_UK of each head, W_UV of each head, o_proj.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfMatrix {
    QA,
    KvA,
    QB,
    Uk(usize),
    Uv(usize),
    OProj,
}

impl HalfMatrix {
    /// Index among the half's matrices.
    pub fn index(self, heads: usize) -> usize {
        match self {
            HalfMatrix::QA => 0,
            HalfMatrix::KvA => 1,
            HalfMatrix::QB => 2,
            HalfMatrix::Uk(h) => 3 + h,
            HalfMatrix::Uv(h) => 3 + heads + h,
            HalfMatrix::OProj => 3 + 2 * heads,
        }
    }

    /// Every matrix of a half of `heads`, in index order.
    pub fn all(heads: usize) -> Vec<HalfMatrix> {
        let mut v = vec![HalfMatrix::QA, HalfMatrix::KvA, HalfMatrix::QB];
        v.extend((0..heads).map(HalfMatrix::Uk));
        v.extend((0..heads).map(HalfMatrix::Uv));
        v.push(HalfMatrix::OProj);
        v
    }

    /// (n, k) of the matrix as the linear runs it.
    pub fn shape(self, d: &HalfDims) -> (usize, usize) {
        match self {
            HalfMatrix::QA => (d.q_lora, d.hidden),
            HalfMatrix::KvA => (d.latent + d.rope, d.hidden),
            HalfMatrix::QB => (d.heads * d.qk(), d.q_lora),
            HalfMatrix::Uk(_) => (d.latent, d.uk_k()),
            HalfMatrix::Uv(_) => (d.v, d.latent),
            HalfMatrix::OProj => (d.hidden, d.heads * d.v),
        }
    }

    pub fn tiles(self, d: &HalfDims) -> u32 {
        self.shape(d).0.div_ceil(TILE_ROWS) as u32
    }
}

/// The half's slices of the launch's activation arena (byte offsets from its start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HalfArena {
    /// The layer's input rows `[rows][hidden]` bf16 (the input hand-off's slice).
    pub hidden: u64,
    /// Step inputs the host writes before the launch ([`HalfInputs`]): `[rows]` u32 positions,
    /// `[rows]` u32 cache slots of the new tokens, `[rope / 2]` f64 rope frequencies,
    /// `[rows][topk]` i32 slot lists.
    pub positions: u64,
    pub new_slots: u64,
    pub inv_freq: u64,
    pub slot_lists: u64,
    /// Made by the launch.
    pub hidden_normed: u64,
    pub q_a: u64,
    pub kv_a: u64,
    /// `[rows][heads][qk]`, then zeros the last head's padded W_UK reads.
    pub q: u64,
    pub q_pe: u64,
    pub q_abs: u64,
    pub new_latent: u64,
    pub new_rope: u64,
    /// `[rows][heads][latent]` bf16: the attention in latent space.
    pub attn: u64,
    pub part_o: u64,
    pub part_ml: u64,
    /// `[rows][heads][v]` bf16: W_UV's outputs, o_proj's x.
    pub o_heads: u64,
    /// `[rows][hidden]` bf16: x + o_proj(...), the half's output.
    pub out: u64,
}

impl HalfArena {
    #[allow(clippy::too_many_arguments)]
    fn new(
        g: &mut LaunchGraph,
        prefix: &str,
        d: &HalfDims,
        rows: u64,
        topk: u64,
        plan: &AttendPlan,
        hidden: u64,
        inputs: Option<HalfInputs>,
    ) -> Result<Self, GraphError> {
        let parts = plan.partial_queries().max(1) as u64;
        let (heads, latent, rope) = (d.heads as u64, d.latent as u64, d.rope as u64);
        let mut take = |name: &str, bytes: u64| -> Result<u64, GraphError> {
            Ok(g.arena(&format!("{prefix}_{name}"), bytes)?.offset)
        };
        let inputs = match inputs {
            Some(i) => i,
            None => HalfInputs {
                positions: take("positions", rows * 4)?,
                new_slots: take("new_slots", rows * 4)?,
                inv_freq: take("inv_freq", rope / 2 * 8)?,
                slot_lists: take("slot_lists", rows * topk * 4)?,
            },
        };
        Ok(HalfArena {
            hidden,
            positions: inputs.positions,
            new_slots: inputs.new_slots,
            inv_freq: inputs.inv_freq,
            slot_lists: inputs.slot_lists,
            hidden_normed: take("hidden_normed", rows * d.hidden as u64 * 2)?,
            q_a: take("q_a", rows * d.q_lora as u64 * 2)?,
            kv_a: take("kv_a", rows * (latent + rope) * 2)?,
            q: take("q", rows * heads * d.qk() as u64 * 2)?,
            q_pe: take("q_pe", rows * heads * rope * 2)?,
            q_abs: take("q_abs", rows * heads * latent * 2)?,
            new_latent: take("new_latent", rows * latent * 2)?,
            new_rope: take("new_rope", rows * rope * 2)?,
            attn: take("attn", rows * heads * latent * 2)?,
            part_o: take("part_o", parts * latent * 4)?,
            part_ml: take("part_ml", parts * 2 * 4)?,
            o_heads: take("o_heads", rows * heads * d.v as u64 * 2)?,
            out: take("out", rows * d.hidden as u64 * 2)?,
        })
    }
}

/// One request of a step: tokens already cached, its rows this step (at the positions after
/// them), and how many slots each row's list selects at most (the rest -1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HalfRequest {
    pub context: u32,
    pub rows: u32,
    pub selected: u32,
}

/// How the half's attention is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HalfBuild {
    /// Entries of each row's slot list (k).
    pub topk: u32,
    pub union: usize,
    pub choice: SplitChoice,
}

/// The boxes of the half. `norm_hidden` is written only by the norm task a launch with the
/// indexer plans (`keep_norms`).
#[derive(Clone, Copy, Debug)]
pub struct HalfBoxes {
    pub norm_hidden: Region<u32>,
    pub q_a: Region<u32>,
    pub kv_a: Region<u32>,
    pub norm_kv: Region<u32>,
    pub q_b: Region<u32>,
    pub rope_q: Region<u32>,
    pub uk: Region<u32>,
    pub attend: MlaBoxes,
    pub uv: Region<u32>,
    /// o_proj's lines: the half's output rows are written when every box of these is.
    pub o_proj: Region<u32>,
}

/// The attention half of one step as a part of a launch: its tasks in the graph's global order,
/// its boxes, arena slices and matrices.
#[derive(Clone, Debug)]
pub struct HalfPlan {
    pub dims: HalfDims,
    pub shape: AttendShape,
    pub attend: AttendPlan,
    pub rows: u32,
    pub topk: u32,
    /// Each row's position.
    pub positions: Vec<u32>,
    pub boxes: HalfBoxes,
    pub arena: HalfArena,
    /// Index of the half's first matrix in the launch's matrix list (the rest follow).
    pub first_matrix: u32,
    /// The half's output rows (x + o_proj(attention)) and the boxes they are complete after.
    pub out: Handoff,
}

fn lines(b: &mut LayoutBuilder, name: &str, n: u32) -> Result<Region<u32>, HalfError> {
    b.region(name, n.max(1), BOXES_PER_LINE)
        .map_err(|e| HalfError::Graph(e.to_string()))
}

/// Every box of region `r`.
pub(crate) fn whole(r: &Region<u32>) -> BoxRange {
    BoxRange::new(r.offset(), r.slots() * r.stride())
}

fn first_box(r: &Region<u32>) -> BoxRange {
    r.slot(0).expect("a region of one slot at least")
}

/// Where the half's step inputs (positions, new slots, rope frequencies, slot lists) live: slices
/// of a step-wide arena that a layer launch shares with the step's other launches
/// (`fused::layer::StepSlices`), or, for a half planned alone, slices of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HalfInputs {
    pub positions: u64,
    pub new_slots: u64,
    pub inv_freq: u64,
    pub slot_lists: u64,
}

/// A half between its phases ([`HalfPlan::begin`], [`HalfPhases::queries`],
/// [`HalfPhases::attend`]): a layer launch puts the front half's tasks between its queries and
/// its attention, and the indexer's projections after its latents.
#[derive(Clone, Debug)]
pub struct HalfPhases {
    plan: HalfPlan,
    splits: Vec<Vec<linear::layout::TileRange>>,
    /// Slot lists published in the launch (by select): one Slots task a row waits on its row's
    /// list box. Otherwise one Slots task, first, publishes lists written before the launch.
    lists_in_launch: bool,
    /// The input norm task is planned (its output read by the indexer).
    keep_norms: bool,
    hidden_in: Vec<BoxRange>,
}

impl HalfPlan {
    /// Adds the half of a step of `requests` to `g` (boxes, slices and matrices named `prefix`),
    /// after the producer of `hidden`, the layer's input rows. The rows' slot lists are read from
    /// the arena (written before the launch, or kept from an earlier launch's select) and
    /// published inside the launch by one task.
    pub fn plan(
        g: &mut LaunchGraph,
        dims: HalfDims,
        requests: &[HalfRequest],
        build: HalfBuild,
        hidden: Handoff,
        prefix: &str,
    ) -> Result<HalfPlan, HalfError> {
        let mut phases =
            HalfPlan::begin(g, dims, requests, build, hidden, prefix, None, false, false)?;
        phases.queries(g)?;
        phases.attend(g, &[])
    }

    /// The half's first phase: its arena slices (the step inputs at `inputs`, or its own), boxes
    /// and matrices, a Slots task first unless `lists_in_launch`, then the input norm (when
    /// `keep_norms`), q_a, kv_a, the KV latent's norm. `keep_norms`: another part of the launch
    /// (the indexer's projections) reads the normed input rows; the half's own matrices norm
    /// their x themselves.
    #[allow(clippy::too_many_arguments)]
    pub fn begin(
        g: &mut LaunchGraph,
        dims: HalfDims,
        requests: &[HalfRequest],
        build: HalfBuild,
        hidden: Handoff,
        prefix: &str,
        inputs: Option<HalfInputs>,
        lists_in_launch: bool,
        keep_norms: bool,
    ) -> Result<HalfPhases, HalfError> {
        let rows: u32 = requests.iter().map(|r| r.rows).sum();
        let max = linear::layout::MAX_ROWS as u32;
        if rows == 0 || rows > max {
            return Err(HalfError::Rows { rows, max });
        }
        let mut positions = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            // A row lists positions up to its own at most; the request's last row is at
            // context + rows - 1.
            if r.rows > 0 && r.selected > r.context + r.rows {
                return Err(HalfError::Selected {
                    request: i,
                    selected: r.selected,
                    position: r.context + r.rows - 1,
                    max: r.context + r.rows,
                });
            }
            positions.extend((0..r.rows).map(|i| r.context + i));
        }
        let need = rows as u64 * dims.hidden as u64 * 2;
        if hidden.data.bytes < need {
            return Err(HalfError::Input {
                have: hidden.data.bytes,
                need,
            });
        }
        let shape = dims.attend_shape(build.union)?;
        let attend_rows: Vec<RequestRows> = requests
            .iter()
            .filter(|r| r.rows > 0)
            .map(|r| RequestRows {
                rows: r.rows,
                selected: r.selected,
            })
            .collect();
        let mla = |e: mla::MlaError| HalfError::Mla(e.to_string());
        let graph = |e: GraphError| HalfError::Graph(e.to_string());
        let attend =
            AttendPlan::new(&shape, build.topk, &attend_rows, build.choice).map_err(mla)?;
        let arena = HalfArena::new(
            g,
            prefix,
            &dims,
            u64::from(rows),
            u64::from(build.topk),
            &attend,
            hidden.data.offset,
            inputs,
        )
        .map_err(graph)?;

        let name = |n: &str| format!("{prefix}_{n}");
        let mats = HalfMatrix::all(dims.heads);
        let ctas = g.ctas();
        let splits: Vec<Vec<linear::layout::TileRange>> = mats
            .iter()
            .map(|m| {
                // A head's matrices over a share of the grid each, rounded down so that every
                // head's tasks together fit on the grid once (GLM-5 TP8: 8 heads x 16 tasks on
                // 132 CTAs): W_UK and W_UV each wait on a whole link, so a CTA with two of their
                // tasks would end the link a task late. W_UK's tasks are small (a head's 256 KB
                // in 16 KB pieces at GLM-5 TP8), so it takes half of that share and leaves the
                // other CTAs to the attention's splits: a split gathers its slots' records before
                // it waits on the queries, which it can do only on a CTA that is not running W_UK.
                let parts = match m {
                    HalfMatrix::Uk(_) => (ctas / dims.heads as u32 / 2).max(1),
                    HalfMatrix::Uv(_) => (ctas / dims.heads as u32).max(1),
                    _ => ctas,
                };
                split_tiles(m.tiles(&dims), parts)
            })
            .collect();
        let count = |pick: &dyn Fn(&HalfMatrix) -> bool| -> u32 {
            mats.iter()
                .zip(&splits)
                .filter(|(m, _)| pick(m))
                .map(|(_, s)| s.len() as u32)
                .sum()
        };
        let first_matrix = g.matrix();
        for _ in 1..mats.len() {
            g.matrix();
        }
        let b = g.regions();
        let one = |b: &mut LayoutBuilder, n: &str| {
            b.region::<u32>(&name(n), 1, 1)
                .map_err(|e| HalfError::Graph(e.to_string()))
        };
        let boxes = HalfBoxes {
            norm_hidden: one(b, "norm_hidden")?,
            q_a: lines(b, &name("q_a"), count(&|m| *m == HalfMatrix::QA))?,
            kv_a: lines(b, &name("kv_a"), count(&|m| *m == HalfMatrix::KvA))?,
            norm_kv: one(b, "norm_kv")?,
            q_b: lines(b, &name("q_b"), count(&|m| *m == HalfMatrix::QB))?,
            rope_q: one(b, "rope_q")?,
            uk: lines(b, &name("uk"), count(&|m| matches!(m, HalfMatrix::Uk(_))))?,
            attend: MlaBoxes::add(b, &name("mla"), &attend).map_err(mla)?,
            uv: lines(b, &name("uv"), count(&|m| matches!(m, HalfMatrix::Uv(_))))?,
            o_proj: lines(b, &name("o_proj"), count(&|m| *m == HalfMatrix::OProj))?,
        };
        let mut phases = HalfPhases {
            plan: HalfPlan {
                dims,
                shape,
                attend,
                rows,
                topk: build.topk,
                positions,
                boxes,
                arena,
                first_matrix,
                out: Handoff::default(),
            },
            splits,
            lists_in_launch,
            keep_norms,
            hidden_in: hidden.waits(),
        };
        phases.latents(g)?;
        Ok(phases)
    }
}

/// Adds a task at the next rank on the next CTA; returns the CTA.
fn push(
    g: &mut LaunchGraph,
    kind: u32,
    out: BoxRange,
    inputs: &[BoxRange],
    args: [u32; 3],
) -> Result<u32, HalfError> {
    let cta = g.next_cta();
    push_on(g, cta, kind, out, inputs, args)?;
    Ok(cta)
}

/// Adds a task at the next rank on CTA `cta`.
fn push_on(
    g: &mut LaunchGraph,
    cta: u32,
    kind: u32,
    out: BoxRange,
    inputs: &[BoxRange],
    args: [u32; 3],
) -> Result<(), HalfError> {
    let rank = g.rank();
    let t =
        Task::new(kind, rank, out, inputs, args).map_err(|e| HalfError::Graph(e.to_string()))?;
    g.push(cta, t).map_err(|e| HalfError::Graph(e.to_string()))
}

impl HalfPhases {
    /// The half so far: its boxes, slices and matrices are all there; its output is set by
    /// [`Self::attend`].
    pub fn plan(&self) -> &HalfPlan {
        &self.plan
    }

    /// The linear tasks of one matrix, each writing its own line of `region` from `*line` on, on
    /// the CTAs in turn; returns the CTA of the last.
    fn linear_tasks(
        &self,
        g: &mut LaunchGraph,
        m: HalfMatrix,
        region: &Region<u32>,
        line: &mut u32,
        inputs: &[BoxRange],
    ) -> Result<u32, HalfError> {
        let ranges = &self.splits[m.index(self.plan.dims.heads)];
        let ctas: Vec<u32> = ranges.iter().map(|_| g.next_cta()).collect();
        self.linear_tasks_on(g, m, ranges, &ctas, region, line, inputs)?;
        Ok(ctas.last().copied().unwrap_or(0))
    }

    /// The tasks of matrix `m`'s tile `ranges`, range i on `ctas[i]`, each writing its own line of
    /// `region` from `*line` on.
    #[allow(clippy::too_many_arguments)]
    fn linear_tasks_on(
        &self,
        g: &mut LaunchGraph,
        m: HalfMatrix,
        ranges: &[linear::layout::TileRange],
        ctas: &[u32],
        region: &Region<u32>,
        line: &mut u32,
        inputs: &[BoxRange],
    ) -> Result<(), HalfError> {
        let matrix = self.plan.first_matrix + m.index(self.plan.dims.heads) as u32;
        for (r, &cta) in ranges.iter().zip(ctas) {
            let out = region.slot(*line).expect("a line a task");
            *line += 1;
            push_on(g, cta, KIND_TILES, out, inputs, [matrix, r.first, r.count])?;
        }
        Ok(())
    }

    /// The Slots task of rows `first..first + n`, waiting on `waits`.
    fn slots_task(
        &self,
        g: &mut LaunchGraph,
        first: u32,
        n: u32,
        waits: &[BoxRange],
    ) -> Result<(), HalfError> {
        let slots = &self.plan.boxes.attend.slots;
        let out = BoxRange::new(
            slots.slot(first).expect("a slot a row").first,
            (n - 1) * slots.stride() + self.plan.topk,
        );
        push(g, MlaKind::Slots.kind(), out, waits, [first, n, 0]).map(|_| ())
    }

    /// The first phase's tasks: the slot lists from memory (unless select publishes them in the
    /// launch), the input norm (for the indexer), q_a and kv_a (on the input rows, normed as they
    /// are staged), the KV norm. q_a and kv_a take the CTAs in turn,
    /// so where they hold more tiles than the grid has CTAs, the CTAs from the first of q_a's on
    /// run two of them; each norm waits on a whole matrix, so it goes behind the last task of that
    /// matrix rather than onto a CTA that would otherwise be done first.
    fn latents(&mut self, g: &mut LaunchGraph) -> Result<(), HalfError> {
        let rows = self.plan.rows;
        let boxes = self.plan.boxes;
        let norm = |which: NormOf| [0, rows, which as u32];
        if !self.lists_in_launch {
            self.slots_task(g, 0, rows, &[])?;
        }
        if self.keep_norms {
            push(
                g,
                MlaKind::Norm.kind(),
                first_box(&boxes.norm_hidden),
                &self.hidden_in,
                norm(NormOf::Hidden),
            )?;
        }
        let hidden_in = self.hidden_in.clone();
        self.linear_tasks(g, HalfMatrix::QA, &boxes.q_a, &mut 0, &hidden_in)?;
        let last_kv_a = self.linear_tasks(g, HalfMatrix::KvA, &boxes.kv_a, &mut 0, &hidden_in)?;
        push_on(
            g,
            last_kv_a,
            MlaKind::Norm.kind(),
            first_box(&boxes.norm_kv),
            &[whole(&boxes.kv_a)],
            norm(NormOf::KvLatent),
        )?;
        Ok(())
    }

    /// The second phase: q_b (on q_a's output, normed as it is staged), the q rope, W_UK of
    /// every head. q_b goes to the CTAs with the fewest tasks so far, split into as many tasks as
    /// there are of them (when they are at least half the grid): a CTA that runs q_a and kv_a
    /// would start its q_b a whole task late, and W_UK and the attention wait on all of q_b. The
    /// rope and then W_UK, a task a CTA, go onto the CTAs with the fewest tasks.
    pub fn queries(&mut self, g: &mut LaunchGraph) -> Result<(), HalfError> {
        self.queries_sparing(g, &[])
    }

    /// [`Self::queries`] with none of the tasks on the CTAs `spare` (kept for a later part's
    /// tasks that should start as soon as their inputs are ready: a full-indexer layer's index
    /// key and query tasks).
    pub fn queries_sparing(&mut self, g: &mut LaunchGraph, spare: &[u32]) -> Result<(), HalfError> {
        let rows = self.plan.rows;
        let boxes = self.plan.boxes;
        let tiles = HalfMatrix::QB.tiles(&self.plan.dims);
        let open = |ctas: Vec<u32>| -> Vec<u32> {
            ctas.into_iter().filter(|c| !spare.contains(c)).collect()
        };
        let least = open(g.least_loaded());
        let ctas = if 2 * least.len() as u32 >= g.ctas() {
            least
        } else {
            open(g.by_load())
        };
        if ctas.is_empty() {
            return Err(HalfError::Shape(format!(
                "no CTA of {} is left beside the {} spared",
                g.ctas(),
                spare.len()
            )));
        }
        let ranges = split_tiles(tiles, ctas.len() as u32);
        let mut line = 0;
        let q_a = [whole(&boxes.q_a)];
        self.linear_tasks_on(
            g,
            HalfMatrix::QB,
            &ranges,
            &ctas,
            &boxes.q_b,
            &mut line,
            &q_a,
        )?;
        // The region holds a line for a task on every CTA; the tasks write the first `line`.
        let q_b = BoxRange::new(boxes.q_b.offset(), line * boxes.q_b.stride());
        // The rope waits on q_b alone (the splits wait on the new latents themselves), so it goes
        // to the CTA with the fewest tasks rather than behind the KV norm, which waits on kv_a.
        let order = open(g.by_load());
        push_on(
            g,
            order[0],
            MlaKind::RopeQ.kind(),
            first_box(&boxes.rope_q),
            &[q_b],
            [0, rows, 0],
        )?;
        let order = open(g.by_load());
        let mut line = 0;
        for h in 0..self.plan.dims.heads {
            let m = HalfMatrix::Uk(h);
            let ranges = &self.splits[m.index(self.plan.dims.heads)];
            let first = line as usize;
            let ctas: Vec<u32> = (first..first + ranges.len())
                .map(|i| order[i % order.len()])
                .collect();
            self.linear_tasks_on(g, m, ranges, &ctas, &boxes.uk, &mut line, &[q_b])?;
        }
        Ok(())
    }

    /// The last phase: the slot lists published in the launch (a Slots task a row waiting on
    /// `list_ready[row]`, when the lists are published in the launch), the attention's cache
    /// writes, splits and combines, W_UV, o_proj with the residual. Returns the whole plan, its
    /// output set.
    pub fn attend(
        mut self,
        g: &mut LaunchGraph,
        list_ready: &[BoxRange],
    ) -> Result<HalfPlan, HalfError> {
        let rows = self.plan.rows;
        if self.lists_in_launch {
            if list_ready.len() != rows as usize {
                return Err(HalfError::Shape(format!(
                    "{} list boxes for {rows} rows whose lists are published in the launch",
                    list_ready.len()
                )));
            }
            for (row, ready) in list_ready.iter().enumerate() {
                self.slots_task(g, row as u32, 1, &[*ready])?;
            }
        }
        let boxes = self.plan.boxes;
        let graph = |e: GraphError| HalfError::Graph(e.to_string());
        let waits = AttendWaits {
            new_tokens: Some(first_box(&boxes.norm_kv)),
            queries: [Some(whole(&boxes.uk)), Some(first_box(&boxes.rope_q))],
            earlier_cache_writes: true,
        };
        let attend = &self.plan.attend;
        let n = attend.groups.len() as u32 + attend.splits() + attend.combines();
        let ranks = g.ranks(n);
        // Each on the CTA with the fewest tasks: the splits then start while W_UK runs elsewhere.
        // A split goes to a CTA with the fewest splits first, so that no CTA runs two while
        // another runs none: every split waits on the same lists and queries, so a second one on
        // a CTA ends a whole split after the rest, and the combines wait on all of them.
        let mut splits_on = vec![0u32; g.ctas() as usize];
        for t in attend.tasks_waiting(&boxes.attend, ranks.start, &waits) {
            let order = g.by_load();
            let cta = if t.kind == MlaKind::Split.kind() {
                let cta = order
                    .into_iter()
                    .min_by_key(|&c| splits_on[c as usize])
                    .unwrap_or(0);
                splits_on[cta as usize] += 1;
                cta
            } else {
                order[0]
            };
            g.push(cta, t).map_err(graph)?;
        }
        // A combine writes its whole line (`MlaBoxes::out_done`), so the range is every box.
        let combines = [BoxRange::new(
            boxes.attend.out_done.offset(),
            attend.combines() * boxes.attend.out_done.stride(),
        )];
        let mut line = 0;
        for h in 0..self.plan.dims.heads {
            self.linear_tasks(g, HalfMatrix::Uv(h), &boxes.uv, &mut line, &combines)?;
        }
        self.linear_tasks(
            g,
            HalfMatrix::OProj,
            &boxes.o_proj,
            &mut 0,
            &[whole(&boxes.uv)],
        )?;
        self.plan.out = Handoff {
            data: ArenaSlice {
                offset: self.plan.arena.out,
                bytes: u64::from(rows) * self.plan.dims.hidden as u64 * 2,
            },
            ready: whole(&boxes.o_proj),
        };
        Ok(self.plan)
    }
}

/// Where one packed matrix of the half sits on the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PackedAt {
    pub w: u64,
    /// FP8 scales (0 for bf16).
    pub scales: u64,
    pub fp8: bool,
}

/// The device addresses of the half's weights: the matrices by [`HalfMatrix::index`], the three
/// bf16 norm weights.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HalfWeights {
    pub matrices: Vec<PackedAt>,
    pub hidden_norm: u64,
    pub q_a_norm: u64,
    pub kv_a_norm: u64,
}

impl HalfPlan {
    /// `mla_args` of a launch whose activations start at `arena` (device address of
    /// [`HalfArena`]'s offset 0), its cache at `cache`, with softmax `scale` (1/sqrt(qk) is the
    /// model's; the negative controls pass others).
    pub fn mla_args(&self, arena: u64, cache: u64, w: &HalfWeights, scale: f32) -> MlaArgs {
        let (d, a) = (&self.dims, &self.arena);
        let at = |offset: u64| arena + offset;
        MlaArgs {
            q_abs: at(a.q_abs),
            q_pe: at(a.q_pe),
            new_latent: at(a.new_latent),
            new_rope: at(a.new_rope),
            new_slots: at(a.new_slots),
            cache,
            part_o: at(a.part_o),
            part_ml: at(a.part_ml),
            out: at(a.attn),
            scale,
            slot_stride: self.boxes.attend.slots.stride(),
            max_splits: self.attend.max_splits(),
            pad: 0,
            trace: 0,
            half: MlaHalfArgs {
                hidden: at(a.hidden),
                hidden_normed: at(a.hidden_normed),
                hidden_norm: w.hidden_norm,
                q_a: at(a.q_a),
                // No q latent norm task: q_b and the indexer's wq_b norm q_a's output themselves.
                q_latent: 0,
                q_a_norm: w.q_a_norm,
                kv_a: at(a.kv_a),
                kv_a_norm: w.kv_a_norm,
                q: at(a.q),
                positions: at(a.positions),
                inv_freq: at(a.inv_freq),
                slot_lists: at(a.slot_lists),
                hidden_dim: d.hidden as u32,
                q_lora: d.q_lora as u32,
                nope: d.nope as u32,
                hidden_eps: d.hidden_eps as f32,
                latent_eps: d.latent_eps as f32,
                topk: self.topk,
            },
        }
    }

    /// The scale of the model's softmax, 1/sqrt(qk_head_dim) (spec §2.7).
    pub fn model_scale(&self) -> f32 {
        (1.0 / (self.dims.qk() as f64).sqrt()) as f32
    }

    /// The half's matrices for the launch's list (from [`HalfPlan::first_matrix`]), activations at
    /// `arena`: q_a and kv_a read the input rows and q_b q_a's output, each normalising them (the
    /// input norm, the q latent's norm) as it stages them.
    pub fn matrices(&self, arena: u64, w: &HalfWeights) -> Result<Vec<LinMatrix>, HalfError> {
        let (d, a) = (&self.dims, &self.arena);
        let at = |offset: u64| arena + offset;
        let bf16 = |elements: usize| 2 * elements as u64;
        HalfMatrix::all(d.heads)
            .into_iter()
            .map(|m| {
                let (n, k) = m.shape(d);
                let (x, x_stride, y, y_stride) = match m {
                    HalfMatrix::QA => (at(a.hidden), d.hidden, at(a.q_a), d.q_lora),
                    HalfMatrix::KvA => (at(a.hidden), d.hidden, at(a.kv_a), d.latent + d.rope),
                    HalfMatrix::QB => (at(a.q_a), d.q_lora, at(a.q), d.heads * d.qk()),
                    HalfMatrix::Uk(h) => (
                        at(a.q) + bf16(h * d.qk()),
                        d.heads * d.qk(),
                        at(a.q_abs) + bf16(h * d.latent),
                        d.heads * d.latent,
                    ),
                    HalfMatrix::Uv(h) => (
                        at(a.attn) + bf16(h * d.latent),
                        d.heads * d.latent,
                        at(a.o_heads) + bf16(h * d.v),
                        d.heads * d.v,
                    ),
                    HalfMatrix::OProj => (at(a.o_heads), d.heads * d.v, at(a.out), d.hidden),
                };
                let p = w.matrices[m.index(d.heads)];
                let residual = m == HalfMatrix::OProj;
                let matrix = LinMatrix {
                    w: p.w,
                    scales: p.scales,
                    x,
                    y,
                    residual: if residual { at(a.hidden) } else { 0 },
                    row_scale: 0,
                    k: k as u32,
                    n: n as u32,
                    tiles: m.tiles(d),
                    rows: self.rows,
                    x_stride: x_stride as u32,
                    y_stride: y_stride as u32,
                    flags: if p.fp8 { FLAG_FP8 } else { 0 }
                        | if residual { FLAG_RESIDUAL } else { 0 },
                    ..LinMatrix::default()
                };
                let normed = match m {
                    HalfMatrix::QA | HalfMatrix::KvA => {
                        Some((w.hidden_norm, d.hidden, d.hidden_eps))
                    }
                    HalfMatrix::QB => Some((w.q_a_norm, d.q_lora, d.latent_eps)),
                    _ => None,
                };
                let shaped = match (normed, m) {
                    (Some((weight, n, eps)), _) => {
                        matrix.with_rmsnorm(weight, n as u32, 0, eps as f32)
                    }
                    (None, HalfMatrix::Uk(_)) if d.nope < k => {
                        matrix.with_short_rows(d.nope as u32)
                    }
                    (None, _) => Ok(matrix),
                };
                shaped.map_err(|e| HalfError::Shape(e.to_string()))
            })
            .collect()
    }

    /// Dynamic shared memory the half's tasks need in CTAs of `threads`: the attention's splits,
    /// and the linear with its widest x.
    pub fn lds_bytes(&self, threads: u32) -> Result<u32, HalfError> {
        let d = &self.dims;
        let widest = [d.hidden, d.q_lora, d.uk_k(), d.latent, d.heads * d.v]
            .into_iter()
            .max()
            .unwrap_or(0);
        let lin = linear::layout::lds_bytes(threads, widest, self.rows as usize)
            .map_err(|e| HalfError::Shape(e.to_string()))?;
        Ok(lin.max(self.shape.lds_bytes() as u32))
    }
}

/// The linear stage as the fused kernel's generator takes it: the tile's task function and
/// decoder, no shape defines (a matrix's shape is in its descriptor).
pub fn linear_stage() -> StageKernel {
    StageKernel {
        stage: Stage::Linear,
        include: linear::gpu::LIN_TASK_H.0,
        headers: vec![linear::gpu::LIN_TASK_H],
        args_type: "lin_args",
        decoder: "lin_decode",
        defines: Default::default(),
    }
}

/// The name of the attention half's fused kernel source.
pub const SOURCE_NAME: &str = "fused_attention";

/// The stages of the attention half's fused kernel: the linear, and MLA built for the attention's
/// `attend` shape, the rope `style` (the config's; the other is a negative control) and CTAs of
/// `shape`.
pub fn half_stages(
    shape: CtaShape,
    attend: &AttendShape,
    style: RopeStyle,
) -> Result<Vec<StageKernel>, HalfError> {
    if attend.lds_bytes() > shape.shared_bytes as usize {
        return Err(HalfError::Shape(format!(
            "the attention's splits need {} bytes of shared memory; the CTA has {}",
            attend.lds_bytes(),
            shape.shared_bytes
        )));
    }
    Ok(vec![
        linear_stage(),
        mla::gpu::stage_kernel(attend, style == RopeStyle::Interleaved, shape.shared_bytes),
    ])
}

/// The attention half's fused kernel over [`half_stages`], with the mailbox's `variant`.
pub fn half_source(
    shape: CtaShape,
    attend: &AttendShape,
    style: RopeStyle,
    variant: Variant,
) -> Result<KernelSource, HalfError> {
    let stages = half_stages(shape, attend, style)?;
    let source =
        fused_source(SOURCE_NAME, &stages, shape).map_err(|e| HalfError::Shape(e.to_string()))?;
    Ok(variant.apply(source))
}
