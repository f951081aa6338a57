//! Properties of the reference: its list holds exactly the sort-based top-k of the unmasked keys,
//! in the contract's order (keys above P by position, then keys with prefix P above T by
//! position, then ties; fewer than k unmasked: all of them by position), never a masked one.

use model::Preset;
use proptest::prelude::*;
use select::cases::{rank_high, Pattern, CROWD_HIGH, RANK_BESIDE};
use select::check::missed;
use select::layout::{TopK, REG_RANK_BUCKET, REG_RANK_ROOM, REG_STAGE_ROOM};
use select::reference::{is_masked, radix_key, select_row, sorted_top_k};

/// k of GLM-5, from its preset.
fn glm5() -> TopK {
    TopK::preset(Preset::Glm5).unwrap()
}

proptest! {
    #[test]
    fn the_list_is_the_exact_top_k_in_contract_order(
        pattern in prop::sample::select(Pattern::ALL.to_vec()),
        len in 0..3000usize,
        k in 1..=200u32,
        seed in any::<u64>(),
    ) {
        let top = TopK::new(k).unwrap();
        let scores = pattern.row(len, top, seed);
        let sel = select_row(&scores, top).unwrap();
        let expected = sorted_top_k(&scores, top).unwrap();
        prop_assert_eq!(sel.list.len(), k as usize);
        prop_assert_eq!(missed(&sel.list, &expected), 0);
        let selected: Vec<i32> = sel.list.iter().copied().filter(|&e| e >= 0).collect();
        prop_assert_eq!(selected.len(), expected.len());
        prop_assert!(sel.list[selected.len()..].iter().all(|&e| e == -1));
        prop_assert!(selected.iter().all(|&p| !is_masked(scores[p as usize])));
        let Some(th) = sel.threshold else {
            // Every unmasked key, in position order.
            let unmasked: Vec<i32> = (0..len as i32).filter(|&p| !is_masked(scores[p as usize])).collect();
            prop_assert!(unmasked.len() < k as usize || len <= k as usize);
            prop_assert_eq!(selected, unmasked);
            return Ok(());
        };
        prop_assert!([12, 24, 32].contains(&th.prefix_bits));
        let key = |p: i32| radix_key(scores[p as usize]);
        let shift = 32 - th.prefix_bits;
        // The class of each entry never decreases along the list, and positions rise within one.
        let class = |p: i32| {
            let x = key(p);
            if x >> shift > th.key >> shift { 0 } else if x > th.key { 1 } else { 2 }
        };
        for w in selected.windows(2) {
            let (a, b) = (class(w[0]), class(w[1]));
            prop_assert!(a < b || (a == b && w[0] < w[1]), "{:?} then {:?}", w[0], w[1]);
        }
        prop_assert_eq!(selected.iter().filter(|&&p| class(p) == 0).count() as u32, th.above);
    }
}

/// The crowd patterns: a crowd of exactly the candidate room sharing T's 12-bit prefix stops P
/// there, one key more sends it on to 24 bits (the contract's 12-bit stop); the registers kernel's
/// stage room, and one more, both stop at 12.
#[test]
fn crowd_patterns_fill_their_rooms_and_pass_them_by_one() {
    let top = glm5();
    for (pattern, sharing, stop) in [
        (Pattern::RoomFull, top.room(), 12),
        (Pattern::RoomPlusOne, top.room() + 1, 24),
        (Pattern::StageFull, REG_STAGE_ROOM, 12),
        (Pattern::StagePlusOne, REG_STAGE_ROOM + 1, 12),
    ] {
        let scores = pattern.row(8192, top, 3);
        let th = select_row(&scores, top).unwrap().threshold.unwrap();
        let mut crowd: Vec<u32> = scores
            .iter()
            .filter(|&&s| (1.0..1.125).contains(&s))
            .map(|&s| radix_key(s))
            .collect();
        assert_eq!(crowd.len() as u32, sharing, "{}", pattern.name());
        assert_eq!(th.prefix_bits, stop, "{}", pattern.name());
        if stop == 12 {
            assert_eq!(th.sharing, sharing, "{}", pattern.name());
        }
        // T is the crowd's (k - CROWD_HIGH)-th largest.
        crowd.sort_unstable_by(|a, b| b.cmp(a));
        let t_rank = top.k() as usize - CROWD_HIGH;
        assert_eq!(crowd[t_rank - 1], th.key, "{}", pattern.name());
    }
}

/// The rank patterns: a crowd of exactly the registers kernel's rank room (or rank bucket)
/// sharing T's 24-bit prefix (and so its 20-bit one), and one key more; the keys beside it share
/// T's 12-bit prefix but not its 20-bit one, and P stops at 12 bits. T repeats.
#[test]
fn rank_patterns_fill_the_rank_room_and_bucket_and_pass_them_by_one() {
    let top = glm5();
    for (pattern, crowd_len) in [
        (Pattern::RankFull, REG_RANK_ROOM),
        (Pattern::RankPlusOne, REG_RANK_ROOM + 1),
        (Pattern::BucketFull, REG_RANK_BUCKET),
        (Pattern::BucketPlusOne, REG_RANK_BUCKET + 1),
    ] {
        let scores = pattern.row(8192, top, 5);
        let th = select_row(&scores, top).unwrap().threshold.unwrap();
        let keys: Vec<u32> = scores.iter().map(|&s| radix_key(s)).collect();
        let sharing = |bits: u32| {
            keys.iter()
                .filter(|&&k| k >> (32 - bits) == th.key >> (32 - bits))
                .count()
        };
        assert_eq!(sharing(20), sharing(24), "{}", pattern.name());
        let shift = 32 - 24;
        let mut crowd: Vec<u32> = keys
            .iter()
            .copied()
            .filter(|k| k >> shift == th.key >> shift)
            .collect();
        assert_eq!(crowd.len() as u32, crowd_len, "{}", pattern.name());
        assert_eq!(th.prefix_bits, 12, "{}", pattern.name());
        assert_eq!(
            th.sharing,
            crowd_len + RANK_BESIDE as u32,
            "{}",
            pattern.name()
        );
        crowd.sort_unstable_by(|a, b| b.cmp(a));
        let t_rank = top.k() as usize - rank_high(crowd_len as usize, top) - RANK_BESIDE;
        assert_eq!(crowd[t_rank - 1], th.key, "{}", pattern.name());
        assert!(
            crowd.iter().filter(|&&k| k == th.key).count() > 1,
            "{}: T repeats",
            pattern.name()
        );
    }
}
