//! The router and the MoE block against the formulas of spec §2.9 written out directly.

use model::numerics::{bf16_round, sigmoid, silu};
use model::weights::{Matrix, Synthetic};
use model::{ModelConfig, WeightFormat};
use moe::reference::{mlp, moe, route, MoeWeights, RouterWeights, Routing};

fn tiny() -> ModelConfig {
    ModelConfig::preset("tiny").unwrap()
}

fn input(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let z = ((seed << 32) | i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * 1.5
        })
        .collect()
}

#[test]
fn router_selects_by_biased_score_and_weights_by_plain_score() {
    // Four experts, logits 0, 1, 2, 3 (identity gate on a one-hot-free input).
    let gate = Matrix::new(
        4,
        4,
        (0..16)
            .map(|i| if i % 5 == 0 { 1.0 } else { 0.0 })
            .collect(),
    )
    .unwrap();
    // The bias lifts expert 0 above the others for selection only.
    let router = RouterWeights {
        gate,
        bias: vec![1.0, 0.0, 0.0, 0.0],
    };
    let routing = Routing {
        top_k: 2,
        norm_topk_prob: true,
        scaling: 2.5,
        n_group: 1,
        topk_group: 1,
    };
    let routes = route(&router, &routing, &[0.0, 1.0, 2.0, 3.0]).unwrap();
    assert_eq!(
        routes.iter().map(|r| r.expert).collect::<Vec<_>>(),
        vec![0, 3]
    );
    let (s0, s3) = (sigmoid(0.0), sigmoid(3.0));
    assert!((routes[0].weight - s0 / (s0 + s3) * 2.5).abs() < 1e-6);
    assert!((routes[0].weight + routes[1].weight - 2.5).abs() < 1e-6);

    // Equal biased scores: the lower index wins.
    let tied = RouterWeights {
        gate: Matrix::new(4, 4, vec![0.0; 16]).unwrap(),
        bias: vec![0.0; 4],
    };
    let routes = route(&tied, &routing, &[1.0; 4]).unwrap();
    assert_eq!(
        routes.iter().map(|r| r.expert).collect::<Vec<_>>(),
        vec![0, 1]
    );

    let unnormalised = Routing {
        norm_topk_prob: false,
        ..routing
    };
    let routes = route(&tied, &unnormalised, &[1.0; 4]).unwrap();
    assert!((routes[0].weight - 0.5 * 2.5).abs() < 1e-6);
}

#[test]
fn moe_is_the_weighted_sum_of_its_experts_plus_the_shared_one() {
    let cfg = tiny();
    let weights = MoeWeights::load(
        &Synthetic::new(&cfg, 3, WeightFormat::Bf16).unwrap(),
        &cfg,
        2,
    )
    .unwrap();
    let routing = Routing::new(&cfg);
    let xs: Vec<Vec<f32>> = (0..3).map(|s| input(cfg.hidden_size, s)).collect();
    let out = moe(&weights, &routing, &xs, false).unwrap();
    for (r, x) in xs.iter().enumerate() {
        let routes = &out.routes[r];
        assert_eq!(routes.len(), cfg.num_experts_per_tok);
        // Written out: SwiGLU per expert, no rounding anywhere.
        let swiglu = |w: &moe::reference::MlpWeights| -> Vec<f64> {
            let g = w.gate.matvec(x).unwrap();
            let u = w.up.matvec(x).unwrap();
            let h: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
            w.down
                .matvec(&h)
                .unwrap()
                .into_iter()
                .map(f64::from)
                .collect()
        };
        let mut expected = swiglu(&weights.shared);
        for route in routes {
            for (e, v) in expected
                .iter_mut()
                .zip(swiglu(&weights.experts[route.expert]))
            {
                *e += f64::from(route.weight) * v;
            }
        }
        let err: f64 = out.rows[r]
            .iter()
            .zip(&expected)
            .map(|(&a, &b)| (f64::from(a) - b).abs())
            .fold(0.0, f64::max);
        let scale = expected.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(err <= 1e-5 * scale, "row {r}: {err:e} of {scale:e}");

        // Negative control: dropping one routed expert is caught by the same comparison.
        let fewer = Routing {
            top_k: routing.top_k - 1,
            ..routing
        };
        let partial = moe(&weights, &fewer, std::slice::from_ref(x), false).unwrap();
        let err: f64 = partial.rows[0]
            .iter()
            .zip(&expected)
            .map(|(&a, &b)| (f64::from(a) - b).abs())
            .fold(0.0, f64::max);
        assert!(err > 1e-3 * scale, "row {r}: three experts pass for four");
    }
}

#[test]
fn bf16_activations_store_bf16_values() {
    let cfg = tiny();
    let weights = MoeWeights::load(
        &Synthetic::new(&cfg, 3, WeightFormat::Bf16).unwrap(),
        &cfg,
        2,
    )
    .unwrap();
    let x = input(cfg.hidden_size, 1);
    let rounded = mlp(&weights.shared, &x, true).unwrap();
    assert!(rounded.iter().all(|&v| bf16_round(v) == v));
    let exact = mlp(&weights.shared, &x, false).unwrap();
    assert_ne!(rounded, exact);
    let out = moe(&weights, &Routing::new(&cfg), &[x], true).unwrap();
    assert!(out.rows[0].iter().all(|&v| bf16_round(v) == v));
}
