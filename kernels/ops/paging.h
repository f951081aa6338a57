// The page table as every stage's kernels read it: the device form of crates/model/src/paging.rs
// (PageTable, PageRow, PageRequest; same fields, same order). One page list holds every request's
// physical pages back to back, request q's in logical order from requests[q].page_offset; a step's
// row r is rows[r], its request and its position. The indexer writes and scores keys through it,
// select maps the positions it lists to cache slots through it: the same three buffers.
//
// A cache slot is page * page_tokens + position % page_tokens; the host keeps every page below
// 2^31 / page_tokens (model::paging::MAX_PAGES), so a slot is a non-negative i32.
#pragma once
#include "prelude.h"

// A row of the step: its request (an index into the requests) and its position; it sees the
// request's keys 0..=position.
struct mono_page_row {
  u32 request;
  u32 position;
};

// A request of the page table. Its rows in a launch that writes their keys (maybe none) are rows
// first_row.. at positions first_position.. (consecutive); its pages start at page_offset.
struct mono_page_request {
  u32 first_row;
  u32 n_rows;
  u32 first_position;
  u32 page_offset;
};

// Row `row`'s pages, its request's logical page p at [p]: two loads a row (its request, the
// request's offset), none a key.
MONO_DEV const u32* mono_row_pages(const u32* page_list, const mono_page_row* rows, const mono_page_request* requests,
                                   u32 row) {
  return page_list + requests[rows[row].request].page_offset;
}

// The cache slot of `position` of a request whose pages are `pages`.
MONO_DEV i32 mono_page_slot(const u32* pages, u32 position, u32 page_tokens) {
  return (i32)(pages[position / page_tokens] * page_tokens + position % page_tokens);
}
