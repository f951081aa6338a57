//! The MLA reference: its cache formats, absorbed attention against the expanded form
//! transformers computes, and the latent-norm eps switch.

use mla::reference::{attend, project, CacheStore, MlaCache, MlaOptions, MlaWeights, Projection};
use mla::HeadLayout;
use model::numerics::{bf16_round, RopeStyle};
use model::weights::Synthetic;
use model::{CacheFormat, ModelConfig, WeightFormat};

fn tiny() -> ModelConfig {
    ModelConfig::preset("tiny").unwrap()
}

/// Deterministic values in [-scale, scale), unrelated for different seeds.
fn values(n: usize, seed: u32, scale: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut z = (u64::from(seed) << 32 | i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z ^= z >> 32;
            ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn setup() -> (ModelConfig, HeadLayout, MlaWeights) {
    let cfg = tiny();
    let weights = Synthetic::new(&cfg, 5, WeightFormat::Bf16).unwrap();
    let w = MlaWeights::load(&weights, &cfg, 0).unwrap();
    (cfg.clone(), HeadLayout::new(&cfg), w)
}

/// Projects `n` tokens at positions 0..n into a cache and returns their projections.
fn fill(
    cfg: &ModelConfig,
    h: &HeadLayout,
    w: &MlaWeights,
    opts: &MlaOptions,
    store: CacheStore,
    n: usize,
) -> (MlaCache, Vec<Projection>) {
    let mut cache = MlaCache::new(cfg, store).unwrap();
    let projections: Vec<Projection> = (0..n)
        .map(|p| project(h, w, opts, &values(cfg.hidden_size, p as u32, 2.0), p).unwrap())
        .collect();
    for proj in &projections {
        cache.push(&proj.latent, &proj.k_pe).unwrap();
    }
    (cache, projections)
}

#[test]
fn cache_formats_read_back_what_was_written() {
    let cfg = tiny();
    let latent = values(cfg.kv_lora_rank, 1, 3.0);
    let rope: Vec<f32> = values(cfg.qk_rope_head_dim, 2, 1.0)
        .into_iter()
        .map(bf16_round)
        .collect();
    let bf16_latent: Vec<f32> = latent.iter().copied().map(bf16_round).collect();

    let mut exact = MlaCache::new(&cfg, CacheStore::F32).unwrap();
    exact.push(&latent, &rope).unwrap();
    assert_eq!(exact.read(0).unwrap().latent, latent);

    let mut bf16 = MlaCache::new(&cfg, CacheStore::Format(CacheFormat::Bf16)).unwrap();
    bf16.push(&latent, &rope).unwrap();
    assert_eq!(bf16.read(0).unwrap().latent, bf16_latent);
    assert_eq!(bf16.read(0).unwrap().k_pe, rope);

    let mut fp8 = MlaCache::new(&cfg, CacheStore::Format(CacheFormat::Fp8)).unwrap();
    fp8.push(&latent, &rope).unwrap();
    fp8.push(&vec![0.0; cfg.kv_lora_rank], &rope).unwrap();
    let back = fp8.read(0).unwrap();
    assert_eq!(back.k_pe, rope, "the rope key stays bf16");
    for (a, b) in latent.iter().zip(&back.latent) {
        // E4M3 keeps 3 mantissa bits; the scale maps each tile's amax to 448.
        assert!(
            (a - b).abs() <= a.abs() / 16.0 + 3.0 / 448.0 / 8.0,
            "{a} -> {b}"
        );
    }
    assert!(fp8.read(1).unwrap().latent.iter().all(|&v| v == 0.0));
    assert_eq!(fp8.len(), 2);

    assert!(fp8.read(2).is_err());
    assert!(fp8.push(&latent[1..], &rope).is_err());
}

/// The expanded (non-absorbed) attention of spec §2.7, as transformers computes it: per head,
/// k_nope = W_UK c_t and v = W_UV c_t, scores over the selected tokens, softmax, Σ p v, o_proj.
fn expanded_attention(
    h: &HeadLayout,
    w: &MlaWeights,
    q: &Projection,
    cache: &MlaCache,
    selected: &[usize],
) -> Vec<f32> {
    let scale = 1.0 / ((h.nope + h.rope) as f64).sqrt();
    let mut concat = Vec::new();
    for head in 0..h.heads {
        let q_nope = &q.q_nope[head * h.nope..(head + 1) * h.nope];
        let q_pe = &q.q_pe[head * h.rope..(head + 1) * h.rope];
        let mut scores = Vec::new();
        let mut vs = Vec::new();
        for &t in selected {
            let token = cache.read(t).unwrap();
            let k_nope = w.kv_b.matvec_rows(h.uk_rows(head), &token.latent).unwrap();
            let s: f64 = q_nope
                .iter()
                .zip(&k_nope)
                .chain(q_pe.iter().zip(&token.k_pe))
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            scores.push(s * scale);
            vs.push(w.kv_b.matvec_rows(h.uv_rows(head), &token.latent).unwrap());
        }
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = e.iter().sum();
        for d in 0..h.v {
            concat.push(
                e.iter()
                    .zip(&vs)
                    .map(|(p, v)| p / total * f64::from(v[d]))
                    .sum::<f64>() as f32,
            );
        }
    }
    w.o_proj.matvec(&concat).unwrap()
}

fn relative(a: &[f32], b: &[f32]) -> f64 {
    let diff: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum();
    let norm: f64 = b.iter().map(|&y| f64::from(y).powi(2)).sum();
    (diff / norm).sqrt()
}

#[test]
fn absorbed_attention_equals_the_expanded_form() {
    let opts = MlaOptions::transformers(&tiny(), false);
    let (cfg, h, w) = setup();
    let (cache, projections) = fill(&cfg, &h, &w, &opts, CacheStore::F32, 12);
    let query = &projections[11];
    let selected = [0usize, 3, 4, 7, 11];
    let list: Vec<i32> = selected.iter().map(|&t| t as i32).chain([-1, -1]).collect();
    let ours = attend(&h, &w, &opts, query, &cache, &list).unwrap();
    let expanded = expanded_attention(&h, &w, query, &cache, &selected);
    let err = relative(&ours, &expanded);
    assert!(err < 1e-5, "absorbed vs expanded: {err:e}");

    // Negative control: the same check notices attention over other tokens.
    let other = attend(&h, &w, &opts, query, &cache, &[1, 2, 5, 8, 10]).unwrap();
    let err = relative(&other, &expanded);
    assert!(err > 1e-2, "another selection is within {err:e}");
}

#[test]
fn bf16_and_fp8_caches_stay_close_to_exact() {
    let opts = MlaOptions::transformers(&tiny(), false);
    let (cfg, h, w) = setup();
    let list: Vec<i32> = (0..10).collect();
    let (exact, projections) = fill(&cfg, &h, &w, &opts, CacheStore::F32, 10);
    let reference = attend(&h, &w, &opts, &projections[9], &exact, &list).unwrap();
    for (format, bound) in [(CacheFormat::Bf16, 1e-2), (CacheFormat::Fp8, 1e-1)] {
        let (cache, _) = fill(&cfg, &h, &w, &opts, CacheStore::Format(format), 10);
        let err = relative(
            &attend(&h, &w, &opts, &projections[9], &cache, &list).unwrap(),
            &reference,
        );
        assert!(err > 0.0 && err < bound, "{format:?}: {err:e}");
    }
}

#[test]
fn latent_norm_eps_matters_only_for_small_latents() {
    let cfg = tiny();
    let (_, h, w) = setup();
    let hf = MlaOptions::transformers(&cfg, false);
    let engines = MlaOptions {
        bf16_activations: false,
        ..MlaOptions::engines(&cfg)
    };
    assert_eq!((hf.latent_norm_eps, engines.latent_norm_eps), (1e-6, 1e-5));
    for (scale, lower, upper) in [(2.0, 0.0, 1e-4), (2e-3, 1e-2, 1.0)] {
        let x = values(cfg.hidden_size, 9, scale);
        let a = project(&h, &w, &hf, &x, 3).unwrap();
        let b = project(&h, &w, &engines, &x, 3).unwrap();
        let err = relative(&b.latent, &a.latent);
        assert!(
            err > lower && err < upper,
            "input scale {scale}: latent differs by {err:e}"
        );
    }
}

#[test]
fn rope_turns_only_past_position_zero_and_its_style_matters() {
    let cfg = tiny();
    let opts = MlaOptions::transformers(&cfg, false);
    let (_, h, w) = setup();
    let x = values(cfg.hidden_size, 4, 2.0);
    let at0 = project(&h, &w, &opts, &x, 0).unwrap();
    let at5 = project(&h, &w, &opts, &x, 5).unwrap();
    assert_eq!(at0.latent, at5.latent);
    assert_eq!(at0.q_nope, at5.q_nope);
    assert_ne!(at0.k_pe, at5.k_pe);
    let half = MlaOptions {
        rope: RopeStyle::HalfSplit,
        ..opts
    };
    let split = project(&h, &w, &half, &x, 0).unwrap();
    assert_eq!(
        split.k_pe, at0.k_pe,
        "no rotation at position 0 in either style"
    );
    assert_ne!(project(&h, &w, &half, &x, 5).unwrap().k_pe, at5.k_pe);
}
