//! Byte counts checked against numbers worked out by hand from spec §1.5 and §3.

use model::traffic::{
    experts_touched, floor_us, launch_traffic, step_traffic, weight_storage, Formats, LaunchKind,
    Load, H200_COPY_BYTES_PER_S,
};
use model::{
    index_cache_bytes_per_token, mla_cache_bytes_per_token, CacheFormat, Preset, RankShapes,
    WeightFormat,
};

const FP8: Formats = Formats {
    weights: WeightFormat::Fp8,
    cache: CacheFormat::Fp8,
};
const BF16: Formats = Formats {
    weights: WeightFormat::Bf16,
    cache: CacheFormat::Bf16,
};

fn glm5(tp: usize) -> RankShapes {
    RankShapes::new(&Preset::Glm5.config(), tp).unwrap()
}

/// fp32 scales of an FP8 [rows, cols] matrix in 128 x 128 blocks.
fn scales(rows: u64, cols: u64) -> u64 {
    rows.div_ceil(128) * cols.div_ceil(128) * 4
}

#[test]
fn cache_bytes_per_token() {
    let glm = Preset::Glm5.config();
    assert_eq!(mla_cache_bytes_per_token(&glm, CacheFormat::Fp8), 656);
    assert_eq!(mla_cache_bytes_per_token(&glm, CacheFormat::Bf16), 1152);
    assert_eq!(index_cache_bytes_per_token(&glm), 132);
    let tiny = Preset::Tiny.config();
    // 256 e4m3 + 2 fp32 scales + 32 bf16 rope.
    assert_eq!(
        mla_cache_bytes_per_token(&tiny, CacheFormat::Fp8),
        256 + 8 + 64
    );
    assert_eq!(index_cache_bytes_per_token(&tiny), 68);
}

#[test]
fn one_routed_expert_at_full_width() {
    let t = launch_traffic(&glm5(1), LaunchKind::MoeFull, FP8, Load::decode(1, 1));
    assert_eq!(
        t.routed_expert_bytes,
        3 * 2048 * 6144 + 3 * scales(2048, 6144)
    );
    assert_eq!(t.routed_expert_bytes, 37_757_952);
    // The shared expert has the same shapes.
    assert_eq!(t.weights.shared_expert, t.routed_expert_bytes);
    let t = launch_traffic(&glm5(1), LaunchKind::MoeFull, BF16, Load::decode(1, 1));
    assert_eq!(t.routed_expert_bytes, 2 * 3 * 2048 * 6144);
}

#[test]
fn one_routed_expert_at_tp8() {
    let t = launch_traffic(&glm5(8), LaunchKind::MoeFull, FP8, Load::decode(1, 1));
    assert_eq!(t.routed_expert_bytes, 3 * (256 * 6144 + scales(256, 6144)));
}

#[test]
fn experts_touched_is_capped_by_the_expert_count() {
    let shapes = glm5(1);
    assert_eq!(experts_touched(&shapes, 1), 8);
    assert_eq!(experts_touched(&shapes, 4), 32);
    assert_eq!(experts_touched(&shapes, 32), 256);
    assert_eq!(experts_touched(&shapes, 1000), 256);
    let one = launch_traffic(&shapes, LaunchKind::MoeShared, FP8, Load::decode(1, 1));
    let many = launch_traffic(&shapes, LaunchKind::MoeShared, FP8, Load::decode(4, 1));
    assert_eq!(one.weights.routed_experts, 8 * one.routed_expert_bytes);
    assert_eq!(many.weights.routed_experts, 32 * one.routed_expert_bytes);
    assert_eq!(many.weights.replicated, one.weights.replicated);
}

#[test]
fn moe_full_layer_weights_at_full_width() {
    let t = launch_traffic(&glm5(1), LaunchKind::MoeFull, FP8, Load::decode(1, 1));
    let norms = 2 * (6144 + 2048 + 512 + 6144 + 128 + 128);
    let replicated = 2048 * 6144 + scales(2048, 6144) // q_a_proj
        + 576 * 6144 + scales(576, 6144) // kv_a_proj_with_mqa
        + 4096 * 2048 + scales(4096, 2048) // indexer.wq_b
        + 128 * 6144 + scales(128, 6144) // indexer.wk
        + 2 * 32 * 6144 // indexer.weights_proj, bf16
        + 2 * 256 * 6144 + 4 * 256 // router bf16, bias fp32
        + norms;
    assert_eq!(t.weights.replicated, replicated);
    assert_eq!(t.weights.replicated, 28_873_344);
    let sharded = 16384 * 2048 + scales(16384, 2048) // q_b_proj
        + 28672 * 512 + scales(28672, 512) // kv_b_proj
        + 6144 * 16384 + scales(6144, 16384); // o_proj
    assert_eq!(t.weights.sharded, sharded);
}

