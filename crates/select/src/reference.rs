//! The contract of the select stage, written to be read rather than to be fast. Every
//! kernel's list must equal [`select_rows`] entry by entry.
//!
//! - A score's radix key maps its bits to a `u32` that orders like the score: negative scores have
//!   all bits flipped, others get the sign bit set. -0.0 sits just below +0.0.
//! - NaN is an error: this reference refuses the row; the kernels flag it (`SEL_FLAG_NAN`, an
//!   error naming the row on the host) and their list for that row means nothing.
//! - A row's keys are its first `len` scores; positions past `len` are not keys at all.
//! - `-inf` is a masked score: a masked position is never selected.
//! - A row with fewer than k unmasked keys (a row of at most k keys among them) lists its unmasked
//!   keys in position order, padded with -1.
//! - Otherwise T is the k-th largest key. Its prefix P is 12 bits long if the row's keys sharing
//!   T's top 12 bits fit in the candidate room ([`TopK::room`], 2k), else 24 bits if those sharing
//!   its top 24 bits fit, else all 32 bits.
//! - The list: every key whose prefix is above P, by position; then the keys with prefix P that are
//!   above T, by position; then the keys equal to T, by position, until k entries.
//! - Entries are positions, or cache slots of the row's request in the shared page table
//!   (`model::paging`: `page * PAGE_TOKENS + pos % PAGE_TOKENS`, [`RowPages`]).
//!
//! [`sorted_top_k`] is the second, simpler reference: sort by key descending, position ascending.

use model::paging::{PageRequest, PageRow, PageTable, PAGE_TOKENS};

use crate::layout::TopK;

/// The order-preserving map of a score's bits to `u32`.
pub fn radix_key(score: f32) -> u32 {
    let bits = score.to_bits();
    if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// A masked score (`-inf`); its key is the smallest of any non-NaN score.
pub const MASKED: f32 = f32::NEG_INFINITY;

/// Whether a score is masked.
pub fn is_masked(score: f32) -> bool {
    score == MASKED
}

/// The score whose radix key is `key` (the inverse of [`radix_key`]).
pub fn score_of_key(key: u32) -> f32 {
    f32::from_bits(if key & 0x8000_0000 != 0 {
        key & 0x7fff_ffff
    } else {
        !key
    })
}

/// A NaN among a row's keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the score at position {pos} is NaN ({bits:#010x}); NaN is not a valid score")]
pub struct NanScore {
    pub pos: u32,
    pub bits: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("row {row}: {source}")]
    Nan { row: usize, source: NanScore },
    #[error("{scores} scores cannot hold {rows} rows of stride {stride}")]
    ScoresShape {
        scores: usize,
        rows: usize,
        stride: usize,
    },
    #[error("row {row} has {len} keys, more than its stride {stride}")]
    LengthPastStride { row: usize, len: u32, stride: usize },
    #[error("row {row} has no request in the page table ({rows} rows are mapped to requests)")]
    RowWithoutRequest { row: usize, rows: usize },
    #[error(
        "row {row}: position {pos} is in logical page {page}; request {request} has {have} pages"
    )]
    PagePastRow {
        row: usize,
        pos: u32,
        page: u32,
        request: u32,
        have: usize,
    },
}

/// Where the digit descent of a row stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Threshold {
    /// T: the k-th largest key.
    pub key: u32,
    /// Length of the prefix P: 12, 24 or 32.
    pub prefix_bits: u32,
    /// Keys whose prefix is above P (all of them are selected).
    pub above: u32,
    /// Keys sharing P (the candidates the row's first slice resolves, unless P is 32 bits).
    pub sharing: u32,
}

impl Threshold {
    pub fn prefix(&self) -> u32 {
        self.key >> (32 - self.prefix_bits)
    }
}

/// One row's list, by position: `k` entries, -1 past the selected ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowSelection {
    pub list: Vec<i32>,
    /// `None` for a row with fewer than k unmasked keys, or at most k keys (every unmasked key is
    /// selected).
    pub threshold: Option<Threshold>,
}

