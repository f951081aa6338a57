//! A full-indexer layer's front half in its launch: `idx_args` and `sel_args` from the part's
//! plan (`fused::front::FrontPart`), its plan tables uploaded once, and the addresses of what it
//! reads and writes (the projections and scores in the arena, each row's list in the step's slot
//! lists, the layer's index-key cache), as `fused::front_gpu` binds a front half of its own.

use device::{Buffer, Device};
use indexer::gpu::{RunTask, StageArgs};
use indexer::reference::IndexerDims;
use select::gpu::SelArgs;

use crate::fused::front::FrontPart;
use crate::step::Result;

/// Device addresses of what the front half reads and writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrontAt {
    /// `[rows][head_dim]` bf16.
    pub key_proj: u64,
    /// `[rows][heads * head_dim]` bf16.
    pub query_proj: u64,
    /// `[rows][heads]` f32.
    pub gates: u64,
    /// `[head_dim]` f32 each.
    pub norm_weight: u64,
    pub norm_bias: u64,
    /// `[rope / 2]` f64.
    pub inv_freq: u64,
    /// `[rows]` u32: the rows' positions this step (the step slice the feed moves on): the
    /// indexer reads them on the device, so the task lists hold for every position the pages
    /// allow.
    pub positions: u64,
    /// The layer's index-key cache.
    pub cache: u64,
    /// `[rows][stride]` f32.
    pub scores: u64,
    /// `[rows][k]` i32: the lists (the step's slot lists).
    pub lists: u64,
    /// `[rows][select::gpu::FLAG_NAMES.len()]` u32.
    pub flags: u64,
}

/// The front half's arguments and the plan tables they point to.
pub struct FrontBinding {
    pub idx: StageArgs,
    pub sel: SelArgs,
    _tables: Vec<Buffer<u8>>,
}

fn upload<T: bytemuck::Pod>(dev: &Device, v: &[T]) -> Result<Buffer<u8>> {
    let bytes: &[u8] = bytemuck::cast_slice(v);
    Ok(dev.upload(if bytes.is_empty() { &[0u8] } else { bytes })?)
}

/// `part`'s arguments (with `dims` the indexer's widths) over the addresses `at`.
pub fn bind_front(
    dev: &Device,
    part: &FrontPart,
    dims: &IndexerDims,
    at: FrontAt,
) -> Result<FrontBinding> {
    let plan = &part.plan;
    // One page table for the indexer and select (`kernels/ops/paging.h`): the page list, each
    // row's request and each request's offset into the list.
    let tables = vec![
        upload(dev, &plan.rows)?,
        upload(dev, &plan.requests)?,
        upload(dev, &RunTask::of(plan, &part.pages))?,
        upload(dev, part.pages.flat())?,
    ];
    let (key, query, run) = (
        part.boxes.indexer.key,
        part.boxes.indexer.query,
        part.boxes.indexer.run,
    );
    let idx = StageArgs {
        key_proj: at.key_proj,
        norm_weight: at.norm_weight,
        norm_bias: at.norm_bias,
        query_proj: at.query_proj,
        gates: at.gates,
        inv_freq: at.inv_freq,
        rows: tables[0].device_ptr(),
        positions: at.positions,
        requests: tables[1].device_ptr(),
        runs: tables[2].device_ptr(),
        page_list: tables[3].device_ptr(),
        cache_read: at.cache,
        cache_write: at.cache,
        scores: at.scores,
        trace: 0,
        stride: plan.stride,
        key_box_offset: key.offset(),
        key_box_stride: key.stride(),
        query_box_offset: query.offset(),
        query_box_stride: query.stride(),
        run_box_offset: run.offset(),
        run_box_stride: run.stride(),
        weight_scale: dims.weight_scale() as f32,
    };
    let sel = SelArgs {
        scores: at.scores,
        page_list: tables[3].device_ptr(),
        page_rows: tables[0].device_ptr(),
        page_requests: tables[1].device_ptr(),
        out: at.lists,
        flags: at.flags,
        trace: 0,
        stride: plan.stride,
        hist_offset: part.boxes.select.hist.offset(),
        cand_offset: part.boxes.select.cand.offset(),
        cand_stride: part.boxes.select.cand.stride(),
        in_stride: part.boxes.indexer.run.stride(),
        gang_stride: part.boxes.select.gang.stride(),
    };
    Ok(FrontBinding {
        idx,
        sel,
        _tables: tables,
    })
}