#[test]
fn shared_indexer_layer_drops_indexer_weights_and_index_cache() {
    let shapes = RankShapes::new(&Preset::Glm52.config(), 1).unwrap();
    let load = Load::decode(1, 10_000);
    let full = launch_traffic(&shapes, LaunchKind::MoeFull, FP8, load);
    let shared = launch_traffic(&shapes, LaunchKind::MoeShared, FP8, load);
    let indexer = 4096 * 2048
        + scales(4096, 2048)
        + 128 * 6144
        + scales(128, 6144)
        + 2 * 32 * 6144
        + 2 * 2 * 128;
    assert_eq!(full.weights.replicated - shared.weights.replicated, indexer);
    assert_eq!(shared.index_cache_read, 0);
    assert_eq!(full.index_cache_read, 10_000 * 132);
    assert_eq!(shared.mla_cache_read, full.mla_cache_read);
    assert_eq!(full.cache_write - shared.cache_write, 132);
}

#[test]
fn cache_reads_follow_selection_and_requests() {
    let shapes = glm5(8);
    // 3 requests x 4 verify rows, 100K-token context: each row reads 2048 selected tokens, each
    // request scores all 100K keys once.
    let load = Load {
        requests: 3,
        rows_per_request: 4,
        context: 100_000,
    };
    let t = launch_traffic(&shapes, LaunchKind::MoeFull, FP8, load);
    assert_eq!(t.mla_cache_read, 12 * 2048 * 656);
    assert_eq!(t.index_cache_read, 3 * 100_000 * 132);
    assert_eq!(t.cache_write, 12 * (656 + 132));
    // A short context selects everything it has.
    let t = launch_traffic(&shapes, LaunchKind::DenseFull, BF16, Load::decode(1, 100));
    assert_eq!(t.mla_cache_read, 100 * 1152);
}

#[test]
fn tail_reads_the_lm_head_shard() {
    let t = launch_traffic(&glm5(8), LaunchKind::Tail, FP8, Load::decode(1, 1));
    assert_eq!(t.weights.sharded, 2 * 19_360 * 6144);
    assert_eq!(t.weights.replicated, 2 * 6144);
    assert_eq!(t.cache_bytes(), 0);
}

#[test]
fn glm5_step_counts_every_layer_once() {
    let cfg = Preset::Glm52.config();
    let shapes = RankShapes::new(&cfg, 1).unwrap();
    let plan = cfg.layer_plan().unwrap();
    let step = step_traffic(&shapes, &plan, FP8, Load::decode(1, 4096));
    let counts: Vec<(LaunchKind, u64)> = step.launches.iter().map(|(t, n)| (t.kind, *n)).collect();
    assert_eq!(
        counts,
        [
            (LaunchKind::DenseFull, 3),
            (LaunchKind::MoeShared, 57),
            (LaunchKind::MoeFull, 18),
            (LaunchKind::Tail, 1),
        ]
    );
    assert_eq!(step.embedding_read, 2 * 6144);
    assert_eq!(
        step.total_bytes(),
        step.weight_bytes() + step.cache_bytes() + step.embedding_read
    );
}

#[test]
fn glm5_parameter_counts_match_the_published_ones() {
    // 744B total (with the MTP layer, which is not counted here) and 40B active (spec §1.1).
    let cfg = Preset::Glm5.config();
    let shapes = RankShapes::new(&cfg, 1).unwrap();
    let plan = cfg.layer_plan().unwrap();
    let stored = weight_storage(&shapes, &plan, WeightFormat::Bf16).total();
    let total_params = (stored / 2) as f64;
    assert!((7.3e11..7.5e11).contains(&total_params), "{total_params:e}");
    let step = step_traffic(&shapes, &plan, BF16, Load::decode(1, 1));
    let active_params = (step.weight_bytes() / 2) as f64;
    assert!(
        (3.9e10..4.3e10).contains(&active_params),
        "{active_params:e}"
    );
}

#[test]
fn floor_is_bytes_over_bandwidth() {
    assert_eq!(floor_us(4_000_000, H200_COPY_BYTES_PER_S), 1.0);
    assert_eq!(floor_us(0, H200_COPY_BYTES_PER_S), 0.0);
}
