//! What a stage hands the fused kernel's generator: its device headers, the name of its argument
//! struct and of its decoder, and its shape defines. The fused kernel is one task-list loop with a
//! switch by stage over these decoders (ARCHITECTURE.md, "Tasks, teams and placement"); a stage's
//! standalone entry point is the same loop over its decoder alone.

use crate::task::Stage;
use std::collections::BTreeMap;

/// A stage's device side as the fused kernel's generator sees it.
#[derive(Clone, Debug)]
pub struct StageKernel {
    pub stage: Stage,
    /// The header that declares the argument struct and the decoder; it includes the rest.
    pub include: &'static str,
    /// Every header the stage's code may include, by the name it is included as.
    pub headers: Vec<(&'static str, &'static str)>,
    /// The device struct passed by value as the stage's kernel argument (e.g. `idx_args`).
    pub args_type: &'static str,
    /// `template <class Team> bool decoder(const Team&, const mbx_task&, mbx_ctx&, const Args&, u8*)`.
    pub decoder: &'static str,
    /// Shape defines from the stage's layout (`-D` name and value).
    pub defines: BTreeMap<String, String>,
}

/// The `MBX_STAGE_*` name of a stage in `kernels/mailbox.h`.
pub fn stage_macro(stage: Stage) -> &'static str {
    match stage {
        Stage::Synthetic => "MBX_STAGE_SYNTHETIC",
        Stage::Indexer => "MBX_STAGE_INDEXER",
        Stage::Select => "MBX_STAGE_SELECT",
        Stage::Linear => "MBX_STAGE_LINEAR",
        Stage::Moe => "MBX_STAGE_MOE",
        Stage::Mla => "MBX_STAGE_MLA",
        Stage::Head => "MBX_STAGE_HEAD",
    }
}
