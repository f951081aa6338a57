//! The MLA layouts tile what they describe exactly once.

use mla::{CacheLayout, HeadLayout};
use model::{CacheFormat, ModelConfig};
use proptest::prelude::*;

fn config(tiles: usize, rope_pairs: usize, heads: usize, nope: usize, v: usize) -> ModelConfig {
    ModelConfig {
        kv_lora_rank: 128 * tiles,
        qk_rope_head_dim: 2 * rope_pairs,
        num_attention_heads: heads,
        qk_nope_head_dim: nope,
        v_head_dim: v,
        ..ModelConfig::preset("tiny").unwrap()
    }
}

#[test]
fn glm5_records_are_656_and_1152_bytes() {
    let cfg = ModelConfig::preset("glm-5").unwrap();
    let fp8 = CacheLayout::new(&cfg, CacheFormat::Fp8).unwrap();
    assert_eq!(
        (fp8.latent_bytes(), fp8.scale_bytes(), fp8.rope_bytes()),
        (0..512, 512..528, 528..656)
    );
    assert_eq!(
        CacheLayout::new(&cfg, CacheFormat::Bf16)
            .unwrap()
            .bytes_per_token(),
        1152
    );
}

#[test]
fn fp8_needs_whole_tiles() {
    let cfg = ModelConfig {
        kv_lora_rank: 200,
        ..ModelConfig::preset("tiny").unwrap()
    };
    assert!(CacheLayout::new(&cfg, CacheFormat::Fp8).is_err());
    assert!(CacheLayout::new(&cfg, CacheFormat::Bf16).is_ok());
}

proptest! {
    #[test]
    fn cache_record_parts_tile_the_record(tiles in 1usize..8, pairs in 1usize..64, fp8 in any::<bool>()) {
        let cfg = config(tiles, pairs, 4, 8, 8);
        let format = if fp8 { CacheFormat::Fp8 } else { CacheFormat::Bf16 };
        let layout = CacheLayout::new(&cfg, format).unwrap();
        let parts = [layout.latent_bytes(), layout.scale_bytes(), layout.rope_bytes()];
        prop_assert_eq!(parts[0].start, 0);
        prop_assert_eq!(parts[0].end, parts[1].start);
        prop_assert_eq!(parts[1].end, parts[2].start);
        prop_assert_eq!(parts[2].end, layout.bytes_per_token());
        prop_assert!(layout.matches_model(&cfg));
        prop_assert_eq!(layout.scale_bytes().len(), if fp8 { 4 * tiles } else { 0 });
    }

    #[test]
    fn head_slices_partition_the_weights(heads in 1usize..32, nope in 1usize..64, pairs in 1usize..32, v in 1usize..64) {
        let h = HeadLayout::new(&config(2, pairs, heads, nope, v));
        let mut q = vec![0u8; h.q_b_rows()];
        let mut kv = vec![0u8; h.kv_b_rows()];
        let mut o = vec![0u8; h.o_cols()];
        for head in 0..heads {
            prop_assert_eq!(h.q_nope_rows(head).len(), nope);
            prop_assert_eq!(h.q_rope_rows(head).len(), 2 * pairs);
            for r in h.q_nope_rows(head).chain(h.q_rope_rows(head)) { q[r] += 1; }
            for r in h.uk_rows(head).chain(h.uv_rows(head)) { kv[r] += 1; }
            for c in h.o_block(head) { o[c] += 1; }
        }
        prop_assert!(q.iter().chain(&kv).chain(&o).all(|&n| n == 1));
    }
}

#[test]
fn new_tokens_go_to_their_page_table_slots() {
    use mla::layout::new_slots;
    use model::paging::{PageTable, PAGE_TOKENS};
    let table = PageTable::new(&[vec![9, 4], vec![2]]).unwrap();
    let slots = new_slots(&table, &[(0, 70), (0, 71), (1, 0)]).unwrap();
    assert_eq!(
        slots,
        vec![4 * PAGE_TOKENS + 6, 4 * PAGE_TOKENS + 7, 2 * PAGE_TOKENS]
    );
    let past = new_slots(&table, &[(1, PAGE_TOKENS)])
        .unwrap_err()
        .to_string();
    assert!(
        past.contains("request 1") && past.contains("1 pages"),
        "{past}"
    );
}

fn attend_shape(union: usize) -> mla::layout::AttendShape {
    let cfg = ModelConfig::preset("glm-5").unwrap();
    let cache = CacheLayout::new(&cfg, CacheFormat::Fp8).unwrap();
    mla::layout::AttendShape::new(cache, 8, union).unwrap()
}

fn split(group_rows: u32, block: u32) -> mla::layout::SplitChoice {
    mla::layout::SplitChoice {
        group_rows,
        block,
        combine_queries: 1,
    }
}

fn rows(rows: u32, selected: u32) -> mla::layout::RequestRows {
    mla::layout::RequestRows { rows, selected }
}

#[test]
fn a_split_block_larger_than_k_is_refused() {
    use mla::layout::AttendPlan;
    let shape = attend_shape(128);
    let err = AttendPlan::new(&shape, 16, &[rows(1, 16)], split(1, 64))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("block of 64") && err.contains("k = 16"),
        "{err}"
    );
    // Even when no slot is selected: the one split still waits on a block of boxes.
    assert!(AttendPlan::new(&shape, 16, &[rows(1, 0)], split(1, 17)).is_err());
    assert!(AttendPlan::new(&shape, 16, &[rows(1, 16)], split(1, 16)).is_ok());
}

#[test]
fn splits_reaching_past_k_are_refused() {
    use mla::layout::AttendPlan;
    // Three rows in a union of 128: a block of 42, which does not divide 2048.
    let shape = attend_shape(128);
    let err = AttendPlan::new(&shape, 2048, &[rows(3, 2048)], split(4, 64))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("49 splits of 42") && err.contains("k = 2048"),
        "{err}"
    );
    // The same cut is fine while the splits stay inside the row's k.
    let plan = AttendPlan::new(&shape, 2048, &[rows(3, 1500)], split(4, 64)).unwrap();
    assert_eq!((plan.groups[0].block, plan.groups[0].splits), (42, 36));
}

proptest! {
    /// Every plan accepted keeps each split's wait (`block` boxes of each row from
    /// `split * block`) inside the row's k and covers the row's selected slots.
    #[test]
    fn accepted_plans_wait_inside_k(
        topk in 1u32..3000,
        block in 1u32..300,
        group_rows in 1u32..8,
        union in 1usize..16,
        requests in prop::collection::vec((1u32..10, 0u32..=100), 1..4),
    ) {
        use mla::layout::AttendPlan;
        let shape = attend_shape(16 * union);
        let requests: Vec<_> = requests
            .iter()
            .map(|&(r, percent)| rows(r, topk * percent / 100))
            .collect();
        let plan = AttendPlan::new(&shape, topk, &requests, split(group_rows, block));
        if let Ok(plan) = &plan {
            for g in &plan.groups {
                prop_assert!(g.block <= block && g.splits >= 1);
                prop_assert!(g.splits * g.block <= topk);
                prop_assert!(g.splits * g.block >= requests[g.request as usize].selected);
            }
        }
        if block > topk {
            prop_assert!(plan.is_err());
        }
        // A block that divides k and fits the union at every group size is never refused.
        if topk % block == 0 && (block * group_rows) as usize <= 16 * union {
            prop_assert!(plan.is_ok(), "{:?}", plan.err());
        }
    }
}