fn keys_of(scores: &[f32]) -> Result<Vec<u32>, NanScore> {
    scores
        .iter()
        .enumerate()
        .map(|(pos, s)| {
            if s.is_nan() {
                Err(NanScore {
                    pos: pos as u32,
                    bits: s.to_bits(),
                })
            } else {
                Ok(radix_key(*s))
            }
        })
        .collect()
}

/// The k-th largest key and the prefix the descent stops at; `None` when fewer than k keys are
/// unmasked, or the row has at most k keys.
pub fn threshold(keys: &[u32], top: TopK) -> Option<Threshold> {
    let k = top.k() as usize;
    let masked = radix_key(MASKED);
    if keys.len() <= k || keys.iter().filter(|&&x| x != masked).count() < k {
        return None;
    }
    let mut sorted = keys.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let t = sorted[k - 1];
    let sharing = |bits: u32| {
        keys.iter()
            .filter(|&&x| x >> (32 - bits) == t >> (32 - bits))
            .count() as u32
    };
    let room = top.room();
    let prefix_bits = [12, 24]
        .into_iter()
        .find(|&bits| sharing(bits) <= room)
        .unwrap_or(32);
    let above = keys
        .iter()
        .filter(|&&x| x >> (32 - prefix_bits) > t >> (32 - prefix_bits))
        .count() as u32;
    Some(Threshold {
        key: t,
        prefix_bits,
        above,
        sharing: sharing(prefix_bits),
    })
}

/// The list of one row whose keys are `scores` (its first `len` scores, no more).
pub fn select_row(scores: &[f32], top: TopK) -> Result<RowSelection, NanScore> {
    let k = top.k() as usize;
    let keys = keys_of(scores)?;
    let Some(th) = threshold(&keys, top) else {
        let mut list: Vec<i32> = (0..scores.len())
            .filter(|&pos| !is_masked(scores[pos]))
            .map(|pos| pos as i32)
            .collect();
        list.resize(k, -1);
        return Ok(RowSelection {
            list,
            threshold: None,
        });
    };
    let shift = 32 - th.prefix_bits;
    let (t, p) = (th.key, th.prefix());
    let positions = |keep: &dyn Fn(u32) -> bool| {
        keys.iter()
            .enumerate()
            .filter(move |(_, &x)| keep(x))
            .map(|(pos, _)| pos as i32)
            .collect::<Vec<_>>()
    };
    let mut list = positions(&|x| x >> shift > p);
    list.extend(positions(&|x| x >> shift == p && x > t));
    list.extend(positions(&|x| x == t));
    list.truncate(k);
    Ok(RowSelection {
        list,
        threshold: Some(th),
    })
}

/// Score rows `[rows, stride]` with per-row lengths.
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    pub scores: &'a [f32],
    pub stride: usize,
    pub lens: &'a [u32],
}

impl<'a> Rows<'a> {
    pub fn count(&self) -> usize {
        self.lens.len()
    }

    /// Checks the shape: every row inside `scores`, no row longer than the stride.
    pub fn check(&self) -> Result<(), SelectError> {
        let need = self.count().checked_mul(self.stride);
        if need.is_none_or(|n| n > self.scores.len()) {
            return Err(SelectError::ScoresShape {
                scores: self.scores.len(),
                rows: self.count(),
                stride: self.stride,
            });
        }
        match self
            .lens
            .iter()
            .enumerate()
            .find(|(_, &len)| len as usize > self.stride)
        {
            Some((row, &len)) => Err(SelectError::LengthPastStride {
                row,
                len,
                stride: self.stride,
            }),
            None => Ok(()),
        }
    }

    /// The keys of `row` (call [`Rows::check`] first).
    pub fn row(&self, row: usize) -> &'a [f32] {
        let start = row * self.stride;
        &self.scores[start..start + self.lens[row] as usize]
    }
}

/// The page table as score rows see it: row r's positions are those of request `requests[r]` of
/// `table` (the rows of one request, MTP verify rows, share its pages).
#[derive(Clone, Copy, Debug)]
pub struct RowPages<'a> {
    pub table: &'a PageTable,
    pub requests: &'a [u32],
}

