//! The CPU reference against hand-computed values and against the identities of spec §3.

use indexer::gpu::KernelConfig;
use indexer::reference::{
    key_from_projection, query, query_heads_from_projection, row_query, score_row, IndexerDims,
    IndexerOptions, IndexerWeights, RowQuery, ScaledVector, VectorFormat,
};
use model::numerics::RopeStyle;
use model::ModelConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn random(rng: &mut StdRng, n: usize, amplitude: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.gen_range(-amplitude..amplitude))
        .collect()
}

/// A request's keys at positions 0..n and one row's query at `position`, from random projections.
struct Case {
    dims: IndexerDims,
    key_projections: Vec<Vec<f32>>,
    norm_weight: Vec<f32>,
    norm_bias: Vec<f32>,
    query_projection: Vec<f32>,
    gates: Vec<f32>,
    position: u64,
}

impl Case {
    fn new(cfg: &ModelConfig, keys: usize, seed: u64) -> Case {
        let dims = IndexerDims::new(cfg).unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        Case {
            dims,
            key_projections: (0..keys)
                .map(|_| random(&mut rng, dims.head_dim, 2.0))
                .collect(),
            norm_weight: (0..dims.head_dim)
                .map(|_| rng.gen_range(0.5..1.5))
                .collect(),
            norm_bias: random(&mut rng, dims.head_dim, 0.2),
            query_projection: random(&mut rng, dims.heads * dims.head_dim, 1.0),
            gates: random(&mut rng, dims.heads, 1.0),
            position: keys as u64 - 3,
        }
    }

    fn keys(&self, opts: &IndexerOptions) -> Vec<ScaledVector> {
        self.key_projections
            .iter()
            .enumerate()
            .map(|(t, p)| {
                key_from_projection(
                    &self.dims,
                    opts,
                    p,
                    &self.norm_weight,
                    &self.norm_bias,
                    t as u64,
                )
                .unwrap()
            })
            .collect()
    }

    fn query(&self, opts: &IndexerOptions) -> RowQuery {
        let heads =
            query_heads_from_projection(&self.dims, opts, &self.query_projection, self.position)
                .unwrap();
        row_query(&self.dims, &heads, &self.gates).unwrap()
    }

    fn scores(&self, opts: &IndexerOptions) -> Vec<f32> {
        score_row(
            &self.dims,
            &self.query(opts),
            &self.keys(opts),
            self.position,
        )
        .unwrap()
    }
}

fn exact(cfg: &ModelConfig) -> IndexerOptions {
    IndexerOptions {
        hadamard: false,
        query: VectorFormat::F32,
        key: VectorFormat::F32,
        ..IndexerOptions::kernels(cfg)
    }
}

