//! The head's parts of a fused launch (the [`LaunchGraph`] API): the embedding of layer 0, the
//! dense MLP of the first layers, and the tail. Each part adds head-stage tasks
//! (`head::layout`) and linear tasks (`linear::layout`) to the graph, in one global order:
//!
//! - [`embed_part`]: a task a row copies its token's embedding row (token ids from a device buffer
//!   written before the launch: by the host, or by the previous step's tail) into the arena.
//! - [`dense_mlp_part`]: the post-attention norm (a task a row), gate/up with the SwiGLU epilogue
//!   split over the grid and waiting on the norm's lines, then down with the residual waiting on
//!   every gate/up line. At TP > 1 the down's output is the rank's partial sum: the residual is
//!   added by one rank only, after the all-reduce ([`DenseShape::residual`]).
//! - [`tail_part`]: the final norm (a task a row), lm_head over the rank's vocabulary shard split
//!   over the grid (bf16 logits, as the reference step stores them), the argmax of each row over
//!   the shard as a (logit, token) pair (a task a row, waiting on every lm_head line), and the
//!   pick of each row's token over the shards' pairs. One GPU holds one rank, so the pick reads
//!   this shard's pairs alone (the other shards' slots are never written here); a cross-rank
//!   argmax adds an exchange of the pairs `[rows, shards]` before it and picks over all of them.
//!
//! A part reserves its entries of the launch's linear matrix list ([`LaunchGraph::matrix`]) and of
//! the head stage's descriptor lists ([`HeadLists`]); once buffers exist, the plan it returns
//! binds them (`bind`): device addresses into the matrices and [`HeadDescriptors`].

use super::graph::{ArenaSlice, Completion, GraphError, Handoff, LaunchGraph};
use super::{fused_source, CtaShape, FusedSourceError};
use device::KernelSource;
use head::gpu::{HeadArgmax, HeadEmbed, HeadNorm, HeadPick};
use head::layout::{task as head_task, KIND_ARGMAX, KIND_EMBED, KIND_NORM, KIND_PICK};
use linear::gpu::{LinMatrix, FLAG_FP8, FLAG_RESIDUAL, FLAG_SWIGLU};
use linear::layout::{split_tiles, KIND_TILES, MAX_ROWS};
use mailbox::gpu::Variant;
use mailbox::layout::BoxRange;
use mailbox::{StageKernel, Task};
use model::weights::packed::{PackedLayout, Pairing};
use model::WeightFormat;

/// Bad shapes or a graph the rule refuses, found while a launch is planned.
#[derive(Debug, thiserror::Error)]
pub enum HeadPartError {
    #[error("{rows} rows: the head's parts take 1 to {MAX_ROWS}")]
    Rows { rows: u32 },
    #[error("{what}: {reason}")]
    Shape { what: &'static str, reason: String },
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error(transparent)]
    Head(#[from] head::layout::LayoutError),
    #[error(transparent)]
    Task(#[from] mailbox::task::TooManyInputs),
}

pub type Result<T, E = HeadPartError> = std::result::Result<T, E>;

/// The entries of the head stage's descriptor lists a launch's parts have reserved (the head's
/// twin of [`LaunchGraph::matrix`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeadLists {
    pub embeds: u32,
    pub norms: u32,
    pub argmaxes: u32,
    pub picks: u32,
}

fn reserve(n: &mut u32) -> u32 {
    *n += 1;
    *n - 1
}

/// The head stage's descriptors of one launch, as `head_args` points to them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeadDescriptors {
    pub embeds: Vec<HeadEmbed>,
    pub norms: Vec<HeadNorm>,
    pub argmaxes: Vec<HeadArgmax>,
    pub picks: Vec<HeadPick>,
}

impl HeadDescriptors {
    /// Zeroed lists of the reserved lengths, for the plans' `bind` to fill.
    pub fn new(lists: &HeadLists) -> Self {
        HeadDescriptors {
            embeds: vec![HeadEmbed::default(); lists.embeds as usize],
            norms: vec![HeadNorm::default(); lists.norms as usize],
            argmaxes: vec![HeadArgmax::default(); lists.argmaxes as usize],
            picks: vec![HeadPick::default(); lists.picks as usize],
        }
    }
}

