//! The paged caches' contract, the one copy the indexer, select and MLA read: the page size, the
//! page table (each request's physical pages in logical order), the cache slot of a position, and
//! the shape of the score rows the indexer hands to select, and the form the kernels read
//! (`kernels/ops/paging.h`: the page list, [`PageRequest`] and [`PageRow`]).
//!
//! A cache slot is `page * PAGE_TOKENS + position % PAGE_TOKENS`: the index-key cache's token
//! (its page and place in the page), what select lists for a row, and the MLA record attention
//! reads and the cache write fills. Slots travel as `i32` (select pads its lists with -1), so a
//! table's pages must keep every slot below 2^31.

use crate::error::{bad_arg, Result};
use bytemuck::{Pod, Zeroable};

/// Tokens of one cache page (DeepGEMM's and SGLang's page size; spec §3.5). Kernels get it as a
/// define generated from this constant.
pub const PAGE_TOKENS: u32 = 64;

/// The most pages a table may name: page ids below this keep every slot a non-negative `i32`.
pub const MAX_PAGES: u32 = (1 << 31) / PAGE_TOKENS;

/// Logical pages needed to hold tokens 0..=position.
pub fn pages_through(position: u32) -> u32 {
    position / PAGE_TOKENS + 1
}

/// The stride of score rows whose longest row has `keys` keys (positions 0..keys): a whole number
/// of pages, at least one. Row r's scores are `scores[r * stride..][..stride]`, its keys the first
/// of them, and the entries past its keys are `-inf` (masked).
pub fn score_stride(keys: u32) -> u32 {
    keys.div_ceil(PAGE_TOKENS).max(1) * PAGE_TOKENS
}

/// A row of a step as the kernels read it (`mono_page_row`): its request (an index into the page
/// table) and its position. The row sees keys 0..=position.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct PageRow {
    pub request: u32,
    pub position: u32,
}

/// A request of the page table as the kernels read it (`mono_page_request`). Its rows in a launch
/// that writes their keys (maybe none) are rows first_row.., at positions first_position..
/// (consecutive); its pages start at `page_offset` in the page list ([`PageTable::offset`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct PageRequest {
    pub first_row: u32,
    pub n_rows: u32,
    pub first_position: u32,
    /// Where the request's pages start in the page list.
    pub page_offset: u32,
}

/// Physical page of each logical page, per request, flattened as the device reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageTable {
    /// Request i's pages are `pages[offsets[i]..offsets[i + 1]]`.
    offsets: Vec<u32>,
    pages: Vec<u32>,
}

impl PageTable {
    /// One list of physical pages per request; every page id below [`MAX_PAGES`].
    pub fn new(per_request: &[Vec<u32>]) -> Result<Self> {
        let mut table = PageTable {
            offsets: vec![0],
            pages: Vec::new(),
        };
        for (request, pages) in per_request.iter().enumerate() {
            if let Some((logical, &page)) = pages.iter().enumerate().find(|(_, &p)| p >= MAX_PAGES)
            {
                return Err(bad_arg(
                    "page table",
                    format!(
                        "request {request}: logical page {logical} is page {page}; slots must fit \
                         an i32, so pages are below {MAX_PAGES}"
                    ),
                ));
            }
            table.pages.extend_from_slice(pages);
            let end = u32::try_from(table.pages.len())
                .map_err(|_| bad_arg("page table", "more than 2^32 pages"))?;
            table.offsets.push(end);
        }
        Ok(table)
    }

    /// Requests `0..count`, each on `pages` consecutive pages from page 0: request i's slots are
    /// `i * pages * PAGE_TOKENS ..`. For tests and benches whose caches are not shuffled.
    pub fn contiguous(count: u32, pages: u32) -> Result<Self> {
        let per_request: Vec<Vec<u32>> = (0..count)
            .map(|i| (i * pages..(i + 1) * pages).collect())
            .collect();
        PageTable::new(&per_request)
    }

    pub fn requests(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Request `request`'s pages (empty past the last request).
    pub fn pages(&self, request: usize) -> &[u32] {
        match (self.offsets.get(request), self.offsets.get(request + 1)) {
            (Some(&start), Some(&end)) => &self.pages[start as usize..end as usize],
            _ => &[],
        }
    }

    /// Request i's first entry in [`PageTable::flat`].
    pub fn offset(&self, request: usize) -> u32 {
        self.offsets[request]
    }

    /// Every request's entry of the kernels' request list, with its page offset and no rows
    /// (a launch that writes keys fills in its rows).
    pub fn device_requests(&self) -> Vec<PageRequest> {
        (0..self.requests())
            .map(|r| PageRequest {
                page_offset: self.offset(r),
                ..PageRequest::default()
            })
            .collect()
    }

    /// Every request's pages back to back (the device's page list).
    pub fn flat(&self) -> &[u32] {
        &self.pages
    }

    /// (physical page, place in the page) of token `position` of `request`, if its page is in the
    /// table.
    pub fn locate(&self, request: usize, position: u32) -> Option<(u32, u32)> {
        let page = *self.pages(request).get((position / PAGE_TOKENS) as usize)?;
        Some((page, position % PAGE_TOKENS))
    }

    /// The cache slot of token `position` of `request`, if its page is in the table.
    pub fn slot(&self, request: usize, position: u32) -> Option<i32> {
        let (page, place) = self.locate(request, position)?;
        // MAX_PAGES keeps this below 2^31.
        Some((page * PAGE_TOKENS + place) as i32)
    }
}