impl RowPages<'_> {
    fn request(&self, row: usize) -> Result<u32, SelectError> {
        self.requests
            .get(row)
            .copied()
            .ok_or(SelectError::RowWithoutRequest {
                row,
                rows: self.requests.len(),
            })
    }

    /// The cache slot of `pos` in `row` ([`PageTable::slot`] of the row's request).
    pub fn slot(&self, row: usize, pos: u32) -> Result<i32, SelectError> {
        let request = self.request(row)?;
        self.table
            .slot(request as usize, pos)
            .ok_or(SelectError::PagePastRow {
                row,
                pos,
                page: pos / PAGE_TOKENS,
                request,
                have: self.table.pages(request as usize).len(),
            })
    }

    /// Checks that every row of `lens` has its request's pages for all its keys.
    pub fn check(&self, lens: &[u32]) -> Result<(), SelectError> {
        for (row, &len) in lens.iter().enumerate() {
            if len > 0 {
                self.slot(row, len - 1)?;
            }
        }
        Ok(())
    }

    /// The page table in the kernels' form for rows of `lens` keys, after [`RowPages::check`]:
    /// the indexer's form (`kernels/ops/paging.h`), which select reads as `sel_args::page_list`,
    /// `page_rows` and `page_requests`. A row's position is its last key's; select reads only
    /// its request.
    pub fn device_form(&self, lens: &[u32]) -> Result<DevicePages, SelectError> {
        self.check(lens)?;
        let rows = lens
            .iter()
            .enumerate()
            .map(|(row, &len)| {
                Ok(PageRow {
                    request: self.request(row)?,
                    position: len.saturating_sub(1),
                })
            })
            .collect::<Result<_, SelectError>>()?;
        Ok(DevicePages {
            // A buffer is never empty: a table with no pages still has one (never read) entry.
            list: if self.table.flat().is_empty() {
                vec![0]
            } else {
                self.table.flat().to_vec()
            },
            requests: self.table.device_requests(),
            rows,
        })
    }
}

/// The page table as the kernels read it (`kernels/ops/paging.h`): every request's pages back to
/// back, each request's offset into them, each row's request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevicePages {
    pub list: Vec<u32>,
    pub requests: Vec<PageRequest>,
    pub rows: Vec<PageRow>,
}

/// Maps a row's list of positions to cache slots (-1 stays -1).
pub fn to_slots(list: &mut [i32], row: usize, pages: &RowPages) -> Result<(), SelectError> {
    for entry in list.iter_mut().filter(|e| **e >= 0) {
        *entry = pages.slot(row, *entry as u32)?;
    }
    Ok(())
}

/// Every row's list, `[rows, k]`, as positions or (with `pages`) cache slots.
pub fn select_rows(
    rows: &Rows,
    top: TopK,
    pages: Option<&RowPages>,
) -> Result<Vec<i32>, SelectError> {
    rows.check()?;
    let mut out = Vec::with_capacity(rows.count() * top.k() as usize);
    for row in 0..rows.count() {
        let mut sel =
            select_row(rows.row(row), top).map_err(|source| SelectError::Nan { row, source })?;
        if let Some(pages) = pages {
            to_slots(&mut sel.list, row, pages)?;
        }
        out.extend(sel.list);
    }
    Ok(out)
}