fn check_rows(rows: u32) -> Result<()> {
    if rows == 0 || rows as usize > MAX_ROWS {
        return Err(HeadPartError::Rows { rows });
    }
    Ok(())
}

fn packed(
    what: &'static str,
    format: WeightFormat,
    pairing: Pairing,
    n: u32,
    k: u32,
) -> Result<PackedLayout> {
    PackedLayout::new(format, pairing, n as usize, k as usize).map_err(|e| HeadPartError::Shape {
        what,
        reason: e.to_string(),
    })
}

/// A head task of `kind` for each row, on CTAs in turn, each at its own rank and writing its
/// line of `name`'s completion after waiting on `waits`.
fn row_tasks(
    g: &mut LaunchGraph,
    name: &str,
    kind: u32,
    op: u32,
    rows: u32,
    waits: &[BoxRange],
) -> Result<Completion> {
    let done = g.completion(name, rows)?;
    for r in 0..rows {
        let (rank, cta) = (g.rank(), g.next_cta());
        let out = done.line(r).expect("a line a row");
        g.push(cta, head_task(kind, rank, op, r..r + 1, out, waits)?)?;
    }
    Ok(done)
}

/// Matrix `matrix` of `tiles` tiles split over the grid into linear tasks on CTAs in turn, each
/// at its own rank and writing its line of `name`'s completion after waiting on `waits`.
pub(super) fn matrix_tasks(
    g: &mut LaunchGraph,
    name: &str,
    matrix: u32,
    tiles: u32,
    waits: &[BoxRange],
) -> Result<Completion> {
    let tasks = split_tiles(tiles, g.ctas()).len();
    let ctas: Vec<u32> = (0..tasks).map(|_| g.next_cta()).collect();
    matrix_tasks_on(g, name, matrix, tiles, waits, &ctas)
}

/// Matrix `matrix` of `tiles` tiles split into a linear task on each of `ctas` (fewer where it has
/// fewer tiles), each at its own rank and writing its line of `name`'s completion after waiting on
/// `waits`.
pub(super) fn matrix_tasks_on(
    g: &mut LaunchGraph,
    name: &str,
    matrix: u32,
    tiles: u32,
    waits: &[BoxRange],
    ctas: &[u32],
) -> Result<Completion> {
    if ctas.is_empty() {
        return Err(HeadPartError::Shape {
            what: "linear tasks",
            reason: format!("matrix {matrix} ({name}) given no CTA to run on"),
        });
    }
    let ranges = split_tiles(tiles, ctas.len() as u32);
    let done = g.completion(name, ranges.len() as u32)?;
    for (i, (range, &cta)) in ranges.iter().zip(ctas).enumerate() {
        let rank = g.rank();
        let out = done.line(i as u32).expect("a line a task");
        let args = [matrix, range.first, range.count];
        g.push(cta, Task::new(KIND_TILES, rank, out, waits, args)?)?;
    }
    Ok(done)
}

/// `[rows, cols]` of `bytes`-wide elements in the arena.
fn rows_slice(
    g: &mut LaunchGraph,
    name: &str,
    rows: u32,
    cols: u32,
    bytes: u64,
) -> Result<ArenaSlice> {
    Ok(g.arena(name, u64::from(rows) * u64::from(cols) * bytes)?)
}

fn bf16_slice(g: &mut LaunchGraph, name: &str, rows: u32, cols: u32) -> Result<ArenaSlice> {
    rows_slice(g, name, rows, cols, 2)
}

