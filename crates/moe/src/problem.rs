//! MoE problems for the checks: a router, the shared expert and every routed expert of a TP
//! rank's shape, input rows and the residual, random or adversarial, from a seed. The experts'
//! weights are a function of (seed, expert), made on demand: a GLM-5.2 rank holds 256 of them.

use crate::layout::MoeShape;
use crate::reference::{MlpWeights, RouterWeights, Routing};
use crate::Result;
use model::numerics::bf16_round;
use model::weights::linear::dequantise;
use model::weights::packed::{pack, PackedWeight, Pairing, SourceWeight};
use model::weights::{Fp8Weight, Matrix};
use model::WeightFormat;

/// How the router's inputs are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Uniform weights, rows and biases.
    Random,
    /// The bias lifts the same top_k experts above every other for every row (the bias decides
    /// the choice, while the weights must not see it).
    SameExperts,
    /// Row r's logits favour experts r top_k .. (r + 1) top_k: no two rows share an expert.
    DisjointExperts,
    /// Experts 2i and 2i + 1 have equal router rows and biases: exact ties, broken to the lower.
    Ties,
    /// Every expert has the same router row and bias: all tie, the lowest top_k win.
    AllEqual,
}

/// A deterministic stream of uniform values in [-1, 1).
struct Draw(u64);
impl Draw {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

pub fn bf16_bits(v: f32) -> u16 {
    (bf16_round(v).to_bits() >> 16) as u16
}

pub fn bf16_value(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// One expert's matrices as published: gate, up `[inter, hidden]`, down `[hidden, inter]`.
pub enum ExpertSource {
    Fp8([Fp8Weight; 3]),
    Bf16([(usize, usize, Vec<u16>); 3]),
}

impl ExpertSource {
    fn source(&self, i: usize) -> SourceWeight<'_> {
        match self {
            ExpertSource::Fp8(w) => SourceWeight::Fp8(&w[i]),
            ExpertSource::Bf16(w) => SourceWeight::Bf16 {
                rows: w[i].0,
                cols: w[i].1,
                bits: &w[i].2,
            },
        }
    }

    /// gate/up paired for the SwiGLU epilogue, and down.
    pub fn packed(&self) -> Result<(PackedWeight, PackedWeight)> {
        Ok((
            pack(Pairing::GateUp, &[self.source(0), self.source(1)])?,
            pack(Pairing::Plain, &[self.source(2)])?,
        ))
    }

    /// The values the reference multiplies by.
    pub fn weights(&self) -> Result<MlpWeights> {
        let m = |i: usize| {
            let s = self.source(i);
            let (rows, cols) = match &s {
                SourceWeight::Fp8(w) => (w.rows, w.cols),
                SourceWeight::Bf16 { rows, cols, .. } => (*rows, *cols),
            };
            Matrix::new(rows, cols, dequantise(&s))
        };
        Ok(MlpWeights {
            gate: m(0)?,
            up: m(1)?,
            down: m(2)?,
        })
    }
}

/// One MoE layer's inputs at a shape.
#[derive(Clone, Debug)]
pub struct MoeProblem {
    pub name: String,
    pub shape: MoeShape,
    pub routing: Routing,
    pub pattern: Pattern,
    pub seed: u64,
    /// `[experts, hidden]` bf16 bits.
    pub router: Vec<u16>,
    pub bias: Vec<f32>,
    /// `[rows, hidden]` bf16 bits: the post-attention-normed rows.
    pub x: Vec<u16>,
    /// `[rows, hidden]` bf16 bits: h, the residual the output is added to.
    pub residual: Vec<u16>,
}

impl MoeProblem {
    pub fn new(shape: MoeShape, routing: Routing, pattern: Pattern, seed: u64) -> Result<Self> {
        let (e, h, rows, k) = (shape.experts, shape.hidden, shape.rows, shape.top_k);
        if pattern == Pattern::DisjointExperts && (rows * k > e || rows > h) {
            return Err(crate::error::invalid(
                "moe problem",
                format!("{rows} rows of {k} disjoint experts out of {e}"),
            ));
        }
        let mut d = Draw(seed ^ 0x5EED_0F0E);
        let scale = 2.0 / (h as f32).sqrt();
        let mut router: Vec<f32> = (0..e * h).map(|_| d.next() * scale).collect();
        let mut bias: Vec<f32> = (0..e).map(|_| d.next() / 32.0).collect();
        let mut x: Vec<f32> = (0..rows * h).map(|_| d.next()).collect();
        match pattern {
            Pattern::Random => {}
            Pattern::SameExperts => {
                for i in 0..k {
                    bias[(3 + 7 * i) % e] = 1.0;
                }
            }
            Pattern::DisjointExperts => {
                for ex in 0..e {
                    router[ex * h + ex / k] += 1.0;
                }
                for r in 0..rows {
                    x[r * h + r] = 4.0;
                }
            }
            Pattern::Ties => {
                for ex in (1..e).step_by(2) {
                    let (a, b) = router.split_at_mut(ex * h);
                    b[..h].copy_from_slice(&a[(ex - 1) * h..]);
                    bias[ex] = bias[ex - 1];
                }
            }
            Pattern::AllEqual => {
                let (first, rest) = router.split_at_mut(h);
                for row in rest.chunks_mut(h) {
                    row.copy_from_slice(first);
                }
                let shared_bias = bias[0];
                bias.fill(shared_bias);
            }
        }
        let residual = (0..rows * h).map(|_| bf16_bits(2.0 * d.next())).collect();
        Ok(MoeProblem {
            name: format!(
                "{pattern:?} {:?} rows {rows} experts {e} hidden {h} inter {}",
                shape.format, shape.inter
            ),
            shape,
            routing,
            pattern,
            seed,
            router: router.into_iter().map(bf16_bits).collect(),
            bias,
            x: x.into_iter().map(bf16_bits).collect(),
            residual,
        })
    }

