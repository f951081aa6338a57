//! Cases of the attention half: a rank's weights (FP8 q_a, kv_a, q_b, o_proj with 128 x 128 block
//! scales, bf16 kv_b and norms), requests with their caches, the layer's input rows and each row's
//! selected slots; the reference's output rows (`mla::reference` with the engines' numerics, then
//! the residual as the linear's epilogue rounds it); and the one byte buffer (the arena: the half's
//! activations, the cache, the packed weights) a launch reads and writes. Shared by the host
//! emulation, the GPU tests and the bench.
#![allow(dead_code)]

use executor::fused::attention::{
    HalfArena, HalfDims, HalfMatrix, HalfPlan, HalfRequest, HalfWeights, PackedAt,
};
use half::bf16;
use mla::reference::{attend, project, CacheStore, MlaCache, MlaOptions, MlaWeights};
use mla::HeadLayout;
use model::numerics::{bf16_round, rms_norm, rope_inv_freq};
use model::weights::packed::{pack, Pairing, SourceWeight};
use model::weights::Fp8Weight;
use model::weights::Matrix;
use model::ModelConfig;
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

fn bits(v: f32) -> u16 {
    bf16::from_f32(v).to_bits()
}
fn value(b: u16) -> f32 {
    bf16::from_bits(b).to_f32()
}

/// How each row picks its slots.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pick {
    /// Every position up to the row's own when they fit k, else the row's own and a random
    /// k - 1 of the others, in position order.
    Random,
    /// Every entry the row's own position.
    SamePosition,
}

/// An adversarial twist of a case.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Twist {
    None,
    /// A cached token the first row selects whose rope key makes head 0's score about this much
    /// above the rest (softmax stability).
    Outlier(f32),
}

/// A rank's weights: the reference's f32 matrices (FP8 ones dequantised) and the packed ones.
pub struct Weights {
    pub reference: MlaWeights,
    pub hidden_norm: Vec<f32>,
    /// By [`HalfMatrix::index`].
    pub packed: Vec<model::weights::packed::PackedWeight>,
}

fn uniform(n: usize, a: f32, rng: &mut StdRng) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-a..a)).collect()
}

fn fp8(rows: usize, cols: usize, a: f32, rng: &mut StdRng) -> (Matrix, Fp8Weight) {
    let w = Fp8Weight::quantise(&uniform(rows * cols, a, rng), rows, cols).unwrap();
    (Matrix::new(rows, cols, w.dequantise()).unwrap(), w)
}

fn norm_weight(n: usize, rng: &mut StdRng) -> Vec<f32> {
    (0..n)
        .map(|_| bf16_round(rng.gen_range(0.75..1.25)))
        .collect()
}