/// `out` when given (checked to hold `[rows, cols]` bf16), else a new slice `name` of that size.
fn output(
    g: &mut LaunchGraph,
    name: &str,
    rows: u32,
    cols: u32,
    out: Option<ArenaSlice>,
) -> Result<ArenaSlice> {
    let need = u64::from(rows) * u64::from(cols) * 2;
    match out {
        Some(slice) if slice.bytes < need => Err(HeadPartError::Shape {
            what: "output slice",
            reason: format!(
                "`{name}` needs {need} bytes; the slice given holds {}",
                slice.bytes
            ),
        }),
        Some(slice) => Ok(ArenaSlice {
            offset: slice.offset,
            bytes: need,
        }),
        None => bf16_slice(g, name, rows, cols),
    }
}

/// The embedding of layer 0, planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbedPlan {
    pub rows: u32,
    pub hidden: u32,
    pub op: u32,
    /// `[rows, hidden]` bf16: the residual stream layer 0 starts from.
    pub out: Handoff,
}

/// A task a row: `[rows, hidden]` bf16 embedding rows of the tokens in a device buffer.
pub fn embed_part(
    g: &mut LaunchGraph,
    lists: &mut HeadLists,
    rows: u32,
    hidden: u32,
) -> Result<EmbedPlan> {
    embed_part_to(g, lists, rows, hidden, None)
}

/// [`embed_part`] writing its rows to `out` (a slice the launch's caller chose: the step's
/// residual stream) instead of a slice of its own.
pub fn embed_part_into(
    g: &mut LaunchGraph,
    lists: &mut HeadLists,
    rows: u32,
    hidden: u32,
    out: ArenaSlice,
) -> Result<EmbedPlan> {
    embed_part_to(g, lists, rows, hidden, Some(out))
}

fn embed_part_to(
    g: &mut LaunchGraph,
    lists: &mut HeadLists,
    rows: u32,
    hidden: u32,
    out: Option<ArenaSlice>,
) -> Result<EmbedPlan> {
    check_rows(rows)?;
    head::layout::check_embedding(hidden, hidden)?;
    let op = reserve(&mut lists.embeds);
    let x = output(g, "embedded", rows, hidden, out)?;
    let done = row_tasks(g, "embed_done", KIND_EMBED, op, rows, &[])?;
    Ok(EmbedPlan {
        rows,
        hidden,
        op,
        out: Handoff {
            data: x,
            ready: done.all(),
        },
    })
}

impl EmbedPlan {
    /// The table `[vocab, hidden]` bf16 and the token ids `[rows]` (device addresses); the arena
    /// at `arena`.
    pub fn bind(&self, arena: u64, table: u64, vocab: u32, tokens: u64, d: &mut HeadDescriptors) {
        d.embeds[self.op as usize] = HeadEmbed {
            table,
            tokens,
            y: arena + self.out.data.offset,
            vocab,
            hidden: self.hidden,
            y_stride: self.hidden,
            pad: 0,
        };
    }
}

/// A norm of `rows` rows of `n` from the arena's `x` to its `y`.
fn norm_descriptor(
    arena: u64,
    x: ArenaSlice,
    y: ArenaSlice,
    weight: u64,
    n: u32,
    eps: f32,
) -> HeadNorm {
    HeadNorm {
        x: arena + x.offset,
        weight,
        y: arena + y.offset,
        n,
        x_stride: n,
        y_stride: n,
        eps,
    }
}

/// A plain linear matrix's descriptor (bf16 output, x and y rows dense).
#[allow(clippy::too_many_arguments)]
fn matrix_descriptor(
    layout: &PackedLayout,
    w: u64,
    scales: u64,
    x: u64,
    y: u64,
    rows: u32,
    out_cols: u32,
    flags: u32,
) -> LinMatrix {
    let fp8 = if layout.format == WeightFormat::Fp8 {
        FLAG_FP8
    } else {
        0
    };
    LinMatrix {
        w,
        scales,
        x,
        y,
        residual: 0,
        row_scale: 0,
        k: layout.k as u32,
        n: out_cols,
        tiles: layout.tiles() as u32,
        rows,
        x_stride: layout.k as u32,
        y_stride: out_cols,
        flags: flags | fp8,
        ..LinMatrix::default()
    }
}

