//! The MoE half of a layer as one fused launch: the router's fp32 logits (linear tasks over the
//! gate weight), the route task, the shared expert beside them, every slot of the step's distinct
//! chosen experts (gate/up with SwiGLU, then down scaled by the rows' weights), and the combine
//! (residual + shared + the routed experts' weighted sum, in a fixed order). From the model config,
//! the TP degree, the step's rows and the CTA count this makes the task graph (`moe::layout`),
//! places it on the CTAs, checks it, and generates the fused kernel's source (the linear and MoE
//! stages in one switch).
//!
//! The hand-offs: the route task publishes slot j's expert in slot box j (a tagged pair); a slot's
//! expert tasks wait on that box before they load a weight (the choice is made on the device), and
//! a down waits on its slot's gate/up boxes after issuing its first weight loads. The combine
//! waits on the route task (each row's slots and weights, published beside its boxes), the shared
//! down and every slot's down. Where the launch's input rows come from a hand-off, the router, the
//! shared gate/up and every slot's gate/up wait on its boxes.

use super::{fused_source, CtaShape};
use device::KernelSource;
use linear::layout::KIND_EXPERT_TILES;
use mailbox::gpu::Variant;
use mailbox::layout::BoxRange;
use mailbox::{Limits, Placement, Stage, ValidPlacement};
use model::{ModelConfig, WeightFormat};
use moe::layout::{place, MoePlan, MoeShape, MoeStart, BANK_DOWN, BANK_GATE_UP, KIND_COMBINE};

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

    /// The hand-off rules the placement check cannot see (it knows boxes, not what they mean):
    /// every expert task waits on its slot's box, every down on its slot's gate/up, every
    /// combine on the route task, the shared down and every slot's down.
    pub fn check_handoff(&self, placement: &Placement) -> Result<(), MoeGraphError> {
        let waits_on = |t: &mailbox::Task, r: BoxRange| {
            t.inputs()
                .iter()
                .any(|i| i.first <= r.first && r.end() <= i.end())
        };
        for (_, t) in placement.tasks() {
            let missed = |slot: u32, what| MoeGraphError::MissedWait {
                task: t.order,
                slot,
                what,
            };
            if t.kind == KIND_EXPERT_TILES {
                let (bank, slot) = (t.args[0] & 0xffff, t.args[0] >> 16);
                if !waits_on(t, BoxRange::new(self.plan.slots.first + slot, 1)) {
                    return Err(missed(slot, "its slot's box"));
                }
                let gate_up = self.plan.gate_up.get(slot as usize).copied();
                if bank == BANK_DOWN && !gate_up.is_some_and(|g| waits_on(t, g)) {
                    return Err(missed(slot, "its slot's gate/up"));
                }
                if bank != BANK_DOWN && bank != BANK_GATE_UP {
                    return Err(missed(slot, "a bank of the launch"));
                }
            } else if t.kind == KIND_COMBINE {
                for (range, what) in [
                    (self.plan.slots, "the route task"),
                    (self.plan.shared_down, "the shared down"),
                    (self.plan.down, "every slot's down"),
                ] {
                    if !waits_on(t, range) {
                        return Err(missed(0, what));
                    }
                }
            }
        }
        Ok(())
    }
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