impl Weights {
    /// Random weights of a rank of `d`, each projection scaled to keep unit-sized activations
    /// (o_proj 4x, so that the attention stands out of the residual's rounding).
    pub fn new(d: &HalfDims, seed: u64) -> Weights {
        let mut rng = StdRng::seed_from_u64(seed);
        let scale = |k: usize| (3.0 / k as f32).sqrt();
        let (q_a, q_a8) = fp8(d.q_lora, d.hidden, scale(d.hidden), &mut rng);
        let (kv_a, kv_a8) = fp8(d.latent + d.rope, d.hidden, scale(d.hidden), &mut rng);
        let (q_b, q_b8) = fp8(d.heads * d.qk(), d.q_lora, scale(d.q_lora), &mut rng);
        let (o_proj, o8) = fp8(
            d.hidden,
            d.heads * d.v,
            4.0 * scale(d.heads * d.v),
            &mut rng,
        );
        let heads = HeadLayout {
            heads: d.heads,
            nope: d.nope,
            rope: d.rope,
            v: d.v,
        };
        let mut kv_b = vec![0f32; heads.kv_b_rows() * d.latent];
        for h in 0..d.heads {
            for (rows, a) in [
                (heads.uk_rows(h), scale(d.nope)),
                (heads.uv_rows(h), scale(d.latent)),
            ] {
                for r in rows {
                    for c in 0..d.latent {
                        kv_b[r * d.latent + c] = bf16_round(rng.gen_range(-a..a));
                    }
                }
            }
        }
        let kv_b_bits: Vec<u16> = kv_b.iter().map(|&v| bits(v)).collect();
        let mut packed = Vec::new();
        for m in HalfMatrix::all(d.heads) {
            let w = match m {
                HalfMatrix::QA => pack(Pairing::Plain, &[SourceWeight::Fp8(&q_a8)]),
                HalfMatrix::KvA => pack(Pairing::Plain, &[SourceWeight::Fp8(&kv_a8)]),
                HalfMatrix::QB => pack(Pairing::Plain, &[SourceWeight::Fp8(&q_b8)]),
                HalfMatrix::OProj => pack(Pairing::Plain, &[SourceWeight::Fp8(&o8)]),
                HalfMatrix::Uk(h) => {
                    // W_UK[h]ᵀ: [latent, nope], zero columns up to uk_k.
                    let k = d.uk_k();
                    let mut t = vec![0u16; d.latent * k];
                    for (i, r) in heads.uk_rows(h).enumerate() {
                        for c in 0..d.latent {
                            t[c * k + i] = kv_b_bits[r * d.latent + c];
                        }
                    }
                    pack(
                        Pairing::Plain,
                        &[SourceWeight::Bf16 {
                            rows: d.latent,
                            cols: k,
                            bits: &t,
                        }],
                    )
                }
                HalfMatrix::Uv(h) => {
                    let rows = heads.uv_rows(h);
                    pack(
                        Pairing::Plain,
                        &[SourceWeight::Bf16 {
                            rows: d.v,
                            cols: d.latent,
                            bits: &kv_b_bits[rows.start * d.latent..rows.end * d.latent],
                        }],
                    )
                }
            };
            packed.push(w.unwrap());
        }
        Weights {
            reference: MlaWeights {
                q_a,
                q_a_norm: norm_weight(d.q_lora, &mut rng),
                q_b,
                kv_a,
                kv_a_norm: norm_weight(d.latent, &mut rng),
                kv_b: Matrix::new(heads.kv_b_rows(), d.latent, kv_b).unwrap(),
                o_proj,
            },
            hidden_norm: norm_weight(d.hidden, &mut rng),
            packed,
        }
    }
}

/// One request of a case: tokens cached before the step and rows this step.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub context: usize,
    pub rows: usize,
}

/// A case: inputs, and what the reference makes of them.
pub struct Case {
    pub dims: HalfDims,
    pub topk: usize,
    pub requests: Vec<HalfRequest>,
    /// `[rows][hidden]` bf16 bits.
    pub hidden: Vec<u16>,
    pub positions: Vec<u32>,
    pub new_slots: Vec<u32>,
    /// The records before the launch: the new tokens' records poisoned.
    pub cache_before: Vec<u8>,
    /// `[rows][topk]` cache slots, -1 padded.
    pub slots: Vec<i32>,
    /// `[rows][hidden]`: the reference's x + o_proj(attention), bf16 values.
    pub expected: Vec<f32>,
}

fn cache_config(d: &HalfDims) -> ModelConfig {
    ModelConfig {
        kv_lora_rank: d.latent,
        qk_rope_head_dim: d.rope,
        rope_theta: d.rope_theta,
        rope_interleave: true,
        ..ModelConfig::preset("glm-5").unwrap()
    }
}