/// One layer's dense MLP on one rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DenseShape {
    pub rows: u32,
    pub hidden: u32,
    /// The rank's share of `intermediate_size`.
    pub intermediate: u32,
    pub eps: f32,
    pub format: WeightFormat,
    /// Adds the layer's input to the down projection (the whole MLP at TP 1; at TP > 1 only the
    /// rank that adds it after the all-reduce).
    pub residual: bool,
}

/// The dense MLP, planned.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DensePlan {
    pub shape: DenseShape,
    pub norm: u32,
    pub gate_up: u32,
    pub down: u32,
    pub input: Handoff,
    /// `[rows, hidden]`: the post-attention norm's output.
    pub h_hat: ArenaSlice,
    /// `[rows, intermediate]`: silu(gate) * up.
    pub act: ArenaSlice,
    /// `[rows, hidden]`: the layer's output (with the residual) or the rank's partial sum.
    pub out: Handoff,
}

/// The post-attention norm, gate/up (SwiGLU) and down (+ the residual) of `h`.
pub fn dense_mlp_part(
    g: &mut LaunchGraph,
    lists: &mut HeadLists,
    shape: DenseShape,
    h: Handoff,
) -> Result<DensePlan> {
    dense_mlp_part_to(g, lists, shape, h, None)
}

/// [`dense_mlp_part`] writing the layer's output rows to `out` (the step's residual stream)
/// instead of a slice of its own.
pub fn dense_mlp_part_into(
    g: &mut LaunchGraph,
    lists: &mut HeadLists,
    shape: DenseShape,
    h: Handoff,
    out: ArenaSlice,
) -> Result<DensePlan> {
    dense_mlp_part_to(g, lists, shape, h, Some(out))
}

fn dense_mlp_part_to(
    g: &mut LaunchGraph,
    lists: &mut HeadLists,
    shape: DenseShape,
    h: Handoff,
    out: Option<ArenaSlice>,
) -> Result<DensePlan> {
    check_rows(shape.rows)?;
    let gate_up = packed(
        "dense gate/up",
        shape.format,
        Pairing::GateUp,
        shape.intermediate,
        shape.hidden,
    )?;
    let down = packed(
        "dense down",
        shape.format,
        Pairing::Plain,
        shape.hidden,
        shape.intermediate,
    )?;
    let norm = reserve(&mut lists.norms);
    let h_hat = bf16_slice(g, "dense_h_hat", shape.rows, shape.hidden)?;
    let act = bf16_slice(g, "dense_act", shape.rows, shape.intermediate)?;
    let out = output(g, "dense_out", shape.rows, shape.hidden, out)?;
    let normed = row_tasks(
        g,
        "dense_norm_done",
        KIND_NORM,
        norm,
        shape.rows,
        &h.waits(),
    )?;
    let (gu, dn) = (g.matrix(), g.matrix());
    let acted = matrix_tasks(
        g,
        "dense_gate_up_done",
        gu,
        gate_up.tiles() as u32,
        &[normed.all()],
    )?;
    // The residual is h itself, ready before the norm read it: the down waits on the gate/up
    // alone, which waited (through the norm) on h.
    let done = matrix_tasks(
        g,
        "dense_down_done",
        dn,
        down.tiles() as u32,
        &[acted.all()],
    )?;
    Ok(DensePlan {
        shape,
        norm,
        gate_up: gu,
        down: dn,
        input: h,
        h_hat,
        act,
        out: Handoff {
            data: out,
            ready: done.all(),
        },
    })
}

/// A dense MLP's weights on the device: the norm weight (bf16) and the packed matrices
/// (`model::weights::packed`; scales 0 for bf16).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DenseWeights {
    pub post_norm: u64,
    pub gate_up: u64,
    pub gate_up_scales: u64,
    pub down: u64,
    pub down_scales: u64,
}

