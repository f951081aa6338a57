//! Pure shape math of the head stage: its task kinds and descriptors, the (logit, token) pair the
//! argmax hands on, and the shared memory a CTA needs (`kernels/head_tasks.h` holds the device
//! twins).

use mailbox::layout::BoxRange;
use mailbox::{Stage, Task};
use std::ops::Range;

/// `HEAD_KIND_EMBED`: rows of the embedding table by token id.
pub const KIND_EMBED: u32 = Task::kind_of(Stage::Head, 1);
/// `HEAD_KIND_NORM`: a row RMSNorm (`kernels/ops/rows.h`).
pub const KIND_NORM: u32 = Task::kind_of(Stage::Head, 2);
/// `HEAD_KIND_ARGMAX`: each row's largest pair over one vocabulary shard's logits.
pub const KIND_ARGMAX: u32 = Task::kind_of(Stage::Head, 3);
/// `HEAD_KIND_PICK`: each row's token, the largest pair over the shards.
pub const KIND_PICK: u32 = Task::kind_of(Stage::Head, 4);

/// Floats of shared memory the norm's team sum takes (`MONO_ROWS_SCRATCH_FLOATS`).
const ROWS_SCRATCH_FLOATS: u32 = 32;
/// Threads of the smallest wave (NVIDIA's warp); the argmax keeps a u64 a wave.
const SMALLEST_WAVE: u32 = 32;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("a head task over rows {start}..{end}: it needs at least one row")]
    NoRows { start: u32, end: u32 },
    #[error("a CTA of {threads} threads: the head's tasks need whole waves of {SMALLEST_WAVE}")]
    Threads { threads: u32 },
    #[error("{what} = {value} is not a multiple of 8 (the embedding copies 16-byte chunks)")]
    Unaligned { what: &'static str, value: u32 },
    #[error(transparent)]
    Task(#[from] mailbox::task::TooManyInputs),
}

/// Dynamic shared memory a head task needs in a CTA of `threads`: the norm's team-sum scratch or
/// the argmax's u64 a wave, whichever is larger.
pub fn lds_bytes(threads: u32) -> Result<u32, LayoutError> {
    if threads == 0 || threads % SMALLEST_WAVE != 0 {
        return Err(LayoutError::Threads { threads });
    }
    Ok((ROWS_SCRATCH_FLOATS * 4).max(threads / SMALLEST_WAVE * 8))
}

/// A task of `kind` over `rows` of its kind's list entry `op`, at `order`, writing `out` after
/// waiting on every box of `waits`.
pub fn task(
    kind: u32,
    order: u32,
    op: u32,
    rows: Range<u32>,
    out: BoxRange,
    waits: &[BoxRange],
) -> Result<Task, LayoutError> {
    if rows.is_empty() {
        return Err(LayoutError::NoRows {
            start: rows.start,
            end: rows.end,
        });
    }
    Ok(Task::new(
        kind,
        order,
        out,
        waits,
        [op, rows.start, rows.len() as u32],
    )?)
}

/// The embedding copies rows in 16-byte chunks: the hidden size and the output row stride must
/// be multiples of 8 bf16.
pub fn check_embedding(hidden: u32, y_stride: u32) -> Result<(), LayoutError> {
    for (what, value) in [("hidden", hidden), ("the output row stride", y_stride)] {
        if value % 8 != 0 {
            return Err(LayoutError::Unaligned { what, value });
        }
    }
    Ok(())
}

/// The total-order key of an f32's bits: unsigned order of keys is `f32::total_cmp`'s order.
pub fn key(bits: u32) -> u32 {
    if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// The argmax's pair of a logit (as f32) and its token id: of two pairs the larger has the larger
/// logit by `total_cmp`, and of equal logits the lower id; so the argmax over any split of the
/// vocabulary is the largest of the parts' pairs.
pub fn pair_of(logit: f32, id: u32) -> u64 {
    (u64::from(key(logit.to_bits())) << 32) | u64::from(u32::MAX - id)
}

/// The token id of a pair.
pub fn pair_id(pair: u64) -> u32 {
    u32::MAX - pair as u32
}

/// The logit of a pair.
pub fn pair_logit(pair: u64) -> f32 {
    let k = (pair >> 32) as u32;
    f32::from_bits(if k & 0x8000_0000 != 0 {
        k & 0x7fff_ffff
    } else {
        !k
    })
}