fn largest_gap(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .filter(|(x, _)| x.is_finite())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn largest_magnitude(a: &[f32]) -> f32 {
    a.iter()
        .filter(|x| x.is_finite())
        .map(|x| x.abs())
        .fold(0.0, f32::max)
}

#[test]
fn hand_computed_scores() {
    // Two heads of 4 dims, no rope (position 0 turns nothing), no rotation, exact storage.
    let dims = IndexerDims {
        heads: 2,
        head_dim: 4,
        rope_dim: 2,
        rope_theta: 1e4,
    };
    let row = RowQuery {
        q: vec![1.0, 2.0, 0.0, 0.0, /* head 1 */ 0.0, 0.0, -1.0, 1.0],
        weights: vec![0.5, 2.0],
    };
    let key = |values: [f32; 4], scale| ScaledVector {
        values: values.to_vec(),
        scale,
    };
    let keys = [
        key([1.0, 1.0, 1.0, 3.0], 1.0),  // dots 3 and 2
        key([-1.0, 0.0, 2.0, 0.0], 4.0), // dots -1 (relu 0) and -2 (relu 0)
        key([0.0, 1.0, 0.0, 1.0], 0.5),  // dots 2 and 1
        key([9.0, 9.0, 9.0, 9.0], 1.0),  // past the position
    ];
    let scores = score_row(&dims, &row, &keys, 2).unwrap();
    assert_eq!(scores[0], 0.5 * 3.0 + 2.0 * 2.0);
    assert_eq!(scores[1], 0.0);
    assert_eq!(scores[2], (0.5 * 2.0 + 2.0 * 1.0) * 0.5);
    assert_eq!(scores[3], f32::NEG_INFINITY);
}

#[test]
fn head_weights_carry_the_constant_and_the_query_scale() {
    let cfg = ModelConfig::preset("glm-5").unwrap();
    let dims = IndexerDims::new(&cfg).unwrap();
    let heads: Vec<ScaledVector> = (0..dims.heads)
        .map(|h| ScaledVector {
            values: vec![0.0; dims.head_dim],
            scale: 2f32.powi(h as i32 - 8),
        })
        .collect();
    let gates: Vec<f32> = (0..dims.heads).map(|h| 1.0 + h as f32).collect();
    let row = row_query(&dims, &heads, &gates).unwrap();
    for h in 0..dims.heads {
        // 32 * 128 = 4096 = 64^2: the constant is exactly 1/64.
        assert_eq!(row.weights[h], gates[h] / 64.0 * heads[h].scale, "head {h}");
    }
}

#[test]
fn masked_positions_are_minus_infinity_and_the_rest_finite() {
    for preset in ["tiny", "glm-5"] {
        let cfg = ModelConfig::preset(preset).unwrap();
        let case = Case::new(&cfg, 40, 1);
        for opts in [IndexerOptions::kernels(&cfg), exact(&cfg)] {
            let scores = case.scores(&opts);
            for (t, s) in scores.iter().enumerate() {
                if t as u64 <= case.position {
                    assert!(s.is_finite(), "{preset}: score {t} = {s}");
                } else {
                    assert_eq!(*s, f32::NEG_INFINITY, "{preset}: score {t}");
                }
            }
        }
    }
}

#[test]
fn interleaved_and_half_split_rope_give_different_scores() {
    let cfg = ModelConfig::preset("glm-5").unwrap();
    let case = Case::new(&cfg, 64, 2);
    let interleaved = case.scores(&exact(&cfg));
    let half_split = case.scores(&IndexerOptions {
        rope: RopeStyle::HalfSplit,
        ..exact(&cfg)
    });
    let gap = largest_gap(&interleaved, &half_split);
    assert!(
        gap > 1e-2 * largest_magnitude(&interleaved),
        "the rope styles agree to {gap}"
    );
}

#[test]
fn hadamard_leaves_exact_scores_unchanged_but_moves_fp8_codes() {
    for preset in ["tiny", "glm-5"] {
        let cfg = ModelConfig::preset(preset).unwrap();
        let case = Case::new(&cfg, 48, 3);
        let without = case.scores(&exact(&cfg));
        let with = case.scores(&IndexerOptions {
            hadamard: true,
            ..exact(&cfg)
        });
        let gap = largest_gap(&with, &without);
        assert!(
            gap <= 1e-5 * largest_magnitude(&without),
            "{preset}: rotation changed exact scores by {gap}"
        );
        // Negative control: the switch does act. Stored FP8 keys differ with and without it.
        let fp8 = IndexerOptions::sglang_fused(&cfg);
        let rotated = case.keys(&IndexerOptions {
            hadamard: true,
            ..fp8
        });
        assert_ne!(rotated, case.keys(&fp8), "{preset}: hadamard did nothing");
    }
}

#[test]
fn scores_depend_only_on_relative_position() {
    let cfg = ModelConfig::preset("tiny").unwrap();
    let case = Case::new(&cfg, 32, 4);
    let opts = exact(&cfg);
    let base = case.scores(&opts);
    // Shift the row and every key by the same amount: same dot products.
    let shift = 1000;
    let keys: Vec<ScaledVector> = case
        .key_projections
        .iter()
        .enumerate()
        .map(|(t, p)| {
            key_from_projection(
                &case.dims,
                &opts,
                p,
                &case.norm_weight,
                &case.norm_bias,
                t as u64 + shift,
            )
            .unwrap()
        })
        .collect();
    let heads = query_heads_from_projection(
        &case.dims,
        &opts,
        &case.query_projection,
        case.position + shift,
    )
    .unwrap();
    let row = row_query(&case.dims, &heads, &case.gates).unwrap();
    // Only the first keys.len() positions exist in the shifted copy; mask by the unshifted row.
    let shifted = score_row(&case.dims, &row, &keys, case.position).unwrap();
    let gap = largest_gap(&base, &shifted);
    assert!(gap <= 1e-4 * largest_magnitude(&base), "gap {gap}");
}

/// Spec §3.6: an FP8 key differs from the exact one by at most a half step of its E4M3 code per
/// element (2^-4 relative for normals, 2^-10 s absolute below them); bf16 q by 2^-9 relative. The
/// score error is bounded through Cauchy-Schwarz, head by head.
#[test]
fn fp8_scores_stay_within_the_quantisation_bound() {
    for preset in ["tiny", "glm-5"] {
        let cfg = ModelConfig::preset(preset).unwrap();
        let case = Case::new(&cfg, 200, 5);
        let dims = case.dims;
        let rotated_exact = IndexerOptions {
            hadamard: true,
            ..exact(&cfg)
        };
        let exact_keys = case.keys(&rotated_exact);
        let exact_query = case.query(&rotated_exact);
        let kernels = IndexerOptions::kernels(&cfg);
        let fp8 = case.scores(&kernels);
        let reference = score_row(&dims, &exact_query, &exact_keys, case.position).unwrap();
        let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
        let fp8_keys = case.keys(&kernels);
        let mut total_error = 0.0f64;
        for (t, key) in exact_keys
            .iter()
            .enumerate()
            .take(case.position as usize + 1)
        {
            let fp8_key = &fp8_keys[t];
            let key_error = 2f64.powi(-4) * norm(&key.values)
                + (dims.head_dim as f64).sqrt() * f64::from(fp8_key.scale) * 2f64.powi(-10);
            let bound: f64 = exact_query
                .q
                .chunks_exact(dims.head_dim)
                .zip(&exact_query.weights)
                .map(|(q, &w)| {
                    let q_norm = norm(q);
                    f64::from(w).abs()
                        * (q_norm * key_error
                            + 2f64.powi(-9) * q_norm * (norm(&key.values) + key_error))
                })
                .sum();
            let error = (f64::from(fp8[t]) - f64::from(reference[t])).abs();
            assert!(
                error <= bound * (1.0 + 1e-6),
                "{preset} key {t}: error {error} above bound {bound}"
            );
            total_error += error;
        }
        // Negative control: the FP8 path does quantise.
        assert!(total_error > 0.0, "{preset}: FP8 scores equal exact ones");
    }
}

#[test]
fn fp8_keys_have_power_of_two_scales_and_in_range_codes() {
    let cfg = ModelConfig::preset("glm-5").unwrap();
    let case = Case::new(&cfg, 16, 6);
    for key in case.keys(&IndexerOptions::kernels(&cfg)) {
        assert_eq!(key.scale.to_bits() & 0x7f_ffff, 0, "scale {}", key.scale);
        let largest = key.values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(
            largest <= 448.0 && largest > 224.0,
            "largest code {largest}"
        );
        assert_eq!(key.codes().len(), cfg.index_head_dim);
    }
}

#[test]
fn query_from_weights_matches_the_projection_path() {
    let cfg = ModelConfig::preset("tiny").unwrap();
    let dims = IndexerDims::new(&cfg).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let wq_b = random(&mut rng, dims.heads * dims.head_dim * cfg.q_lora_rank, 0.1);
    let wk = random(&mut rng, dims.head_dim * cfg.hidden_size, 0.1);
    let weights_proj = random(&mut rng, dims.heads * cfg.hidden_size, 0.1);
    let ones = vec![1.0; dims.head_dim];
    let zeros = vec![0.0; dims.head_dim];
    let w = IndexerWeights {
        wq_b: &wq_b,
        wk: &wk,
        k_norm_weight: &ones,
        k_norm_bias: &zeros,
        weights_proj: &weights_proj,
    };
    let c_q = random(&mut rng, cfg.q_lora_rank, 1.0);
    let x_hat = random(&mut rng, cfg.hidden_size, 1.0);
    let opts = IndexerOptions::transformers(&cfg);
    let row = query(&dims, &opts, &w, &c_q, &x_hat, 9).unwrap();
    // By hand: head 0, dim 40 (past the rope part, no rotation): a bf16-rounded dot product.
    let dot: f64 = (0..cfg.q_lora_rank)
        .map(|i| f64::from(wq_b[40 * cfg.q_lora_rank + i]) * f64::from(c_q[i]))
        .sum();
    assert_eq!(row.q[40], model::numerics::bf16_round(dot as f32));
    assert_eq!(row.weights.len(), dims.heads);
    // A wrong-sized input is an error, not a panic.
    assert!(query(&dims, &opts, &w, &c_q[1..], &x_hat, 9).is_err());
    let key = indexer::reference::key(&dims, &opts, &w, &x_hat, 9).unwrap();
    assert_eq!(key.values.len(), dims.head_dim);
}

#[test]
fn configs_the_indexer_cannot_run_are_rejected() {
    // Scores take any width; the Hadamard rotation needs a power of two, and the kernels refuse
    // a width it cannot rotate only when it is asked for.
    let mut cfg = ModelConfig::preset("tiny").unwrap();
    cfg.index_head_dim = 96;
    let dims = IndexerDims::new(&cfg).unwrap();
    let refused = KernelConfig::new(dims, &IndexerOptions::kernels(&cfg))
        .unwrap_err()
        .to_string();
    assert!(refused.contains("IndexerOptions::hadamard"), "{refused}");
    KernelConfig::new(dims, &IndexerOptions::sglang_fused(&cfg)).unwrap();
    let mut cfg = ModelConfig::preset("tiny").unwrap();
    cfg.qk_rope_head_dim = 128;
    assert!(IndexerDims::new(&cfg).is_err());
}