impl Case {
    pub fn new(
        d: &HalfDims,
        w: &Weights,
        topk: usize,
        requests: &[Request],
        pick: Pick,
        twist: Twist,
        seed: u64,
    ) -> Case {
        let mut rng = StdRng::seed_from_u64(seed);
        let cfg = cache_config(d);
        let heads = HeadLayout {
            heads: d.heads,
            nope: d.nope,
            rope: d.rope,
            v: d.v,
        };
        let opts = MlaOptions {
            rope: d.rope_style,
            rope_theta: d.rope_theta,
            latent_norm_eps: d.latent_eps,
            bf16_activations: true,
        };
        let record = d.cache_layout().unwrap().bytes_per_token();
        let (mut hidden, mut positions, mut new_slots) = (vec![], vec![], vec![]);
        let (mut cache_before, mut slots, mut expected) = (vec![], vec![], vec![]);
        let mut half_requests = Vec::new();
        for req in requests {
            let base = cache_before.len() / record;
            let mut cache = MlaCache::new(&cfg, CacheStore::Format(d.cache)).unwrap();
            let mut context: Vec<(Vec<f32>, Vec<f32>)> = (0..req.context)
                .map(|_| {
                    let latent = uniform(d.latent, 1.5, &mut rng);
                    let rope = uniform(d.rope, 1.0, &mut rng);
                    (latent, rope)
                })
                .collect();
            let xs: Vec<Vec<f32>> = (0..req.rows)
                .map(|_| {
                    uniform(d.hidden, 0.125, &mut rng)
                        .into_iter()
                        .map(bf16_round)
                        .collect()
                })
                .collect();
            let projections: Vec<_> = xs
                .iter()
                .enumerate()
                .map(|(r, x)| {
                    let normed: Vec<f32> = rms_norm(x, &w.hidden_norm, d.hidden_eps)
                        .unwrap()
                        .into_iter()
                        .map(bf16_round)
                        .collect();
                    project(&heads, &w.reference, &opts, &normed, req.context + r).unwrap()
                })
                .collect();
            let lists: Vec<Vec<i32>> = (0..req.rows)
                .map(|r| {
                    let p = req.context + r;
                    match pick {
                        Pick::SamePosition => vec![p as i32; topk],
                        Pick::Random if p < topk => (0..=p as i32)
                            .chain(std::iter::repeat(-1))
                            .take(topk)
                            .collect(),
                        Pick::Random => {
                            let mut v: Vec<usize> = sample(&mut rng, p, topk - 1).into_vec();
                            v.push(p);
                            v.sort_unstable();
                            v.into_iter().map(|t| t as i32).collect()
                        }
                    }
                })
                .collect();
            if let Twist::Outlier(score) = twist {
                // A cached token of the first row's list: its rope key along head 0's roped query
                // part, long enough that the score is `score`.
                let t = lists[0]
                    .iter()
                    .copied()
                    .find(|&t| t >= 0 && (t as usize) < req.context);
                if let Some(t) = t {
                    let q_pe = &projections[0].q_pe[..d.rope];
                    let norm2: f32 = q_pe.iter().map(|v| v * v).sum();
                    let alpha = score * (d.qk() as f32).sqrt() / norm2.max(1e-6);
                    context[t as usize].1 = q_pe.iter().map(|v| bf16_round(v * alpha)).collect();
                }
            }
            for (latent, rope) in &context {
                cache.push(latent, rope).unwrap();
            }
            for p in &projections {
                cache.push(&p.latent, &p.k_pe).unwrap();
            }
            let bytes = cache.bytes().unwrap();
            cache_before.extend_from_slice(&bytes[..req.context * record]);
            cache_before.extend(std::iter::repeat_n(0x7fu8, req.rows * record));
            for r in 0..req.rows {
                let attn = attend(
                    &heads,
                    &w.reference,
                    &opts,
                    &projections[r],
                    &cache,
                    &lists[r],
                )
                .unwrap();
                expected.extend(
                    xs[r]
                        .iter()
                        .zip(&attn)
                        .map(|(&x, &a)| bf16_round(x + bf16_round(a))),
                );
                hidden.extend(xs[r].iter().map(|&v| bits(v)));
                positions.push((req.context + r) as u32);
                new_slots.push((base + req.context + r) as u32);
                slots.extend(lists[r].iter().map(|&t| {
                    if t < 0 {
                        -1
                    } else {
                        (base + t as usize) as i32
                    }
                }));
            }
            half_requests.push(HalfRequest {
                context: req.context as u32,
                rows: req.rows as u32,
                selected: lists
                    .iter()
                    .map(|l| l.iter().filter(|&&t| t >= 0).count() as u32)
                    .max()
                    .unwrap_or(0),
            });
        }
        Case {
            dims: *d,
            topk,
            requests: half_requests,
            hidden,
            positions,
            new_slots,
            cache_before,
            slots,
            expected,
        }
    }

