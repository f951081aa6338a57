//! The pieces of the digit descent that every slice runs, in the form the kernels run them
//! (`kernels/select.h` mirrors each as a `sel_*` function or struct): prefix tests, the 64-bin
//! digit histogram and its 16-bit packing, the choice of the digit holding the k-th key, the
//! state a slice keeps from round to round, the wide digits (shared-memory atomics on the device)
//! that finish T, and the cut that places a list in one pass.

use crate::layout::{wide_finish, BINS, DIGITS, GROUP_BITS, HIST_BOXES, ROUNDS, STOPS, WIDE_BITS};

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

/// The counts of an even `round` and the next one by both digits, over the keys that match
/// `prefix`: `[hi][lo]`, hi the digit of `round`, lo that of `round + 1`. The even round's
/// histogram is the sums of the rows ([`row_sums`]); the next round's is the row of the digit
/// the even round chose, so it reads no key. The stops (12 and 24 bits, and 32) end a pair, so
/// rounds always come two by two. (device `sel_count_pairs`)
pub fn pair_histogram(
    keys: impl Iterator<Item = u32>,
    prefix: Prefix,
    round: usize,
) -> Vec<[u32; 64]> {
    let mut rows = vec![[0u32; BINS as usize]; BINS as usize];
    for key in keys.filter(|&k| prefix.matches(k)) {
        rows[digit(key, round) as usize][digit(key, round + 1) as usize] += 1;
    }
    rows
}

/// The even round's histogram from its pair counts. (device `sel_row_sum`)
pub fn row_sums(rows: &[[u32; 64]]) -> [u32; 64] {
    std::array::from_fn(|hi| rows[hi].iter().sum())
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
pub fn choose_digit(total: &[u32], rank: u32) -> Option<Choice> {
    let mut above = 0;
    for digit in (0..total.len() as u32).rev() {
        let n = total[digit as usize];
        if above + n >= rank {
            return Some(Choice { digit, above });
        }
        above += n;
    }
    None
}

/// Histogram of the `width` bits right below `prefix` over the keys that match it: one wide
/// pass (device `sel_wide_pass`, `sel_load_count`).
pub fn wide_histogram(keys: impl Iterator<Item = u32>, prefix: Prefix, width: u32) -> Vec<u32> {
    let shift = 32 - prefix.len - width;
    let mut hist = vec![0u32; 1 << width];
    for key in keys.filter(|&k| prefix.matches(k)) {
        hist[((key >> shift) & ((1 << width) - 1)) as usize] += 1;
    }
    hist
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

    /// One wide pass (device `sel_wide_choose`): `hist` is [`wide_histogram`] of the row's keys
    /// (or of all its candidates) under this prefix, `width` bits long.
    pub fn wide_step(&mut self, hist: &[u32], width: u32) -> Result<(), LostKeys> {
        let lost = LostKeys {
            round: self.round,
            rank: self.rank,
        };
        let choice = choose_digit(hist, self.rank).ok_or(lost)?;
        self.above += choice.above;
        self.rank -= choice.above;
        self.sharing = hist[choice.digit as usize];
        self.prefix = Prefix {
            bits: self.prefix.bits | choice.digit << (32 - self.prefix.len - width),
            len: self.prefix.len + width,
        };
        self.round += 1;
        Ok(())
    }

    /// One wide pass of [`WIDE_BITS`] (device `sel_wide_choose` of a 12-bit digit), which also
    /// gives the group of T's digit: the keys of the row sharing, and above, T's prefix that ends
    /// at the digit's top [`GROUP_BITS`] (the bins of the group are consecutive).
    pub fn wide_step_grouped(&mut self, hist: &[u32]) -> Result<Group, LostKeys> {
        let before = *self;
        self.wide_step(hist, WIDE_BITS)?;
        let digit = (self.prefix.bits >> (32 - self.prefix.len)) & ((1 << WIDE_BITS) - 1);
        let span = 1usize << (WIDE_BITS - GROUP_BITS);
        let g = digit as usize / span;
        let len = before.prefix.len + GROUP_BITS;
        let prefix = Prefix { bits: 0, len };
        Ok(Group {
            prefix: Prefix {
                bits: self.prefix.bits & prefix.mask(),
                len,
            },
            sharing: hist[g * span..(g + 1) * span].iter().sum(),
            above: before.above + hist[(g + 1) * span..].iter().sum::<u32>(),
        })
    }

    /// The rest of T by wide passes over `keys` (every key of the row sharing the prefix, and
    /// perhaps others): [`wide_finish`] of the prefix length. (device `sel_wide_finish`)
    pub fn wide_finish(&mut self, keys: &[u32]) -> Result<(), LostKeys> {
        for &width in wide_finish(self.prefix.len) {
            self.wide_step(
                &wide_histogram(keys.iter().copied(), self.prefix, width),
                width,
            )?;
        }
        Ok(())
    }

    /// The rest of T by ranks among `keys` (every key of the row sharing the prefix, and perhaps
    /// others): T is the key sharing it with fewer than `rank` of them above it and at least
    /// `rank` at or above it. (device `sel_reg_rank`)
    pub fn rank_finish(&mut self, keys: &[u32]) -> Result<(), LostKeys> {
        let lost = LostKeys {
            round: self.round,
            rank: self.rank,
        };
        let sharing: Vec<u32> = keys
            .iter()
            .copied()
            .filter(|&k| self.prefix.matches(k))
            .collect();
        let count =
            |keep: &dyn Fn(u32) -> bool| sharing.iter().filter(|&&k| keep(k)).count() as u32;
        let t = sharing
            .iter()
            .copied()
            .find(|&x| count(&|k| k > x) < self.rank && self.rank <= count(&|k| k >= x))
            .ok_or(lost)?;
        let above = count(&|k| k > t);
        self.above += above;
        self.rank -= above;
        self.sharing = count(&|k| k == t);
        self.prefix = Prefix { bits: t, len: 32 };
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

/// T's prefix at a stop, as a 12-bit wide pass sees it ([`Descent::wide_step_grouped`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    pub prefix: Prefix,
    /// Keys of the row sharing it.
    pub sharing: u32,
    /// Keys of the row above it.
    pub above: u32,
}

/// Where the list puts a key once P and T are known (device `sel_cut`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Its prefix is above P: from entry 0.
    AboveP,
    /// It shares P and is above T: from entry `above_p`.
    AboveT,
    /// It equals T: from entry `above_t`, until k.
    Tie,
    /// Not in the list.
    Out,
}

/// P and T with the row's counts above each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    pub p: Prefix,
    pub t: u32,
    pub above_p: u32,
    pub above_t: u32,
}