    /// Expert `e`'s matrices (`None`: the shared expert).
    pub fn expert(&self, e: Option<usize>) -> Result<ExpertSource> {
        let id = e.map_or(self.shape.experts as u64, |e| e as u64);
        let mut d = Draw(self.seed.wrapping_mul(0x1000_0001) ^ (id << 20) ^ 0x00E4_9E47);
        let (h, n) = (self.shape.hidden, self.shape.inter);
        let mut draw = |rows: usize, cols: usize, source: usize| -> Vec<f32> {
            let scale = 1.0 / (cols as f32).sqrt();
            (0..rows * cols)
                .map(|i| {
                    let (r, c) = (i / cols, i % cols);
                    // Neighbouring blocks differ in magnitude by powers of two, so their scales
                    // differ (power-of-two scales included).
                    let block = (1 << ((r / 128 + 3 * (c / 128) + source) % 4)) as f32;
                    d.next() * block * scale
                })
                .collect()
        };
        let values = [draw(n, h, 0), draw(n, h, 1), draw(h, n, 2)];
        let shapes = [(n, h), (n, h), (h, n)];
        Ok(match self.shape.format {
            WeightFormat::Fp8 => {
                let q = |i: usize| Fp8Weight::quantise(&values[i], shapes[i].0, shapes[i].1);
                ExpertSource::Fp8([q(0)?, q(1)?, q(2)?])
            }
            WeightFormat::Bf16 => {
                let b = |i: usize| {
                    let bits = values[i].iter().map(|&v| bf16_bits(v)).collect();
                    (shapes[i].0, shapes[i].1, bits)
                };
                ExpertSource::Bf16([b(0), b(1), b(2)])
            }
        })
    }

    pub fn router_weights(&self) -> Result<RouterWeights> {
        let values = self.router.iter().map(|&b| bf16_value(b)).collect();
        Ok(RouterWeights {
            gate: Matrix::new(self.shape.experts, self.shape.hidden, values)?,
            bias: self.bias.clone(),
        })
    }

    /// The router packed for the linear task (bf16, fp32 logits), one matrix a k-split
    /// (`MoeShape::router_splits`).
    pub fn packed_router(&self) -> Result<Vec<PackedWeight>> {
        let (e, h) = (self.shape.experts, self.shape.hidden);
        let splits = self.shape.router_splits();
        let k = h / splits;
        (0..splits)
            .map(|s| {
                let bits: Vec<u16> = (0..e)
                    .flat_map(|row| {
                        self.router[row * h + s * k..row * h + (s + 1) * k]
                            .iter()
                            .copied()
                    })
                    .collect();
                let source = SourceWeight::Bf16 {
                    rows: e,
                    cols: k,
                    bits: &bits,
                };
                Ok(pack(Pairing::Plain, &[source])?)
            })
            .collect()
    }

    /// The input rows as values.
    pub fn x_rows(&self) -> Vec<Vec<f32>> {
        self.x
            .chunks(self.shape.hidden)
            .map(|r| r.iter().map(|&b| bf16_value(b)).collect())
            .collect()
    }
}
