//! The MoE half of a layer as one fused launch: the router's fp32 logits (linear tasks over the
//! gate weight), the route task, the shared expert beside them, every slot of the step's distinct
//! chosen experts (gate/up with SwiGLU, then down scaled by the rows' weights), and the combine
//! (residual + shared + the routed experts' weighted sum, in a fixed order). From the model config,
//! the TP degree, the step's rows and the CTA count this makes the task graph (`moe::layout`),
//! places it on the CTAs, checks it, and generates the fused kernel's source (the linear and MoE
//! stages in one switch).
//!
//! The hand-offs: the route task publishes slot j's expert in slot box j (a tagged pair); a slot's
//! gang of pair tasks waits on that box before it loads a weight (the choice is made on the
//! device), and each member's down, its weights already in its LDS, waits on the gate/up boxes of
//! the other members. The combine waits on the route task (each row's slots and weights,
//! published beside its boxes), the shared down and every gang. Where the launch's input rows come
//! from a hand-off, the router, the shared gate/up and every pair task wait on its boxes.

use super::graph::{ArenaSlice, GraphError, Handoff, LaunchGraph};
use super::{fused_source, CtaShape};
use device::KernelSource;
use linear::layout::{KIND_EXPERT_PAIR, PAIR_PEERS_AFTER, PAIR_PEERS_BEFORE, PAIR_SLOT};
use mailbox::gpu::Variant;
use mailbox::layout::BoxRange;
use mailbox::{Limits, Placement, Stage, ValidPlacement};
use model::{ModelConfig, WeightFormat};
use moe::layout::{place, MoePlan, MoeShape, MoeStart, BANK_GATE_UP, KIND_COMBINE};

/// What a MoE launch is built for: the CTAs (one a SM) and the TP degree of the rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeBuild {
    pub ctas: u32,
    pub tp: usize,
}

