//! A full-indexer launch's selected slots against the reference radix select
//! (`select::reference::select_rows`) of that launch's own scores, both read from the step's
//! arena right after the launch (a later launch rewrites the shared arena).

use device::Buffer;
use select::reference::{select_rows, RowPages, Rows};

use crate::fused::layer::LayerPlan;
use crate::fused::ArenaSlice;
use crate::step::graph::DeviceBytes;
use crate::step::layer::launch::ArenaView;
use crate::step::{Result, StepError};

/// What a full-indexer launch left in the arena: `[rows][stride]` scores and `[rows][k]` lists.
#[derive(Clone, Debug, PartialEq)]
pub struct FrontOutputs {
    pub scores: Vec<f32>,
    pub lists: Vec<i32>,
}

/// `slice`'s bytes as `arena` holds them now.
fn slice_bytes(arena: &Buffer<u8>, slice: ArenaSlice) -> Result<Vec<u8>> {
    Ok(ArenaView { arena, slice }.bytes()?)
}

/// `slice` as `arena` holds it now, in 4-byte words.
pub(super) fn slice_words<T: bytemuck::Pod>(
    arena: &Buffer<u8>,
    slice: ArenaSlice,
) -> Result<Vec<T>> {
    Ok(slice_bytes(arena, slice)?
        .chunks_exact(4)
        .map(bytemuck::pod_read_unaligned)
        .collect())
}

/// The scores and slot lists launch `plan` wrote to `arena`; `None` when it runs no indexer.
pub fn read_front(plan: &LayerPlan, arena: &Buffer<u8>) -> Result<Option<FrontOutputs>> {
    let Some(ix) = &plan.index else {
        return Ok(None);
    };
    let lists = plan.slices.rows_of(plan.slices.slot_lists, plan.rows);
    Ok(Some(FrontOutputs {
        scores: slice_words(arena, ix.scores)?,
        lists: slice_words(arena, lists)?,
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

/// Where the NaN scores of launch `plan` lie, as its arena holds them after the launch: for each
/// row with any, its token and position this step (from the step slices), how many of its scores
/// are NaN and the first and last of their positions, so that a reader tells a NaN key below the
/// row's position (a cache entry or a query gone bad) from one in the masked range past it (a
/// mask that did not reach it). `None` when the launch runs no indexer or no score is NaN.
pub fn nan_report(plan: &LayerPlan, arena: &Buffer<u8>) -> Result<Option<String>> {
    let (Some(out), Some(ix)) = (read_front(plan, arena)?, &plan.index) else {
        return Ok(None);
    };
    let step_words = |slice| slice_words::<u32>(arena, plan.slices.rows_of(slice, plan.rows));
    let positions = step_words(plan.slices.positions)?;
    let tokens = step_words(plan.slices.tokens)?;
    Ok(describe_nans(
        &out.scores,
        ix.front.plan.stride as usize,
        &tokens,
        &positions,
    ))
}

/// [`nan_report`]'s text for `[rows][stride]` scores and each row's token and position.
pub fn describe_nans(
    scores: &[f32],
    stride: usize,
    tokens: &[u32],
    positions: &[u32],
) -> Option<String> {
    let word = |w: &[u32], row: usize| w.get(row).map_or("unknown".into(), |p| p.to_string());
    let lines: Vec<String> = scores
        .chunks(stride.max(1))
        .enumerate()
        .filter_map(|(row, scores)| {
            let nan: Vec<usize> = (0..scores.len()).filter(|&i| scores[i].is_nan()).collect();
            let (first, last) = (nan.first()?, nan.last()?);
            Some(format!(
                "row {row} (token {}) at position {}: {} NaN scores of {}, positions {first}..={last}",
                word(tokens, row),
                word(positions, row),
                nan.len(),
                scores.len()
            ))
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}

/// The first non-finite value of the rows launch `plan` hands on (a layer's output rows, bf16),
/// as its arena holds them after the launch. `None` for the tail (it hands on token ids) and for
/// finite rows.
pub fn non_finite_output(plan: &LayerPlan, arena: &Buffer<u8>) -> Result<Option<String>> {
    if plan.tail.is_some() {
        return Ok(None);
    }
    let bytes = slice_bytes(arena, plan.slices.rows_of(plan.out.data, plan.rows))?;
    Ok(first_non_finite(&bytes, plan.rows as usize))
}

/// In `rows` equal rows of bf16 `bytes`: the row, the column and how many of the row's values
/// are not finite, at the first row that has any.
pub fn first_non_finite(bytes: &[u8], rows: usize) -> Option<String> {
    // A bf16 is the upper half of an f32.
    let values: Vec<f32> = bytes
        .chunks_exact(2)
        .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
        .collect();
    let width = (values.len() / rows.max(1)).max(1);
    values.chunks(width).enumerate().find_map(|(row, v)| {
        let bad: Vec<usize> = (0..v.len()).filter(|&i| !v[i].is_finite()).collect();
        let first = *bad.first()?;
        Some(format!(
            "output row {row}: {} of {} values not finite, the first at column {first} ({})",
            bad.len(),
            v.len(),
            v[first]
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16_bytes(values: &[f32]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect()
    }

    #[test]
    fn finite_rows_pass_and_the_first_bad_value_is_named() {
        let mut v = vec![1.5f32; 2 * 6];
        assert_eq!(first_non_finite(&bf16_bytes(&v), 2), None);
        v[6 + 4] = f32::NAN;
        v[6 + 5] = f32::INFINITY;
        let got = first_non_finite(&bf16_bytes(&v), 2).expect("a NaN and an inf");
        assert!(
            got.starts_with("output row 1: 2 of 6 values not finite, the first at column 4"),
            "{got}"
        );
    }

    #[test]
    fn nan_scores_are_placed_by_row_and_position() {
        let mut scores = vec![0.25f32; 2 * 8];
        scores[5] = f32::NEG_INFINITY;
        assert_eq!(describe_nans(&scores, 8, &[3, 3], &[4, 5]), None);
        scores[8 + 1] = f32::NAN;
        scores[8 + 6] = f32::NAN;
        let got = describe_nans(&scores, 8, &[3, 9], &[4, 5]).expect("two NaNs");
        assert_eq!(
            got,
            "row 1 (token 9) at position 5: 2 NaN scores of 8, positions 1..=6"
        );
    }
}
