//! The step slices: the part of the activation arena every launch of a step shares, reserved
//! first, in one order, by every launch's graph, so that they sit at the same offsets in all of
//! them (the module doc of [`super`] states the contract).

use super::super::graph::{ArenaSlice, GraphError, LaunchGraph};
use model::ModelConfig;

/// The sizes the step slices are reserved for: the most a step of this build may have, so that
/// the offsets do not move with the batch (a captured step replays with other batches of the
/// same build).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepDims {
    pub max_rows: u32,
    pub max_requests: u32,
    /// Width of the page table: the most pages a request may have.
    pub pages_per_request: u32,
    pub hidden: u32,
    /// `qk_rope_head_dim`: the MLA's and the indexer's ropes (one `rope_theta`) share `inv_freq`.
    pub rope: u32,
    /// `index_topk`: entries of each row's slot list.
    pub topk: u32,
}

impl StepDims {
    /// The dims of `cfg` for steps of at most `max_rows` rows in `max_requests` requests of at most
    /// `pages_per_request` pages.
    pub fn new(
        cfg: &ModelConfig,
        max_rows: u32,
        max_requests: u32,
        pages_per_request: u32,
    ) -> StepDims {
        StepDims {
            max_rows,
            max_requests,
            pages_per_request,
            hidden: cfg.hidden_size as u32,
            rope: cfg.qk_rope_head_dim as u32,
            topk: cfg.index_topk as u32,
        }
    }
}

/// Bad step dims, or a graph that already has arena slices.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SliceError {
    #[error("the step slices go first in a launch's arena; this graph already holds {0} bytes")]
    NotFirst(u64),
    #[error("step dims: {0}")]
    Dims(String),
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// The step slices of a launch's arena (byte offsets from its start; [`StepSlices::NAMES`] are
/// their names in the graph's arena layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepSlices {
    pub dims: StepDims,
    /// `[max_rows]` u32: each row's token id (the host's, or the previous step's tail's pick).
    pub tokens: ArenaSlice,
    /// `[max_rows]` u32: each row's position.
    pub positions: ArenaSlice,
    /// `[max_rows]` u32: the cache slot (`page * PAGE_TOKENS + offset`) of each row's new token.
    pub new_slots: ArenaSlice,
    /// `[rope / 2]` f64: `rope_theta^(-2i / rope)`.
    pub inv_freq: ArenaSlice,
    /// `[max_requests][pages_per_request]` u32: each request's physical cache pages by logical
    /// page, unused entries `u32::MAX` (-1 as the host's i32 table writes them); one table for the
    /// MLA cache and the index-key cache, whose pages share their numbers. A request's row of it
    /// starts at `request * pages_per_request` (the indexer's `page_offset`).
    pub page_table: ArenaSlice,
    /// `[max_rows][topk]` i32: each row's selected cache slots, -1 padded. Written by a
    /// full-indexer layer's select, read by its attention and by the shared-indexer layers after it.
    pub slot_lists: ArenaSlice,
    /// `[2][max_rows][hidden]` bf16: the residual stream, ping-pong (layer i reads `hidden[i % 2]`,
    /// writes `hidden[(i + 1) % 2]`).
    pub hidden: [ArenaSlice; 2],
}

impl StepSlices {
    /// The slices' names in the arena layout, in reservation order.
    pub const NAMES: [&'static str; 8] = [
        "step_tokens",
        "step_positions",
        "step_new_slots",
        "step_inv_freq",
        "step_page_table",
        "step_slot_lists",
        "step_hidden_0",
        "step_hidden_1",
    ];

    /// Reserves the step slices in `g`, which must hold no arena slice yet.
    pub fn reserve(g: &mut LaunchGraph, dims: StepDims) -> Result<StepSlices, SliceError> {
        if g.arena_bytes() != 0 {
            return Err(SliceError::NotFirst(g.arena_bytes()));
        }
        if dims.max_rows == 0
            || dims.max_requests == 0
            || dims.max_requests > dims.max_rows
            || dims.pages_per_request == 0
            || dims.hidden == 0
            || dims.rope == 0
            || dims.rope % 2 != 0
            || dims.topk == 0
        {
            return Err(SliceError::Dims(format!("{dims:?}")));
        }
        let rows = u64::from(dims.max_rows);
        let [tokens, positions, new_slots, inv_freq, page_table, slot_lists, h0, h1] = Self::NAMES;
        let page_entries = u64::from(dims.max_requests) * u64::from(dims.pages_per_request);
        let hidden_bytes = rows * u64::from(dims.hidden) * 2;
        Ok(StepSlices {
            dims,
            tokens: g.arena(tokens, rows * 4)?,
            positions: g.arena(positions, rows * 4)?,
            new_slots: g.arena(new_slots, rows * 4)?,
            inv_freq: g.arena(inv_freq, u64::from(dims.rope / 2) * 8)?,
            page_table: g.arena(page_table, page_entries * 4)?,
            slot_lists: g.arena(slot_lists, rows * u64::from(dims.topk) * 4)?,
            hidden: [g.arena(h0, hidden_bytes)?, g.arena(h1, hidden_bytes)?],
        })
    }

    /// The residual stream layer `layer` reads: `hidden[layer % 2]`.
    pub fn hidden_in(&self, layer: usize) -> ArenaSlice {
        self.hidden[layer % 2]
    }

    /// The residual stream layer `layer` writes: `hidden[(layer + 1) % 2]` (the tail of a model of
    /// `layers` layers reads `hidden_in(layers)`).
    pub fn hidden_out(&self, layer: usize) -> ArenaSlice {
        self.hidden[(layer + 1) % 2]
    }

    /// The first `rows` rows of a `[max_rows][...]` slice.
    pub fn rows_of(&self, slice: ArenaSlice, rows: u32) -> ArenaSlice {
        let per_row = slice.bytes / u64::from(self.dims.max_rows);
        ArenaSlice {
            offset: slice.offset,
            bytes: per_row * u64::from(rows.min(self.dims.max_rows)),
        }
    }

    /// Row `row`'s slot list: `topk` i32 from `slot_lists.offset + row * topk * 4`.
    pub fn slot_list(&self, row: u32) -> ArenaSlice {
        let bytes = u64::from(self.dims.topk) * 4;
        ArenaSlice {
            offset: self.slot_lists.offset + u64::from(row) * bytes,
            bytes,
        }
    }

    /// One past the last byte of the step slices: where a launch's own slices start.
    pub fn end(&self) -> u64 {
        self.hidden[1].offset + self.hidden[1].bytes
    }
}