/// Bad input, found before anything runs.
#[derive(Debug, thiserror::Error)]
pub enum MoeGraphError {
    #[error(transparent)]
    Moe(#[from] moe::MoeError),
    #[error("placement: {0}")]
    Placement(#[from] mailbox::PlacementError),
    #[error("fused source: {0}")]
    Source(#[from] super::FusedSourceError),
    #[error("launch graph: {0}")]
    Graph(#[from] GraphError),
    #[error("the MoE output needs {need} bytes; the slice given holds {have}")]
    Output { need: u64, have: u64 },
    #[error("the MoE boxes start at box {0}, not a line boundary")]
    Unaligned(u32),
    #[error("task {task} (slot {slot}) does not wait on {what}")]
    MissedWait {
        task: u32,
        slot: u32,
        what: &'static str,
    },
}

/// The task graph of one step's MoE half, placed and checked.
#[derive(Clone, Debug)]
pub struct MoeGraph {
    pub shape: MoeShape,
    pub plan: MoePlan,
    pub placement: ValidPlacement,
}

impl MoeGraph {
    /// Plans `rows` rows of a TP rank of `cfg` (experts in `format`) on a launch `build`, its boxes
    /// and ranks from `start` (its input's boxes included).
    pub fn new(
        cfg: &ModelConfig,
        rows: usize,
        format: WeightFormat,
        build: MoeBuild,
        start: &MoeStart,
    ) -> Result<MoeGraph, MoeGraphError> {
        let shape = MoeShape::new(cfg, build.tp, rows, format)?;
        let plan = place(&shape, build.ctas, start)?;
        let placement = plan.placement.clone().check(Limits {
            max_resident: build.ctas,
            scratch_boxes: plan.end_box,
        })?;
        let graph = MoeGraph {
            shape,
            plan,
            placement,
        };
        graph.check_handoff(graph.placement.placement())?;
        Ok(graph)
    }

    /// The hand-off rules the placement check cannot see ([`check_moe_handoff`]).
    pub fn check_handoff(&self, placement: &Placement) -> Result<(), MoeGraphError> {
        check_moe_handoff(&self.plan, placement)
    }
}

/// The hand-off rules the placement check cannot see (it knows boxes, not what they mean): every
/// pair task of `plan` in `placement` reads the launch's banks, waits on its slot's box and on the
/// lines of every other member of its slot's gang (and those lines alone), and every combine on
/// the route task, the shared down and every gang.
pub fn check_moe_handoff(plan: &MoePlan, placement: &Placement) -> Result<(), MoeGraphError> {
    let waits_on = |t: &mailbox::Task, r: BoxRange| {
        t.inputs()
            .iter()
            .any(|i| i.first <= r.first && r.end() <= i.end())
    };
    let own =
        |t: &mailbox::Task| plan.router.first <= t.out.first && t.out.end() <= plan.combine.end();
    for (_, t) in placement.tasks().filter(|(_, t)| own(t)) {
        let missed = |slot: u32, what| MoeGraphError::MissedWait {
            task: t.order,
            slot,
            what,
        };
        if t.kind == KIND_EXPERT_PAIR {
            let (bank, slot) = (t.args[0] & 0xffff, t.args[0] >> 16);
            if bank != BANK_GATE_UP {
                return Err(missed(slot, "the banks of the launch"));
            }
            let inputs = t.inputs();
            if inputs.get(PAIR_SLOT) != Some(&BoxRange::new(plan.slots.first + slot, 1)) {
                return Err(missed(slot, "its slot's box, as its first input"));
            }
            // Its gang's lines but its own, in two ranges around it.
            let gang = plan.experts.get(slot as usize).copied();
            let (before, after) = (inputs.get(PAIR_PEERS_BEFORE), inputs.get(PAIR_PEERS_AFTER));
            let peers = gang.zip(before).zip(after).is_some_and(|((g, b), a)| {
                b.first == g.first
                    && b.end() == u64::from(t.out.first)
                    && a.first as u64 == t.out.end()
                    && a.end() == g.end()
            });
            if !peers {
                return Err(missed(slot, "the other members of its slot's gang"));
            }
        } else if t.kind == KIND_COMBINE {
            for (range, what) in [
                (plan.slots, "the route task"),
                (plan.shared_down, "the shared down"),
                (plan.routed, "every slot's gang"),
            ] {
                if !waits_on(t, range) {
                    return Err(missed(0, what));
                }
            }
        }
    }
    Ok(())
}

/// The activation arena slices of the MoE half in a launch (`moe::memory` lays the same out for
/// a launch of its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeSlices {
    /// `[router_splits, rows, experts]` fp32 partial logits.
    pub logits: ArenaSlice,
    pub shared_act: ArenaSlice,
    pub shared_out: ArenaSlice,
    /// `[slots, rows, inter]` bf16.
    pub act: ArenaSlice,
    /// `[rows, slots, hidden]` bf16, the weighted expert outputs.
    pub routed: ArenaSlice,
    pub slot_scale: ArenaSlice,
    pub row_slots: ArenaSlice,
    pub row_experts: ArenaSlice,
    pub row_weights: ArenaSlice,
}

/// What the MoE part added to a launch: its plan (tasks, boxes), its matrices' first index in the
/// launch's list (`moe::layout::MAT_*` from there; the expert banks are `lin_args.experts` 0 and
/// 1, `moe::layout::BANK_*`), and its arena slices.
#[derive(Clone, Debug)]
pub struct MoePart {
    pub shape: MoeShape,
    pub plan: MoePlan,
    pub first_matrix: u32,
    pub slices: MoeSlices,
}

/// The MoE half as a part of a launch: `x` the rows its input matrices read (bf16 `[rows, hidden]`:
/// the post-attention-normed rows, or h itself where they norm it as they stage it, as a layer
/// launch binds them, `step::layer::moe`), `residual` h; returns the layer's output rows (bf16(h + MoE(x))) and the combine's completion
/// boxes, and what the part added. Its tasks take ranks, boxes (one region, `moe`), matrices and
/// CTAs from the graph in turn after the parts before it.
pub fn moe_part(
    g: &mut LaunchGraph,
    shape: &MoeShape,
    x: Handoff,
    residual: Handoff,
) -> Result<(Handoff, MoePart), MoeGraphError> {
    moe_part_to(g, shape, x, residual, None)
}

/// [`moe_part`] writing the layer's output rows to `out` (the step's residual stream) instead of
/// a slice of its own.
pub fn moe_part_into(
    g: &mut LaunchGraph,
    shape: &MoeShape,
    x: Handoff,
    residual: Handoff,
    out: ArenaSlice,
) -> Result<(Handoff, MoePart), MoeGraphError> {
    moe_part_to(g, shape, x, residual, Some(out))
}

fn moe_part_to(
    g: &mut LaunchGraph,
    shape: &MoeShape,
    x: Handoff,
    residual: Handoff,
    out: Option<ArenaSlice>,
) -> Result<(Handoff, MoePart), MoeGraphError> {
    let ctas = g.ctas();
    let need = 2 * shape.rows as u64 * shape.hidden as u64;
    if let Some(slice) = out {
        if slice.bytes < need {
            return Err(MoeGraphError::Output {
                need,
                have: slice.bytes,
            });
        }
    }
    let mut start = MoeStart {
        input: x.waits(),
        residual: if residual.ready == x.ready {
            Vec::new()
        } else {
            residual.waits()
        },
        ..MoeStart::default()
    };
    // A dry run counts the tasks and boxes; the part then asks for exactly those.
    let dry = place(shape, ctas, &start)?;
    let tasks = dry.end_order;
    let region = g
        .regions()
        .region::<u32>(
            "moe",
            dry.end_box / mailbox::layout::BOXES_PER_LINE,
            mailbox::layout::BOXES_PER_LINE,
        )
        .map_err(GraphError::from)?;
    if region.offset() % mailbox::layout::BOXES_PER_LINE != 0 {
        return Err(MoeGraphError::Unaligned(region.offset()));
    }
    start.first_box = region.offset();
    start.first_order = g.ranks(tasks).start;
    start.first_matrix = g.matrix();
    for _ in 1..2 + shape.router_splits() {
        g.matrix();
    }
    let plan = place(shape, ctas, &start)?;
    let first_cta = g.next_cta();
    for _ in 1..tasks {
        g.next_cta();
    }
    for (cta, task) in plan.placement.tasks() {
        g.push((cta + first_cta) % ctas, *task)?;
    }
    let (rows, e, slots) = (
        shape.rows as u64,
        shape.experts as u64,
        shape.slots() as u64,
    );
    let (h, n, k) = (shape.hidden as u64, shape.inter as u64, shape.top_k as u64);
    let splits = shape.router_splits() as u64;
    let slices = MoeSlices {
        logits: g.arena("moe_logits", 4 * splits * rows * e)?,
        shared_act: g.arena("moe_shared_act", 2 * rows * n)?,
        shared_out: g.arena("moe_shared_out", 2 * rows * h)?,
        act: g.arena("moe_act", 2 * slots * rows * n)?,
        routed: g.arena("moe_routed", 2 * rows * slots * h)?,
        slot_scale: g.arena("moe_slot_scale", 4 * slots * rows)?,
        row_slots: g.arena("moe_row_slots", 4 * rows * k)?,
        row_experts: g.arena("moe_row_experts", 4 * rows * k)?,
        row_weights: g.arena("moe_row_weights", 4 * rows * k)?,
    };
    let data = match out {
        Some(slice) => ArenaSlice {
            offset: slice.offset,
            bytes: need,
        },
        None => g.arena("moe_out", need)?,
    };
    let out = Handoff {
        data,
        ready: plan.combine,
    };
    let part = MoePart {
        shape: *shape,
        plan,
        first_matrix: start.first_matrix,
        slices,
    };
    Ok((out, part))
}

/// The name of the MoE half's fused kernel source.
pub const SOURCE_NAME: &str = "fused_moe";

/// The MoE half's fused kernel for a CTA `shape`: the linear stage's and the MoE stage's decoders
/// in one switch (kernel arguments `lin_args`, `moe_args`), the mailbox's `variant`.
pub fn moe_source(shape: CtaShape, variant: Variant) -> Result<KernelSource, MoeGraphError> {
    let stages = [linear::gpu::stage_kernel(), moe::gpu::stage_kernel()];
    debug_assert_eq!(stages[1].stage, Stage::Moe);
    Ok(variant.apply(fused_source(SOURCE_NAME, &stages, shape)?))
}
