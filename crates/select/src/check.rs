//! Checking a kernel's lists against the reference of the kernel's own input: entry by entry (the
//! first difference is reported), and "missed" (keys of the exact top-k a list lacks), plus the
//! corruptions that serve as negative controls: each must make the check fail.

use crate::layout::TopK;
use crate::reference::{
    is_masked, radix_key, select_row, select_rows, sorted_top_k, to_slots, RowPages, Rows,
    SelectError,
};
use std::collections::HashSet;

/// The first entry where a list differs from the reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("row {row} entry {index}: got {got}, the reference has {want}")]
pub struct Mismatch {
    pub row: usize,
    pub index: usize,
    pub got: i32,
    pub want: i32,
}

/// What checking a launch's output found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Reference(#[from] SelectError),
    #[error("the output holds {got} entries; {rows} rows of k = {k} need {want}")]
    Length {
        got: usize,
        want: usize,
        rows: usize,
        k: u32,
    },
    #[error("{mismatch} ({missed} keys of the exact top-k missing from the row)")]
    Mismatch { mismatch: Mismatch, missed: usize },
}

/// Compares one row's list with the reference's, entry by entry.
pub fn compare_row(row: usize, got: &[i32], want: &[i32]) -> Result<(), Mismatch> {
    let n = got.len().max(want.len());
    for index in 0..n {
        let (g, w) = (got.get(index), want.get(index));
        if g != w {
            return Err(Mismatch {
                row,
                index,
                got: g.copied().unwrap_or(i32::MIN),
                want: w.copied().unwrap_or(i32::MIN),
            });
        }
    }
    Ok(())
}

/// Entries of `expected` (not -1) that `got` lacks.
pub fn missed(got: &[i32], expected: &[i32]) -> usize {
    let have: HashSet<i32> = got.iter().copied().collect();
    expected
        .iter()
        .filter(|e| **e >= 0 && !have.contains(e))
        .count()
}

/// The exact top-k of every row by the sort-based reference, as the list's entries would be
/// (positions or slots), `[rows, k]`-shaped without padding: one vector per row.
pub fn expected_sets(
    rows: &Rows,
    top: TopK,
    pages: Option<&RowPages>,
) -> Result<Vec<Vec<i32>>, SelectError> {
    rows.check()?;
    (0..rows.count())
        .map(|row| {
            let mut set = sorted_top_k(rows.row(row), top)
                .map_err(|source| SelectError::Nan { row, source })?;
            if let Some(pages) = pages {
                to_slots(&mut set, row, pages)?;
            }
            Ok(set)
        })
        .collect()
}

/// Per-row counts of missed keys (the sort-based check).
pub fn missed_per_row(
    rows: &Rows,
    top: TopK,
    pages: Option<&RowPages>,
    got: &[i32],
) -> Result<Vec<usize>, CheckError> {
    let k = top.k() as usize;
    check_len(rows, top, got)?;
    let sets = expected_sets(rows, top, pages)?;
    Ok(sets
        .iter()
        .enumerate()
        .map(|(row, set)| missed(&got[row * k..(row + 1) * k], set))
        .collect())
}

fn check_len(rows: &Rows, top: TopK, got: &[i32]) -> Result<(), CheckError> {
    let want = rows.count() * top.k() as usize;
    if got.len() != want {
        return Err(CheckError::Length {
            got: got.len(),
            want,
            rows: rows.count(),
            k: top.k(),
        });
    }
    Ok(())
}

/// The full check of a launch's output `[rows, k]`: entry by entry against [`select_rows`] of
/// the same input. A mismatch also reports how many exact top-k keys the row missed.
pub fn check_output(
    rows: &Rows,
    top: TopK,
    pages: Option<&RowPages>,
    got: &[i32],
) -> Result<(), CheckError> {
    check_len(rows, top, got)?;
    let want = select_rows(rows, top, pages)?;
    let k = top.k() as usize;
    for row in 0..rows.count() {
        let span = row * k..(row + 1) * k;
        if let Err(mismatch) = compare_row(row, &got[span.clone()], &want[span.clone()]) {
            let set = &expected_sets(rows, top, pages)?[row];
            return Err(CheckError::Mismatch {
                mismatch,
                missed: missed(&got[span], set),
            });
        }
    }
    Ok(())
}

/// Corruptions of a correct result; the check must reject each.
pub mod controls {
    use super::*;

    /// Replaces the list's last selected entry (a key equal to T) with the best key the list left
    /// out (largest key, lowest position). Positions only. `false` if every key was selected.
    pub fn replace_with_best_unselected(list: &mut [i32], scores: &[f32]) -> bool {
        let chosen: HashSet<i32> = list.iter().copied().collect();
        let best = (0..scores.len() as i32)
            .filter(|p| !chosen.contains(p))
            .max_by(|&a, &b| {
                radix_key(scores[a as usize])
                    .cmp(&radix_key(scores[b as usize]))
                    .then(b.cmp(&a))
            });
        match (best, list.iter().rposition(|e| *e >= 0)) {
            (Some(best), Some(last)) => {
                list[last] = best;
                true
            }
            _ => false,
        }
    }

    /// Swaps the first two entries that differ. `false` if there are none.
    pub fn swap_two(list: &mut [i32]) -> bool {
        let Some(first) = list.first().copied() else {
            return false;
        };
        match list.iter().position(|e| *e != first) {
            Some(other) => {
                list.swap(0, other);
                true
            }
            None => false,
        }
    }