impl Cut {
    /// From the descent where it stopped at P and the finished one (T = all 32 bits).
    pub fn new(at_p: &Descent, done: &Descent) -> Cut {
        Cut {
            p: at_p.prefix,
            t: done.prefix.bits,
            above_p: at_p.above,
            above_t: done.above,
        }
    }

    /// P from a wide pass's group, T from the finished descent.
    pub fn at_group(p: &Group, done: &Descent) -> Cut {
        Cut {
            p: p.prefix,
            t: done.prefix.bits,
            above_p: p.above,
            above_t: done.above,
        }
    }

    pub fn kind(&self, key: u32) -> Kind {
        if self.p.key_above(key) {
            Kind::AboveP
        } else if !self.p.matches(key) {
            Kind::Out
        } else if key > self.t {
            Kind::AboveT
        } else if key == self.t {
            Kind::Tie
        } else {
            Kind::Out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digit histogram of `round` over the keys that match `prefix`, counted directly.
    fn histogram(keys: &[u32], prefix: Prefix, round: usize) -> [u32; 64] {
        let mut hist = [0u32; BINS as usize];
        for &key in keys.iter().filter(|&&k| prefix.matches(k)) {
            hist[digit(key, round) as usize] += 1;
        }
        hist
    }

    #[test]
    fn a_pair_count_gives_both_rounds_histograms() {
        // Keys that share digits at every round, so that rows and prefixes are not trivial.
        let keys: Vec<u32> = (0..5000u32)
            .map(|i| i.wrapping_mul(0x9e37_79b9) & 0xc3f0_f0ff | 0x0100_0000)
            .collect();
        for round in [0, 2, 4] {
            let mut prefix = Prefix::default();
            for r in 0..round {
                prefix = prefix.extend(r, digit(keys[7], r));
            }
            let rows = pair_histogram(keys.iter().copied(), prefix, round);
            assert_eq!(row_sums(&rows), histogram(&keys, prefix, round));
            for d in 0..BINS {
                let next = prefix.extend(round, d);
                assert_eq!(
                    rows[d as usize],
                    histogram(&keys, next, round + 1),
                    "round {round} digit {d}"
                );
            }
        }
    }

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
    fn a_wide_pass_counts_the_keys_at_its_stop() {
        // Keys spread over several 12-bit and 24-bit prefixes around T's.
        let keys: Vec<u32> = (0..5000u32)
            .map(|i| 0x8000_0000 | i.wrapping_mul(0x9e37_79b9) >> 7)
            .collect();
        let mut d = Descent::start(700, keys.len() as u32);
        let hist = |d: &Descent, width| wide_histogram(keys.iter().copied(), d.prefix, width);
        d.wide_step(&hist(&d, 8), 8).unwrap();
        for stop in [12, 24] {
            let g = d.wide_step_grouped(&hist(&d, WIDE_BITS)).unwrap();
            assert_eq!(g.prefix.len, stop);
            let sharing = keys.iter().filter(|&&k| g.prefix.matches(k)).count() as u32;
            let above = keys.iter().filter(|&&k| g.prefix.key_above(k)).count() as u32;
            assert_eq!((g.sharing, g.above), (sharing, above));
            // At 12 bits (~150 keys a prefix here) the group holds more than T's 20-bit prefix.
            assert!(g.sharing > d.sharing || (stop == 24 && g.sharing == d.sharing));
            assert!(g.prefix.matches(d.prefix.bits));
        }
        let t = d.threshold().unwrap();
        assert_eq!(d.above, keys.iter().filter(|&&k| k > t).count() as u32);
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
