//! The CPU reference's cost: one key and one query through rope, rotation and quantisation, and
//! scoring a row against 4,096 keys, at GLM-5's shape.

use criterion::{criterion_group, criterion_main, Criterion};
use indexer::reference::{
    key_from_projection, query_heads_from_projection, row_query, score_row, IndexerDims,
    IndexerOptions, ScaledVector,
};
use model::ModelConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;

fn reference(c: &mut Criterion) {
    let cfg = ModelConfig::preset("glm-5").unwrap();
    let dims = IndexerDims::new(&cfg).unwrap();
    let opts = IndexerOptions::kernels(&cfg);
    let mut rng = StdRng::seed_from_u64(1);
    let mut random = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect() };
    let projected_key = random(dims.head_dim);
    let projected_query = random(dims.heads * dims.head_dim);
    let gates = random(dims.heads);
    let (ones, zeros) = (vec![1.0; dims.head_dim], vec![0.0; dims.head_dim]);

    c.bench_function("index key (LayerNorm, rope, Hadamard, FP8)", |b| {
        b.iter(|| key_from_projection(&dims, &opts, black_box(&projected_key), &ones, &zeros, 4097))
    });
    c.bench_function("index query, 32 heads (rope, Hadamard, bf16)", |b| {
        b.iter(|| query_heads_from_projection(&dims, &opts, black_box(&projected_query), 4097))
    });
    let keys: Vec<ScaledVector> = (0..4096)
        .map(|t| {
            key_from_projection(&dims, &opts, &random(dims.head_dim), &ones, &zeros, t).unwrap()
        })
        .collect();
    let heads = query_heads_from_projection(&dims, &opts, &projected_query, 4095).unwrap();
    let row = row_query(&dims, &heads, &gates).unwrap();
    c.bench_function("score one row against 4096 keys", |b| {
        b.iter(|| score_row(&dims, black_box(&row), &keys, 4095))
    });
}

criterion_group!(benches, reference);
criterion_main!(benches);
