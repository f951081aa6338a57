//! The task descriptor: what one CTA of a persistent launch runs, in the byte layout the device
//! reads (`struct mbx_task` in `kernels/mailbox.h`).

use crate::layout::BoxRange;

/// The stage a task kind belongs to: the high bits of [`Task::kind`] (`MBX_STAGE_*` in
/// `kernels/mailbox.h`). The fused kernel switches on the stage, the stage's decoder on its own kind
/// (the low [`STAGE_SHIFT`] bits).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    Synthetic = 0,
    Indexer = 1,
    Select = 2,
    Linear = 3,
    Moe = 4,
    Mla = 5,
    Head = 6,
}

impl Stage {
    pub const ALL: [Stage; 7] = [
        Stage::Synthetic,
        Stage::Indexer,
        Stage::Select,
        Stage::Linear,
        Stage::Moe,
        Stage::Mla,
        Stage::Head,
    ];

    /// The stage of a kind word's stage bits ([`Task::stage_bits`]), if any stage has them.
    pub fn from_bits(bits: u32) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| *s as u32 == bits)
    }

    /// The stage's name in traces and reports.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Synthetic => "synthetic",
            Stage::Indexer => "indexer",
            Stage::Select => "select",
            Stage::Linear => "linear",
            Stage::Moe => "moe",
            Stage::Mla => "mla",
            Stage::Head => "head",
        }
    }
}

/// Bits of a kind that are the stage's own.
pub const STAGE_SHIFT: u32 = 8;

/// Input ranges a task may wait on.
pub const MAX_INPUTS: usize = 4;
/// Kind-specific 32-bit arguments.
pub const TASK_ARGS: usize = 3;

/// One task: its kind (the device dispatches on it), its rank in the launch's global topological
/// order, the boxes it writes, the box ranges it waits on (in order), and kind-specific arguments.
/// 64 bytes, all 32-bit fields, so the host and device layouts agree without padding rules.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Task {
    pub kind: u32,
    /// Rank in the launch's global topological order. Tasks sharing a rank form a gang: they may
    /// wait on each other and sit on distinct CTAs (`placement` has the rule).
    pub order: u32,
    /// How many of `inputs` are used.
    pub n_inputs: u32,
    pub args: [u32; TASK_ARGS],
    /// The boxes this task writes (possibly none).
    pub out: BoxRange,
    pub inputs: [BoxRange; MAX_INPUTS],
}

const _: () = assert!(std::mem::size_of::<Task>() == 64);

/// A task with more input ranges than [`MAX_INPUTS`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("task {order} waits on {inputs} ranges; a task holds at most {MAX_INPUTS}")]
pub struct TooManyInputs {
    pub order: u32,
    pub inputs: usize,
}

impl Task {
    /// The kind word of a stage's own kind `own` (below 2^[`STAGE_SHIFT`]).
    pub const fn kind_of(stage: Stage, own: u32) -> u32 {
        assert!(own < 1 << STAGE_SHIFT);
        ((stage as u32) << STAGE_SHIFT) | own
    }

    /// The stage bits of this task's kind.
    pub fn stage_bits(&self) -> u32 {
        self.kind >> STAGE_SHIFT
    }

    pub fn new(
        kind: u32,
        order: u32,
        out: BoxRange,
        inputs: &[BoxRange],
        args: [u32; TASK_ARGS],
    ) -> Result<Task, TooManyInputs> {
        if inputs.len() > MAX_INPUTS {
            return Err(TooManyInputs {
                order,
                inputs: inputs.len(),
            });
        }
        let mut task = Task {
            kind,
            order,
            n_inputs: inputs.len() as u32,
            args,
            out,
            inputs: [BoxRange::default(); MAX_INPUTS],
        };
        task.inputs[..inputs.len()].copy_from_slice(inputs);
        Ok(task)
    }

    /// The input ranges in use. A corrupt `n_inputs` is clamped here; the placement check reports it.
    pub fn inputs(&self) -> &[BoxRange] {
        &self.inputs[..(self.n_inputs as usize).min(MAX_INPUTS)]
    }
}
