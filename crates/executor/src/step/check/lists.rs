//! A full-indexer launch's selected slots against the reference radix select
//! (`select::reference::select_rows`) of that launch's own scores, both read from the step's
//! arena right after the launch (a later launch rewrites the shared arena).

use device::Buffer;
use select::reference::{select_rows, RowPages, Rows};

use crate::fused::layer::LayerPlan;
use crate::step::{Result, StepError};

/// What a full-indexer launch left in the arena: `[rows][stride]` scores and `[rows][k]` lists.
#[derive(Clone, Debug, PartialEq)]
pub struct FrontOutputs {
    pub scores: Vec<f32>,
    pub lists: Vec<i32>,
}

fn words<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
    bytes
        .chunks_exact(4)
        .map(|b| bytemuck::pod_read_unaligned(b))
        .collect()
}

/// The scores and slot lists launch `plan` wrote to `arena`; `None` when it runs no indexer.
pub fn read_front(plan: &LayerPlan, arena: &Buffer<u8>) -> Result<Option<FrontOutputs>> {
    let Some(ix) = &plan.index else {
        return Ok(None);
    };
    let lists = plan.slices.rows_of(plan.slices.slot_lists, plan.rows);
    let range = |s: crate::fused::ArenaSlice| s.offset as usize..(s.offset + s.bytes) as usize;
    Ok(Some(FrontOutputs {
        scores: words(&arena.download_range(range(ix.scores))?),
        lists: words(&arena.download_range(range(lists))?),
    }))
}

/// Where a launch's lists first differ from the reference select of its scores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListMismatch {
    pub row: usize,
    /// Entry of the row's list.
    pub entry: usize,
    pub got: i32,
    pub want: i32,
}

impl std::fmt::Display for ListMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "row {} entry {}: slot {}, the reference select of the launch's scores {}",
            self.row, self.entry, self.got, self.want
        )
    }
}

/// The reference select's lists (cache slots, `[rows][k]`) of `scores` as launch `plan` planned
/// its rows: each row's keys, k, and its request's pages.
pub fn reference_lists(plan: &LayerPlan, scores: &[f32]) -> Result<Vec<i32>> {
    let ix = plan
        .index
        .as_ref()
        .ok_or_else(|| StepError::Invalid("the launch runs no indexer".into()))?;
    let front = &ix.front;
    let requests: Vec<u32> = front.plan.rows.iter().map(|r| r.request).collect();
    let rows = Rows {
        scores,
        stride: front.plan.stride as usize,
        lens: &front.lens,
    };
    let pages = RowPages {
        table: &front.pages,
        requests: &requests,
    };
    select_rows(&rows, front.top, Some(&pages))
        .map_err(|e| StepError::Invalid(format!("the reference select: {e}")))
}

/// Whether `out`'s lists are the reference select of `out`'s scores: the first difference.
pub fn check_lists(plan: &LayerPlan, out: &FrontOutputs) -> Result<Option<ListMismatch>> {
    let want = reference_lists(plan, &out.scores)?;
    if want.len() != out.lists.len() {
        return Err(StepError::Invalid(format!(
            "{} list entries read; the reference select gives {}",
            out.lists.len(),
            want.len()
        )));
    }
    let k = plan.slices.dims.topk as usize;
    Ok(want
        .iter()
        .zip(&out.lists)
        .position(|(w, g)| w != g)
        .map(|i| ListMismatch {
            row: i / k,
            entry: i % k,
            got: out.lists[i],
            want: want[i],
        }))
}