impl DensePlan {
    pub fn bind(
        &self,
        arena: u64,
        w: &DenseWeights,
        mats: &mut [LinMatrix],
        d: &mut HeadDescriptors,
    ) {
        let s = self.shape;
        d.norms[self.norm as usize] = norm_descriptor(
            arena,
            self.input.data,
            self.h_hat,
            w.post_norm,
            s.hidden,
            s.eps,
        );
        let gate_up = PackedLayout {
            format: s.format,
            pairing: Pairing::GateUp,
            n: s.intermediate as usize,
            k: s.hidden as usize,
        };
        let down = PackedLayout {
            format: s.format,
            pairing: Pairing::Plain,
            n: s.hidden as usize,
            k: s.intermediate as usize,
        };
        mats[self.gate_up as usize] = matrix_descriptor(
            &gate_up,
            w.gate_up,
            w.gate_up_scales,
            arena + self.h_hat.offset,
            arena + self.act.offset,
            s.rows,
            s.intermediate,
            FLAG_SWIGLU,
        );
        let mut m = matrix_descriptor(
            &down,
            w.down,
            w.down_scales,
            arena + self.act.offset,
            arena + self.out.data.offset,
            s.rows,
            s.hidden,
            if s.residual { FLAG_RESIDUAL } else { 0 },
        );
        if s.residual {
            m.residual = arena + self.input.data.offset;
        }
        mats[self.down as usize] = m;
    }

    /// Shared memory the part's linear tasks take in a CTA of `threads`.
    pub fn lds_bytes(&self, threads: u32) -> Result<u32, linear::layout::LayoutError> {
        let s = self.shape;
        let rows = s.rows as usize;
        Ok(
            linear::layout::lds_bytes(threads, s.hidden as usize, rows)?.max(
                linear::layout::lds_bytes(threads, s.intermediate as usize, rows)?,
            ),
        )
    }
}

/// The tail on one rank: its shard of lm_head is rows `shard * vocab_rows ..` of the vocabulary.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TailShape {
    pub rows: u32,
    pub hidden: u32,
    /// lm_head rows on this rank.
    pub vocab_rows: u32,
    pub shard: u32,
    pub shards: u32,
    pub eps: f32,
    pub format: WeightFormat,
}

/// The tail, planned.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TailPlan {
    pub shape: TailShape,
    pub norm: u32,
    pub lm_head: u32,
    pub argmax: u32,
    pub pick: u32,
    pub input: Handoff,
    /// `[rows, hidden]`: the final norm's output.
    pub z: ArenaSlice,
    /// `[rows, vocab_rows]` bf16: the shard's logits.
    pub logits: ArenaSlice,
    /// `[rows, shards]` u64: the shards' pairs (this rank's at `shard`). The pick takes the
    /// largest of this rank's slot alone: the others hold whatever the shared arena held until
    /// an exchange brings their ranks' pairs.
    pub pairs: ArenaSlice,
    /// `[rows]` u32 token ids.
    pub tokens: Handoff,
}

/// The final norm of `x`, lm_head's shard, the shard's argmax pairs and the pick.
pub fn tail_part(
    g: &mut LaunchGraph,
    lists: &mut HeadLists,
    shape: TailShape,
    x: Handoff,
) -> Result<TailPlan> {
    check_rows(shape.rows)?;
    if shape.shards == 0 || shape.shard >= shape.shards {
        return Err(HeadPartError::Shape {
            what: "vocabulary shard",
            reason: format!("shard {} of {}", shape.shard, shape.shards),
        });
    }
    if u64::from(shape.vocab_rows) * u64::from(shape.shards) > u64::from(u32::MAX) {
        return Err(HeadPartError::Shape {
            what: "vocabulary",
            reason: format!(
                "{} shards of {} rows pass u32 token ids",
                shape.shards, shape.vocab_rows
            ),
        });
    }
    let lm_head = packed(
        "lm_head shard",
        shape.format,
        Pairing::Plain,
        shape.vocab_rows,
        shape.hidden,
    )?;
    let (norm, argmax, pick) = (
        reserve(&mut lists.norms),
        reserve(&mut lists.argmaxes),
        reserve(&mut lists.picks),
    );
    let z = bf16_slice(g, "tail_z", shape.rows, shape.hidden)?;
    let logits = bf16_slice(g, "tail_logits", shape.rows, shape.vocab_rows)?;
    let pairs = rows_slice(g, "tail_pairs", shape.rows, shape.shards, 8)?;
    let tokens = rows_slice(g, "tail_tokens", shape.rows, 1, 4)?;
    let normed = row_tasks(g, "tail_norm_done", KIND_NORM, norm, shape.rows, &x.waits())?;
    let m = g.matrix();
    let scored = matrix_tasks(
        g,
        "lm_head_done",
        m,
        lm_head.tiles() as u32,
        &[normed.all()],
    )?;
    let paired = row_tasks(
        g,
        "argmax_done",
        KIND_ARGMAX,
        argmax,
        shape.rows,
        &[scored.all()],
    )?;
    let (rank, cta) = (g.rank(), g.next_cta());
    let picked = g.completion("pick_done", 1)?;
    let out = picked.line(0).expect("one line");
    g.push(
        cta,
        head_task(KIND_PICK, rank, pick, 0..shape.rows, out, &[paired.all()])?,
    )?;
    Ok(TailPlan {
        shape,
        norm,
        lm_head: m,
        argmax,
        pick,
        input: x,
        z,
        logits,
        pairs,
        tokens: Handoff {
            data: tokens,
            ready: picked.all(),
        },
    })
}

