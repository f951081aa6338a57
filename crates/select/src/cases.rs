//! Score rows for checks and benchmarks: the adversarial set of the select contract, masked rows
//! included, generated from a seed so that a failing case can be named and rerun.

use crate::layout::{TopK, REG_RANK_BUCKET, REG_RANK_ROOM, REG_STAGE_ROOM};
use crate::reference::MASKED;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Keys at the end of a row that [`Pattern::Recent`] scales up.
pub const RECENT_KEYS: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Uniform in [-4, 4).
    Random,
    /// Any non-NaN bit pattern (infinities and subnormals included).
    Bits,
    /// Four distinct values repeated.
    Ties,
    /// Every score 0.75.
    AllEqual,
    /// +0.0 and -0.0 mixed (-0.0 ranks just below +0.0).
    Zeros,
    /// Random, with the last [`RECENT_KEYS`] scores scaled by 8 (recent tokens scoring high).
    Recent,
    /// Random for the first eighth, masked (-inf) after: masked padding inside the length.
    NegInfPadding,
    /// 1.0 plus a few ulps: every key shares its top 24 bits, so the descent runs to 32 bits.
    Narrow,
    /// In [1.0, 1.125), spread over the low 20 bits: every key shares its top 12 bits and about
    /// len / 4096 share each 24-bit prefix, so rows longer than the room stop at 24 bits.
    Dense,
    /// [`CROWD_HIGH`] keys at 3.0, then a crowd of exactly the candidate room of k = 2048 (4096
    /// keys) in [1.0, 1.125), which shares one 12-bit prefix, the rest -1.0, shuffled. At k = 2048
    /// T is in the crowd, and P stops at 12 bits with the room full to the last key.
    RoomFull,
    /// As [`Pattern::RoomFull`] with one key more in the crowd: P runs on to 24 bits.
    RoomPlusOne,
    /// As [`Pattern::RoomFull`] with a crowd of the registers kernel's stage room (2048 keys):
    /// the most it stages.
    StageFull,
    /// As [`Pattern::StageFull`] with one key more in the crowd: the registers kernel's other way.
    StagePlusOne,
    /// [`rank_high`] keys at 3.0, [`RANK_BESIDE`] at 1.1, then a crowd of the registers kernel's
    /// rank room (64 keys) on 16 values just above 1.0, which share one 24-bit (and 20-bit)
    /// prefix, the rest -1.0, shuffled. At k = 2048 T is the crowd's middle key and repeats; the
    /// keys at 1.1 share its 12-bit prefix but not its 20-bit one, so P stops at 12 bits.
    RankFull,
    /// As [`Pattern::RankFull`] with one key more in the crowd: the registers kernel's last digit.
    RankPlusOne,
    /// As [`Pattern::RankFull`] with a crowd of the registers kernel's rank bucket (16 keys):
    /// wave 0 ranks them alone.
    BucketFull,
    /// As [`Pattern::BucketFull`] with one key more: the crowd is gathered to be ranked.
    BucketPlusOne,
    /// Every score masked (-inf): the list is all -1.
    MaskedAll,
    /// k - 1 random scores at random positions (k = 2048), the rest masked: the unmasked keys in
    /// position order, then -1.
    MaskedBelowK,
    /// Exactly k unmasked: T is the smallest unmasked key, no -1.
    MaskedAtK,
    /// k + 1 unmasked: one of them is left out.
    MaskedAboveK,
    /// Every score 0.75 with about half the positions masked at random: the ties by position skip
    /// the masked ones.
    MaskedTies,
}

/// Keys at 3.0 in [`Pattern::RoomFull`] rows: k - CROWD_HIGH keys of the crowd are selected.
pub const CROWD_HIGH: usize = 1024;
/// Keys at 1.1 in [`Pattern::RankFull`] rows, below the keys at 3.0 and above the crowd.
pub const RANK_BESIDE: usize = 64;

