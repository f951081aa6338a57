//! The GPU tests' scenes and checkers, on the CPU: results computed by the reference itself pass
//! the checks, and corrupted ones (a new key read from its poisoned slot, a flipped score, a
//! missing -inf) fail them. This is what the GPU run relies on to tell right from wrong.

mod support;

use indexer::layout::{Limits, ScorePlan};
use indexer::reference::{
    key_from_projection, query_heads_from_projection, row_query, score_row, IndexerDims,
    IndexerOptions, ScaledVector,
};
use model::ModelConfig;
use support::{bf16_value, check_scores, e4m3_table, CacheKind, Inputs, Launched, Request, Scene};

/// What a correct launch of `set` would return, from the reference: keys and queries from the
/// inputs, scores over the scene's old keys and the launch's new ones (or, with `poisoned`, the
/// new keys as the poisoned cache holds them).
fn reference_launch(scene: &Scene, set: &[usize], poisoned: bool) -> Launched {
    let cfg = ModelConfig::preset("tiny").unwrap();
    let dims = scene.dims;
    let opts = IndexerOptions::kernels(&cfg);
    let rows = scene.rows(set);
    let plan = ScorePlan::new(&rows, &scene.table, Limits::default()).unwrap();
    let inputs = Inputs::random(&dims, rows.len(), 3);
    let mut keys = Vec::new();
    let mut queries = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        let d = dims.head_dim;
        let proj: Vec<f32> = inputs.key_proj[r * d..][..d]
            .iter()
            .map(|&b| bf16_value(b))
            .collect();
        keys.push(
            key_from_projection(
                &dims,
                &opts,
                &proj,
                &inputs.norm_weight,
                &inputs.norm_bias,
                row.position.into(),
            )
            .unwrap(),
        );
        let n = dims.heads * d;
        let proj: Vec<f32> = inputs.query_proj[r * n..][..n]
            .iter()
            .map(|&b| bf16_value(b))
            .collect();
        let heads = query_heads_from_projection(&dims, &opts, &proj, row.position.into()).unwrap();
        queries
            .push(row_query(&dims, &heads, &inputs.gates[r * dims.heads..][..dims.heads]).unwrap());
    }
    let decode = e4m3_table();
    let mut scores = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        let request = row.request as usize;
        let first_new = scene.requests[request].first_position();
        let all: Vec<ScaledVector> = (0..plan.stride)
            .map(|t| {
                let mut values = vec![0.0; dims.head_dim];
                if t >= first_new && t <= row.position && !poisoned {
                    let i = rows
                        .iter()
                        .position(|x| x.request == row.request && x.position == t)
                        .unwrap();
                    return keys[i].clone();
                }
                let scale = if t < scene.requests[request].last_position + 1 {
                    scene.old_key(request, t, &mut values, &decode)
                } else {
                    1.0
                };
                ScaledVector { values, scale }
            })
            .collect();
        scores.extend(score_row(&dims, &queries[r], &all, row.position.into()).unwrap());
    }
    Launched {
        run_tags: vec![1; plan.runs.len()],
        tag: 1,
        plan,
        scores,
        queries,
        keys,
    }
}

fn scene(kind: CacheKind) -> Scene {
    let dims = IndexerDims::new(&ModelConfig::preset("tiny").unwrap()).unwrap();
    let requests = vec![
        Request {
            rows: 1,
            last_position: 300,
        },
        Request {
            rows: 8,
            last_position: 700,
        },
        Request {
            rows: 3,
            last_position: 64,
        },
    ];
    Scene::new(dims, requests, kind, 11)
}

#[test]
fn reference_results_pass_for_every_cache_kind() {
    for kind in [
        CacheKind::Random,
        CacheKind::Ties,
        CacheKind::Zeros,
        CacheKind::Recent,
    ] {
        let scene = scene(kind);
        let launched = reference_launch(&scene, &[0, 1, 2], false);
        let stats = check_scores(&scene, &launched).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        assert!(stats.worst < 1e-6, "{kind:?}: {}", stats.worst);
    }
}

#[test]
fn new_keys_read_from_their_poisoned_slots_fail() {
    let scene = scene(CacheKind::Random);
    let launched = reference_launch(&scene, &[1], true);
    assert!(check_scores(&scene, &launched).is_err());
}

#[test]
fn corrupted_scores_fail() {
    let scene = scene(CacheKind::Recent);
    let good = reference_launch(&scene, &[0, 1], false);
    let mut flipped = good.clone();
    flipped.scores[250] = f32::from_bits(flipped.scores[250].to_bits() ^ 0x0040_0000);
    assert!(
        check_scores(&scene, &flipped).is_err(),
        "flipped bits passed"
    );
    let mut finite_tail = good.clone();
    finite_tail.scores[301] = 0.0;
    assert!(
        check_scores(&scene, &finite_tail).is_err(),
        "a finite score past the row passed"
    );
    let mut masked = good;
    masked.scores[5] = f32::NEG_INFINITY;
    assert!(
        check_scores(&scene, &masked).is_err(),
        "-inf before the row's position passed"
    );
}