/// The tail's weights on the device: the final norm's weight (bf16) and the packed lm_head shard
/// (scales 0 for bf16).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TailWeights {
    pub final_norm: u64,
    pub lm_head: u64,
    pub lm_head_scales: u64,
}

impl TailPlan {
    pub fn bind(
        &self,
        arena: u64,
        w: &TailWeights,
        mats: &mut [LinMatrix],
        d: &mut HeadDescriptors,
    ) {
        let s = self.shape;
        d.norms[self.norm as usize] = norm_descriptor(
            arena,
            self.input.data,
            self.z,
            w.final_norm,
            s.hidden,
            s.eps,
        );
        let layout = PackedLayout {
            format: s.format,
            pairing: Pairing::Plain,
            n: s.vocab_rows as usize,
            k: s.hidden as usize,
        };
        mats[self.lm_head as usize] = matrix_descriptor(
            &layout,
            w.lm_head,
            w.lm_head_scales,
            arena + self.z.offset,
            arena + self.logits.offset,
            s.rows,
            s.vocab_rows,
            0,
        );
        let pairs = arena + self.pairs.offset;
        d.argmaxes[self.argmax as usize] = HeadArgmax {
            logits: arena + self.logits.offset,
            pairs,
            n: s.vocab_rows,
            stride: s.vocab_rows,
            first_id: s.shard * s.vocab_rows,
            shard: s.shard,
            shards: s.shards,
            pad: 0,
        };
        // One GPU holds one rank: its pairs are the only ones written. The other shards' slots
        // hold whatever the shared arena held, until an exchange of the pairs fills them.
        d.picks[self.pick as usize] = HeadPick {
            pairs,
            tokens: arena + self.tokens.data.offset,
            shards: s.shards,
            first: s.shard,
            count: 1,
            pad: 0,
        };
    }

    /// Shared memory the part's tasks take in a CTA of `threads`.
    pub fn lds_bytes(&self, threads: u32) -> Result<u32, linear::layout::LayoutError> {
        linear::layout::lds_bytes(
            threads,
            self.shape.hidden as usize,
            self.shape.rows as usize,
        )
    }
}

/// The name of the head's fused kernel source.
pub const SOURCE_NAME: &str = "fused_head";

/// The stages of the head's fused kernel, in the order of its arguments after `mbx_launch`:
/// `lin_args`, `head_args`.
pub fn head_stages() -> [StageKernel; 2] {
    [linear::gpu::stage_kernel(), head::gpu::stage_kernel()]
}

/// The fused kernel of the head's parts: [`head_stages`], one switch over their decoders, the
/// mailbox's `variant`.
pub fn head_source(shape: CtaShape, variant: Variant) -> Result<KernelSource, FusedSourceError> {
    Ok(variant.apply(fused_source(SOURCE_NAME, &head_stages(), shape)?))
}
