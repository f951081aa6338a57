// The last node of a step graph: greedy decoding without the host. Every request's rows move on by
// the request's row count, take the argmax of the request's last row as their token (with several
// rows a request and no draft model, the drafts are that token repeated), and get the cache slot
// of their new position from the request's page table (-1 past its pages: the host adds pages
// between replays).
#include "prelude.h"

MONO_KERNEL void step_feed(const i32* argmax, i32* tokens, i32* positions, i32* slots,
                           const i32* row_request, const i32* request_first, const i32* request_rows,
                           const i32* page_table, u32 pages_per_request, u32 page_tokens, u32 rows) {
  const u32 r = mono_block() * mono_block_dim() + mono_thread();
  if (r >= rows) return;
  const i32 q = row_request[r];
  const i32 n = request_rows[q];
  const i32 last = request_first[q] + n - 1;
  const i32 position = positions[r] + n;
  tokens[r] = argmax[last];
  positions[r] = position;
  const u32 page = (u32)position / page_tokens;
  const i32 id = page < pages_per_request ? page_table[(u32)q * pages_per_request + page] : -1;
  slots[r] = id < 0 ? -1 : id * (i32)page_tokens + position % (i32)page_tokens;
}