    /// The largest relative L2 error over rows of the output's attention part (out - x) against
    /// the reference's (expected - x): the residual itself is the same bits on both sides.
    pub fn error(&self, out: &[u16]) -> f64 {
        let h = self.dims.hidden;
        self.expected
            .chunks(h)
            .zip(out.chunks(h))
            .zip(self.hidden.chunks(h))
            .map(|((e, o), x)| {
                let (mut diff, mut norm) = (0f64, 0f64);
                for ((&e, &o), &x) in e.iter().zip(o).zip(x) {
                    let x = f64::from(value(x));
                    let (e, o) = (f64::from(e) - x, f64::from(value(o)) - x);
                    diff += (e - o).powi(2);
                    norm += e.powi(2);
                }
                if diff.is_nan() {
                    f64::INFINITY
                } else {
                    (diff / norm.max(1e-30)).sqrt()
                }
            })
            .fold(0.0, f64::max)
    }
}

fn u16_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Where a launch's memory went: the arena's, the cache's and the weights' device addresses.
pub struct Placed {
    pub arena: u64,
    pub cache: u64,
    pub weights: HalfWeights,
}

/// The launch's arena (`arena_bytes`, the half's inputs written in: the rows, positions, new
/// slots, rope frequencies and `slots`), the cache and the weights, each given to `put` (which
/// copies bytes to the device and returns their address).
pub fn place(
    plan: &HalfPlan,
    arena_bytes: u64,
    case: &Case,
    slots: &[i32],
    w: &Weights,
    put: &mut dyn FnMut(&[u8]) -> u64,
) -> Placed {
    let a: &HalfArena = &plan.arena;
    let d = &plan.dims;
    let mut bytes = vec![0u8; arena_bytes as usize];
    let mut write = |at: u64, src: &[u8]| {
        bytes[at as usize..at as usize + src.len()].copy_from_slice(src);
    };
    write(a.hidden, &u16_bytes(&case.hidden));
    write(a.positions, bytemuck::cast_slice(&case.positions));
    write(a.new_slots, bytemuck::cast_slice(&case.new_slots));
    write(
        a.inv_freq,
        bytemuck::cast_slice(&rope_inv_freq(d.rope, d.rope_theta)),
    );
    write(a.slot_lists, bytemuck::cast_slice(slots));
    let arena = put(&bytes);
    let cache = put(&case.cache_before);
    let mut norm = |v: &[f32]| put(&u16_bytes(&v.iter().map(|&x| bits(x)).collect::<Vec<_>>()));
    let hidden_norm = norm(&w.hidden_norm);
    let q_a_norm = norm(&w.reference.q_a_norm);
    let kv_a_norm = norm(&w.reference.kv_a_norm);
    let matrices = w
        .packed
        .iter()
        .map(|p| {
            let fp8 = p.layout.format == model::WeightFormat::Fp8;
            PackedAt {
                w: put(&p.bytes),
                scales: if fp8 {
                    put(bytemuck::cast_slice(&p.scales))
                } else {
                    0
                },
                fp8,
            }
        })
        .collect();
    Placed {
        arena,
        cache,
        weights: HalfWeights {
            matrices,
            hidden_norm,
            q_a_norm,
            kv_a_norm,
        },
    }
}

/// bf16 bits from little-endian bytes.
pub fn u16s(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}