/// The second reference: the positions of the k largest unmasked keys, ties to the lower position,
/// sorted by key descending then position ascending. What any exact top-k must select, in some
/// order.
pub fn sorted_top_k(scores: &[f32], top: TopK) -> Result<Vec<i32>, NanScore> {
    let keys = keys_of(scores)?;
    let mut order: Vec<u32> = (0..keys.len() as u32)
        .filter(|&pos| !is_masked(scores[pos as usize]))
        .collect();
    order.sort_by(|&a, &b| keys[b as usize].cmp(&keys[a as usize]).then(a.cmp(&b)));
    order.truncate(top.k() as usize);
    Ok(order.into_iter().map(|p| p as i32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn top(k: u32) -> TopK {
        TopK::new(k).unwrap()
    }

    #[test]
    fn keys_order_like_scores() {
        let scores = [
            f32::NEG_INFINITY,
            -1e30,
            -1.0,
            -f32::MIN_POSITIVE,
            -1e-45,
            -0.0,
            0.0,
            1e-45,
            1.0,
            1e30,
            f32::INFINITY,
        ];
        let keys: Vec<u32> = scores.iter().map(|&s| radix_key(s)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:x?}");
        assert_eq!(radix_key(-0.0) + 1, radix_key(0.0));
        for s in scores {
            assert_eq!(score_of_key(radix_key(s)).to_bits(), s.to_bits());
        }
    }

    #[test]
    fn short_rows_select_everything_in_order() {
        let sel = select_row(&[3.0, -1.0, 7.0], top(5)).unwrap();
        assert_eq!(sel.list, vec![0, 1, 2, -1, -1]);
        assert_eq!(sel.threshold, None);
        let exact = select_row(&[3.0, -1.0, 7.0], top(3)).unwrap();
        assert_eq!(exact.list, vec![0, 1, 2]);
        assert_eq!(select_row(&[], top(2)).unwrap().list, vec![-1, -1]);
    }

    #[test]
    fn masked_keys_are_never_selected() {
        let inf = MASKED;
        // Fewer than k unmasked: in position order, then -1, however they score.
        let sel = select_row(&[inf, 3.0, inf, -1.0, 7.0, inf], top(4)).unwrap();
        assert_eq!(sel.list, vec![1, 3, 4, -1]);
        assert_eq!(sel.threshold, None);
        assert_eq!(select_row(&[inf; 5], top(2)).unwrap().list, vec![-1, -1]);
        assert_eq!(
            select_row(&[inf, 2.0], top(3)).unwrap().list,
            vec![1, -1, -1]
        );
        // Exactly k unmasked in a longer row: the usual order (T the smallest unmasked key).
        let sel = select_row(&[inf, 1.0, 5.0, inf, 3.0], top(3)).unwrap();
        assert_eq!(sel.list, vec![2, 4, 1]);
        assert_eq!(sel.threshold.unwrap().key, radix_key(1.0));
        // Masked positions among tied keys: the ties go by position, the masked ones skipped.
        let sel = select_row(&[2.0, inf, 2.0, inf, 2.0, 2.0], top(3)).unwrap();
        assert_eq!(sel.list, vec![0, 2, 4]);
        assert_eq!(
            sorted_top_k(&[2.0, inf, 2.0, inf, 2.0, 2.0], top(3)).unwrap(),
            vec![0, 2, 4]
        );
        assert_eq!(sorted_top_k(&[inf, 1.0, inf], top(2)).unwrap(), vec![1]);
    }

    #[test]
    fn nan_is_reported_with_its_position() {
        let err = select_row(&[1.0, f32::NAN, 2.0], top(1)).unwrap_err();
        assert_eq!(err.pos, 1);
        let err = select_row(&[1.0, 2.0, -f32::NAN], top(8)).unwrap_err();
        assert_eq!(err.pos, 2);
    }

    #[test]
    fn order_is_above_prefix_then_above_t_then_ties() {
        // k = 4, room 8. T = 1.0; its 12-bit prefix (0x3f8 of the bits) is shared by the four
        // 1.0s only: 1.25 (0x3fa..) and 1.5 (0x3fc..) are above P, so they come with 100.0 by
        // position, then the lowest tie.
        let scores = [1.0, 100.0, 1.5, 1.0, 1.25, 1.0, 1.0];
        let sel = select_row(&scores, top(4)).unwrap();
        let th = sel.threshold.unwrap();
        assert_eq!((th.key, th.prefix_bits), (radix_key(1.0), 12));
        assert_eq!((th.above, th.sharing), (3, 4));
        assert_eq!(sel.list, vec![1, 2, 4, 0]);
    }

    #[test]
    fn keys_sharing_p_above_t_come_after_every_key_above_p() {
        // 1.0 and 1.0625 share the top 12 bits (0x3f8); 3.0 is above P.
        let scores = [1.0625, 1.0, 3.0, 1.0, 0.5];
        let sel = select_row(&scores, top(3)).unwrap();
        assert_eq!(sel.threshold.unwrap().prefix_bits, 12);
        assert_eq!(sel.list, vec![2, 0, 1]);
    }

    #[test]
    fn prefix_grows_when_the_room_overflows() {
        // k = 1, room 2: T = c; three keys share its 12-bit prefix, only c its 24-bit prefix.
        let a = f32::from_bits(0x3f80_0100);
        let b = f32::from_bits(0x3f80_0101);
        let c = f32::from_bits(0x3f81_0000);
        let sel = select_row(&[a, c, b], top(1)).unwrap();
        let th = sel.threshold.unwrap();
        assert_eq!((th.prefix_bits, th.key), (24, radix_key(c)));
        assert_eq!(sel.list, vec![1]);
        // All equal: no prefix fits, so P is all of T and ties go by position.
        let sel = select_row(&[2.0; 9], top(3)).unwrap();
        assert_eq!(sel.threshold.unwrap().prefix_bits, 32);
        assert_eq!(sel.list, vec![0, 1, 2]);
    }

    #[test]
    fn zeros_of_both_signs_and_infinities() {
        let scores = [-0.0, 0.0, -0.0, f32::INFINITY, 0.0];
        let sel = select_row(&scores, top(4)).unwrap();
        assert_eq!(sel.threshold.unwrap().key, radix_key(-0.0));
        assert_eq!(sel.list, vec![1, 3, 4, 0]);
        assert_eq!(sorted_top_k(&scores, top(4)).unwrap(), vec![3, 1, 4, 0]);
    }

    #[test]
    fn slots_follow_the_rows_requests() {
        let table = PageTable::new(&[vec![7, 2], vec![5]]).unwrap();
        let pages = RowPages {
            table: &table,
            requests: &[0, 1, 0],
        };
        assert_eq!(pages.slot(0, 3).unwrap(), 7 * 64 + 3);
        assert_eq!(pages.slot(2, 64 + 10).unwrap(), 2 * 64 + 10);
        assert!(matches!(
            pages.slot(1, 64),
            Err(SelectError::PagePastRow {
                request: 1,
                have: 1,
                ..
            })
        ));
        assert!(matches!(
            pages.slot(3, 0),
            Err(SelectError::RowWithoutRequest { row: 3, rows: 3 })
        ));
        assert!(pages.check(&[128, 64, 1]).is_ok());
        assert!(pages.check(&[129]).is_err());
        let form = pages.device_form(&[100, 10, 1]).unwrap();
        assert_eq!(form.list, vec![7, 2, 5]);
        let offsets: Vec<u32> = form.requests.iter().map(|q| q.page_offset).collect();
        assert_eq!(offsets, vec![0, 2]);
        let requests: Vec<u32> = form.rows.iter().map(|r| r.request).collect();
        assert_eq!(requests, vec![0, 1, 0]);
        // The kernels' lookup (ops/paging.h mono_row_pages, mono_page_slot) gives the same slots.
        for (row, len) in [(0usize, 100u32), (1, 10), (2, 1)] {
            let first = form.requests[form.rows[row].request as usize].page_offset as usize;
            for pos in 0..len {
                let page = form.list[first + (pos / PAGE_TOKENS) as usize];
                let slot = (page * PAGE_TOKENS + pos % PAGE_TOKENS) as i32;
                assert_eq!(slot, pages.slot(row, pos).unwrap());
            }
        }
        assert!(pages.device_form(&[100, 65]).is_err());
        let mut list = vec![65, -1];
        to_slots(&mut list, 0, &pages).unwrap();
        assert_eq!(list, vec![2 * 64 + 1, -1]);
    }

    #[test]
    fn rows_shape_is_checked() {
        let scores = [0.0f32; 10];
        let rows = Rows {
            scores: &scores,
            stride: 4,
            lens: &[4, 4, 1],
        };
        assert!(matches!(
            select_rows(&rows, top(2), None),
            Err(SelectError::ScoresShape { .. })
        ));
        let rows = Rows {
            scores: &scores,
            stride: 5,
            lens: &[6, 0],
        };
        assert!(matches!(
            select_rows(&rows, top(2), None),
            Err(SelectError::LengthPastStride { row: 0, .. })
        ));
    }
}
