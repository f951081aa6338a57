//! The pieces of the digit descent that every slice runs, in the form the kernels run them
//! (`kernels/select.h` mirrors each as a `sel_*` function or struct): prefix tests, the 64-bin
//! digit histogram and its 16-bit packing, the choice of the digit holding the k-th key, and the
//! state a slice keeps from round to round.

use crate::layout::{BINS, DIGITS, HIST_BOXES, ROUNDS, STOPS};

/// The bits of T found so far, in place (the top `len` bits), the rest zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prefix {
    pub bits: u32,
    pub len: u32,
}

impl Prefix {
    /// The top `len` bits set (no shift by 32 for `len == 0`).
    pub fn mask(&self) -> u32 {
        if self.len == 0 {
            0
        } else {
            u32::MAX << (32 - self.len)
        }
    }

    pub fn matches(&self, key: u32) -> bool {
        key & self.mask() == self.bits
    }

    /// The key's prefix of this length is above this prefix.
    pub fn key_above(&self, key: u32) -> bool {
        key & self.mask() > self.bits
    }

    /// The prefix one digit (of `round`) longer.
    pub fn extend(&self, round: usize, digit: u32) -> Prefix {
        let (shift, width) = DIGITS[round];
        Prefix {
            bits: self.bits | digit << shift,
            len: self.len + width,
        }
    }
}

/// The digit of `key` in `round`.
pub fn digit(key: u32, round: usize) -> u32 {
    let (shift, width) = DIGITS[round];
    (key >> shift) & ((1 << width) - 1)
}

/// Histogram of the digits of `round` over the keys that match `prefix`.
pub fn histogram(keys: impl Iterator<Item = u32>, prefix: Prefix, round: usize) -> [u32; 64] {
    let mut hist = [0u32; BINS as usize];
    for key in keys.filter(|&k| prefix.matches(k)) {
        hist[digit(key, round) as usize] += 1;
    }
    hist
}

/// Two 16-bit counts per box value: bin 2j in the low half, 2j + 1 in the high half. A slice
/// holds at most `SLICE_ROOM` (< 2^16) keys, so no count is cut.
pub fn pack_hist(hist: &[u32; 64]) -> [u32; HIST_BOXES as usize] {
    std::array::from_fn(|j| (hist[2 * j] & 0xffff) | hist[2 * j + 1] << 16)
}

pub fn unpack_hist(boxes: &[u32]) -> [u32; 64] {
    std::array::from_fn(|b| {
        let v = boxes[b / 2];
        if b % 2 == 0 {
            v & 0xffff
        } else {
            v >> 16
        }
    })
}

/// The digit whose bin holds the `rank`-th largest key (1-based) and the keys in higher bins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub digit: u32,
    pub above: u32,
}

/// `None` when fewer than `rank` keys are counted (a broken invariant, reported by callers).
pub fn choose_digit(total: &[u32; 64], rank: u32) -> Option<Choice> {
    let mut above = 0;
    for digit in (0..BINS).rev() {
        let n = total[digit as usize];
        if above + n >= rank {
            return Some(Choice { digit, above });
        }
        above += n;
    }
    None
}

/// What one slice knows after each round; the same in every slice except the `*_before` counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descent {
    pub prefix: Prefix,
    /// Rounds done.
    pub round: usize,
    /// The rank of T among the keys sharing `prefix` (1-based).
    pub rank: u32,
    /// Keys of the row whose prefix is above `prefix`.
    pub above: u32,
    /// Of those, the ones in slices before this one.
    pub above_before: u32,
    /// Keys of the row sharing `prefix`.
    pub sharing: u32,
    /// Of those, the ones in slices before this one.
    pub sharing_before: u32,
}

/// A round whose histograms hold fewer keys than the rank sought: the slices disagree or lost keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("round {round}: the histograms count fewer than the {rank} keys the descent needs")]
pub struct LostKeys {
    pub round: usize,
    pub rank: u32,
}

impl Descent {
    /// Before the first round: T is the `k`-th key of the `len` keys of the row.
    pub fn start(k: u32, len: u32) -> Descent {
        Descent {
            prefix: Prefix::default(),
            round: 0,
            rank: k,
            above: 0,
            above_before: 0,
            sharing: len,
            sharing_before: 0,
        }
    }

    /// One round from every slice's histogram (`hists[c]` of slice `c`), seen by slice `me`.
    pub fn step(&mut self, hists: &[[u32; 64]], me: usize) -> Result<(), LostKeys> {
        let total: [u32; 64] = std::array::from_fn(|b| hists.iter().map(|h| h[b]).sum::<u32>());
        let lost = LostKeys {
            round: self.round,
            rank: self.rank,
        };
        let choice = choose_digit(&total, self.rank).ok_or(lost)?;
        let d = choice.digit as usize;
        let before = &hists[..me.min(hists.len())];
        self.above_before += before
            .iter()
            .map(|h| h[d + 1..].iter().sum::<u32>())
            .sum::<u32>();
        self.sharing_before = before.iter().map(|h| h[d]).sum();
        self.above += choice.above;
        self.rank -= choice.above;
        self.sharing = total[d];
        self.prefix = self.prefix.extend(self.round, choice.digit);
        self.round += 1;
        Ok(())
    }

    /// Whether the slices stop here: all 32 bits known, or at a stop the keys sharing the prefix
    /// fit in the candidate room.
    pub fn stopped(&self, room: u32) -> bool {
        self.round == ROUNDS as usize || (STOPS.contains(&self.prefix.len) && self.sharing <= room)
    }

    /// T, once all 32 bits are known.
    pub fn threshold(&self) -> Option<u32> {
        (self.prefix.len == 32).then_some(self.prefix.bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_cover_all_32_bits() {
        let key = 0xdead_beef;
        let mut p = Prefix::default();
        for round in 0..ROUNDS as usize {
            assert!(p.matches(key));
            p = p.extend(round, digit(key, round));
        }
        assert_eq!((p.bits, p.len), (key, 32));
        assert!(p.key_above(key + 1) && !p.key_above(key) && !p.matches(key - 1));
    }

    #[test]
    fn packing_round_trips_16_bit_counts() {
        let hist: [u32; 64] = std::array::from_fn(|b| (b as u32 * 1031) % 65536);
        assert_eq!(unpack_hist(&pack_hist(&hist)), hist);
    }

    #[test]
    fn choice_counts_from_the_top() {
        let mut total = [0u32; 64];
        total[63] = 2;
        total[10] = 5;
        assert_eq!(
            choose_digit(&total, 2),
            Some(Choice {
                digit: 63,
                above: 0
            })
        );
        assert_eq!(
            choose_digit(&total, 3),
            Some(Choice {
                digit: 10,
                above: 2
            })
        );
        assert_eq!(choose_digit(&total, 8), None);
    }
}