    /// Flips one bit of one score so that the row's exact top-k set changes (so any correct list
    /// changes): lowers the last selected key below the best unselected one, or raises the best
    /// unselected key above T, never producing NaN; in a row with fewer than k unmasked keys,
    /// unmasks a masked one. Returns (position, bit), or `None` when no single flip changes the
    /// set (a row of at most k keys, none masked).
    pub fn flip_score_bit(scores: &mut [f32], top: TopK) -> Option<(usize, u32)> {
        let sel = select_row(scores, top).ok()?;
        let flipped = |s: f32, bit: u32| f32::from_bits(s.to_bits() ^ (1 << bit));
        let Some(th) = sel.threshold else {
            let pos = scores.iter().position(|&s| is_masked(s))?;
            let bit = (0..32).find(|&b| {
                let f = flipped(scores[pos], b);
                !f.is_nan() && !is_masked(f)
            })?;
            scores[pos] = flipped(scores[pos], bit);
            return Some((pos, bit));
        };
        let t = th.key;
        let last = *sel.list.last()? as usize;
        let chosen: HashSet<i32> = sel.list.iter().copied().collect();
        let best = (0..scores.len())
            .filter(|p| !chosen.contains(&(*p as i32)))
            .max_by(|&a, &b| {
                radix_key(scores[a])
                    .cmp(&radix_key(scores[b]))
                    .then(b.cmp(&a))
            })?;
        let best_key = radix_key(scores[best]);
        let flipped = |pos: usize, bit: u32| f32::from_bits(scores[pos].to_bits() ^ (1 << bit));
        let lower = (0..32)
            .rev()
            .map(|bit| (last, bit))
            .find(|&(p, b)| !flipped(p, b).is_nan() && radix_key(flipped(p, b)) < best_key);
        let raise = || {
            (0..32)
                .rev()
                .map(|bit| (best, bit))
                .find(|&(p, b)| !flipped(p, b).is_nan() && radix_key(flipped(p, b)) > t)
        };
        let (pos, bit) = lower.or_else(raise)?;
        scores[pos] = flipped(pos, bit);
        Some((pos, bit))
    }
}

#[cfg(test)]
mod tests {
    use super::controls::*;
    use super::*;

    fn top(k: u32) -> TopK {
        TopK::new(k).unwrap()
    }

    fn sample() -> Vec<f32> {
        // Ties at T (1.0) across the cut, a duplicate above it, and negatives.
        vec![
            1.0, 3.0, -2.0, 1.0, 5.0, 1.0, 3.0, -0.5, 1.0, 0.25, 7.0, 1.0,
        ]
    }

    fn check(scores: &[f32], top: TopK, got: &[i32]) -> Result<(), CheckError> {
        let lens = [scores.len() as u32];
        let rows = Rows {
            scores,
            stride: scores.len(),
            lens: &lens,
        };
        check_output(&rows, top, None, got)
    }

    #[test]
    fn the_reference_passes_its_own_check() {
        let scores = sample();
        let list = select_row(&scores, top(6)).unwrap().list;
        check(&scores, top(6), &list).unwrap();
        let lens = [12];
        let rows = Rows {
            scores: &scores,
            stride: 12,
            lens: &lens,
        };
        assert_eq!(missed_per_row(&rows, top(6), None, &list).unwrap(), vec![0]);
    }

    #[test]
    fn replacing_a_slot_with_the_best_unselected_key_fails() {
        let scores = sample();
        let mut list = select_row(&scores, top(6)).unwrap().list;
        assert!(replace_with_best_unselected(&mut list, &scores));
        match check(&scores, top(6), &list) {
            Err(CheckError::Mismatch { mismatch, missed }) => {
                assert_eq!((mismatch.index, missed), (5, 1), "{mismatch}");
            }
            other => panic!("the control passed: {other:?}"),
        }
    }

    #[test]
    fn two_swapped_entries_fail_though_nothing_is_missed() {
        let scores = sample();
        let mut list = select_row(&scores, top(6)).unwrap().list;
        assert!(swap_two(&mut list));
        match check(&scores, top(6), &list) {
            Err(CheckError::Mismatch { mismatch, missed }) => {
                assert_eq!((mismatch.index, missed), (0, 0), "{mismatch}");
            }
            other => panic!("the control passed: {other:?}"),
        }
    }

    #[test]
    fn a_flipped_score_bit_fails() {
        for scores in [sample(), vec![0.0; 9], vec![-3.0; 9], {
            let mut s = vec![f32::NEG_INFINITY; 9];
            s[4] = 2.0;
            s
        }] {
            let list = select_row(&scores, top(6)).unwrap().list;
            let mut corrupt = scores.clone();
            let flip = flip_score_bit(&mut corrupt, top(6));
            assert!(flip.is_some(), "no observable flip in {scores:?}");
            assert!(
                check(&corrupt, top(6), &list).is_err(),
                "flip {flip:?} of {scores:?} passed"
            );
        }
    }

    #[test]
    fn short_rows_have_nothing_to_corrupt_by_selection() {
        let mut scores = vec![1.0, 2.0];
        assert_eq!(flip_score_bit(&mut scores, top(4)), None);
        let mut list = select_row(&scores, top(4)).unwrap().list;
        assert!(!replace_with_best_unselected(&mut list, &scores));
    }

    #[test]
    fn length_and_nan_are_reported() {
        let scores = sample();
        assert!(matches!(
            check(&scores, top(6), &[0; 5]),
            Err(CheckError::Length { .. })
        ));
        let mut bad = scores.clone();
        bad[3] = f32::NAN;
        assert!(matches!(
            check(&bad, top(6), &[0; 6]),
            Err(CheckError::Reference(SelectError::Nan { row: 0, .. }))
        ));
    }
}