/// Keys at 3.0 in [`Pattern::RankFull`] rows with a crowd of `crowd`: with [`RANK_BESIDE`],
/// k - crowd / 2 keys above the crowd, so T is the crowd's middle key (none when k is too small
/// for that).
pub fn rank_high(crowd: usize, top: TopK) -> usize {
    (top.k() as usize).saturating_sub(crowd / 2 + RANK_BESIDE)
}

impl Pattern {
    pub const ALL: [Pattern; 22] = [
        Pattern::Random,
        Pattern::Bits,
        Pattern::Ties,
        Pattern::AllEqual,
        Pattern::Zeros,
        Pattern::Recent,
        Pattern::NegInfPadding,
        Pattern::Narrow,
        Pattern::Dense,
        Pattern::RoomFull,
        Pattern::RoomPlusOne,
        Pattern::StageFull,
        Pattern::StagePlusOne,
        Pattern::RankFull,
        Pattern::RankPlusOne,
        Pattern::BucketFull,
        Pattern::BucketPlusOne,
        Pattern::MaskedAll,
        Pattern::MaskedBelowK,
        Pattern::MaskedAtK,
        Pattern::MaskedAboveK,
        Pattern::MaskedTies,
    ];

    pub fn name(&self) -> &'static str {
        match self {
            Pattern::Random => "random",
            Pattern::Bits => "bits",
            Pattern::Ties => "ties",
            Pattern::AllEqual => "all-equal",
            Pattern::Zeros => "zeros",
            Pattern::Recent => "recent",
            Pattern::NegInfPadding => "-inf padding",
            Pattern::Narrow => "narrow",
            Pattern::Dense => "dense",
            Pattern::RoomFull => "room full",
            Pattern::RoomPlusOne => "room + 1",
            Pattern::StageFull => "stage full",
            Pattern::StagePlusOne => "stage + 1",
            Pattern::RankFull => "rank full",
            Pattern::RankPlusOne => "rank + 1",
            Pattern::BucketFull => "bucket full",
            Pattern::BucketPlusOne => "bucket + 1",
            Pattern::MaskedAll => "masked all",
            Pattern::MaskedBelowK => "masked k - 1",
            Pattern::MaskedAtK => "masked k",
            Pattern::MaskedAboveK => "masked k + 1",
            Pattern::MaskedTies => "masked ties",
        }
    }

    /// `len` scores of this pattern from `seed`, for a select of `top` (the crowded and masked
    /// patterns are counted from its k and candidate room).
    pub fn row(&self, len: usize, top: TopK, seed: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        let uniform = |rng: &mut StdRng| rng.gen_range(-4.0f32..4.0);
        match self {
            Pattern::Random => (0..len).map(|_| uniform(&mut rng)).collect(),
            Pattern::Bits => (0..len)
                .map(|_| loop {
                    let s = f32::from_bits(rng.gen());
                    if !s.is_nan() {
                        break s;
                    }
                })
                .collect(),
            Pattern::Ties => {
                let values: [f32; 4] = std::array::from_fn(|_| uniform(&mut rng));
                (0..len).map(|_| values[rng.gen_range(0..4)]).collect()
            }
            Pattern::AllEqual => vec![0.75; len],
            Pattern::Zeros => (0..len)
                .map(|_| if rng.gen() { 0.0 } else { -0.0 })
                .collect(),
            Pattern::Recent => {
                let recent = len.saturating_sub(RECENT_KEYS);
                (0..len)
                    .map(|i| {
                        let s = uniform(&mut rng);
                        if i >= recent {
                            s * 8.0
                        } else {
                            s
                        }
                    })
                    .collect()
            }
            Pattern::NegInfPadding => (0..len)
                .map(|i| {
                    if i < len / 8 {
                        uniform(&mut rng)
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect(),
            Pattern::Narrow => (0..len)
                .map(|_| f32::from_bits(1.0f32.to_bits() + rng.gen_range(0..256)))
                .collect(),
            Pattern::Dense => (0..len)
                .map(|_| f32::from_bits(1.0f32.to_bits() + rng.gen_range(0..1 << 20)))
                .collect(),
            Pattern::RoomFull => crowd_row(len, top.room() as usize, &mut rng),
            Pattern::RoomPlusOne => crowd_row(len, top.room() as usize + 1, &mut rng),
            Pattern::StageFull => crowd_row(len, REG_STAGE_ROOM as usize, &mut rng),
            Pattern::StagePlusOne => crowd_row(len, REG_STAGE_ROOM as usize + 1, &mut rng),
            Pattern::RankFull => rank_row(len, REG_RANK_ROOM as usize, top, &mut rng),
            Pattern::RankPlusOne => rank_row(len, REG_RANK_ROOM as usize + 1, top, &mut rng),
            Pattern::BucketFull => rank_row(len, REG_RANK_BUCKET as usize, top, &mut rng),
            Pattern::BucketPlusOne => rank_row(len, REG_RANK_BUCKET as usize + 1, top, &mut rng),
            Pattern::MaskedAll => vec![MASKED; len],
            Pattern::MaskedBelowK => masked_row(len, top.k() as usize - 1, &mut rng),
            Pattern::MaskedAtK => masked_row(len, top.k() as usize, &mut rng),
            Pattern::MaskedAboveK => masked_row(len, top.k() as usize + 1, &mut rng),
            Pattern::MaskedTies => (0..len)
                .map(|_| if rng.gen() { 0.75 } else { MASKED })
                .collect(),
        }
    }
}

/// [`CROWD_HIGH`] keys at 3.0, `crowd` keys in [1.0, 1.125) (one 12-bit prefix), the rest -1.0,
/// shuffled (cut to `len`).
fn crowd_row(len: usize, crowd: usize, rng: &mut StdRng) -> Vec<f32> {
    let spread = |rng: &mut StdRng| f32::from_bits(1.0f32.to_bits() + rng.gen_range(0..1 << 20));
    layered_row(len, &[(CROWD_HIGH, &|_| 3.0), (crowd, &spread)], rng)
}

/// [`rank_high`] keys at 3.0, [`RANK_BESIDE`] at 1.1, `crowd` keys on 16 values in 1.0 plus
/// at most 255 ulps (one 24-bit prefix), the rest -1.0, shuffled (cut to `len`).
fn rank_row(len: usize, crowd: usize, top: TopK, rng: &mut StdRng) -> Vec<f32> {
    let few = |rng: &mut StdRng| f32::from_bits(1.0f32.to_bits() + (rng.gen_range(0..16) << 4));
    layered_row(
        len,
        &[
            (rank_high(crowd, top), &|_| 3.0),
            (RANK_BESIDE, &|_| 1.1),
            (crowd, &few),
        ],
        rng,
    )
}

/// `unmasked` random scores at random positions (cut to `len`), the rest masked.
fn masked_row(len: usize, unmasked: usize, rng: &mut StdRng) -> Vec<f32> {
    let mut row: Vec<f32> = (0..len)
        .map(|i| {
            if i < unmasked {
                rng.gen_range(-4.0f32..4.0)
            } else {
                MASKED
            }
        })
        .collect();
    row.shuffle(rng);
    row
}

/// A score maker for [`layered_row`].
type Layer<'a> = &'a dyn Fn(&mut StdRng) -> f32;

/// Layers of (count, score) from the top, the rest -1.0, shuffled (cut to `len`).
fn layered_row(len: usize, layers: &[(usize, Layer)], rng: &mut StdRng) -> Vec<f32> {
    let mut row = Vec::with_capacity(len);
    for &(count, score) in layers {
        for _ in 0..count.min(len - row.len()) {
            row.push(score(rng));
        }
    }
    row.resize(len, -1.0);
    row.shuffle(rng);
    row
}

/// Rows `[lens.len(), stride]` with the given lengths; positions past a row's length hold NaN, so
/// a kernel that reads them is caught (NaN among the keys is an error).
pub fn rows(pattern: Pattern, lens: &[u32], stride: usize, top: TopK, seed: u64) -> Vec<f32> {
    let mut out = Vec::with_capacity(lens.len() * stride);
    for (r, &len) in lens.iter().enumerate() {
        let mut row = pattern.row(
            len as usize,
            top,
            seed ^ (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        row.resize(stride, f32::NAN);
        out.extend(row);
    }
    out
}
