//! Linear problems for the checks: weights (FP8 with block scales, or bf16), x rows and the
//! epilogue's inputs, random or adversarial, from a seed.

use model::numerics::bf16_round;
use model::weights::linear::{linear, Epilogue};
use model::weights::packed::{pack, PackedWeight, Pairing, SourceWeight};
use model::weights::{Fp8Weight, WeightError};
use model::WeightFormat;

/// How the values are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Uniform in [-1, 1) (weights scaled per 128-row block, so blocks get distinct scales).
    Random,
    /// x all zero (the outputs are the epilogue's alone).
    Zeros,
    /// Random, plus a few x values of +-3000 and a weight block a thousand times larger.
    Outliers,
}

/// What follows the sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// bf16 output.
    Rounded,
    /// fp32 output, unrounded.
    Fp32,
    RowScale,
    Residual,
    RowScaleResidual,
}

/// One matrix, its input rows and its epilogue's operands.
#[derive(Clone, Debug)]
pub struct Problem {
    pub name: String,
    pub pairing: Pairing,
    pub format: WeightFormat,
    /// Rows (out) of each source.
    pub n: usize,
    pub k: usize,
    pub rows: usize,
    pub fp8: Vec<Fp8Weight>,
    pub bf16: Vec<Vec<u16>>,
    /// `[rows, k]` bf16 bits.
    pub x: Vec<u16>,
    pub finish: Finish,
    /// `[rows, n]` bf16 bits (with a residual).
    pub residual: Vec<u16>,
    /// `[rows]` (with a row scale).
    pub row_scale: Vec<f32>,
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

fn bf16_bits(v: f32) -> u16 {
    (bf16_round(v).to_bits() >> 16) as u16
}

pub fn bf16_value(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

impl Problem {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        pattern: Pattern,
        format: WeightFormat,
        pairing: Pairing,
        n: usize,
        k: usize,
        rows: usize,
        finish: Finish,
        seed: u64,
    ) -> Result<Problem, WeightError> {
        let mut d = Draw(seed);
        let mut sources = Vec::new();
        for s in 0..pairing.sources() {
            let values: Vec<f32> = (0..n * k)
                .map(|i| {
                    let (row, col) = (i / k, i % k);
                    // Blocks differ in magnitude, so their scales differ.
                    let block = 1.0 + ((row / 128 + 3 * (col / 128) + s) % 5) as f32;
                    let big = pattern == Pattern::Outliers && row / 128 == 0 && col / 128 == 1;
                    d.next() * block * if big { 1000.0 } else { 0.05 }
                })
                .collect();
            sources.push(values);
        }
        let x: Vec<u16> = (0..rows * k)
            .map(|i| match pattern {
                Pattern::Zeros => 0,
                Pattern::Outliers if i % 977 == 5 => bf16_bits(3000.0 * d.next().signum()),
                _ => bf16_bits(d.next()),
            })
            .collect();
        let residual = (0..rows * n).map(|_| bf16_bits(4.0 * d.next())).collect();
        let row_scale = (0..rows).map(|_| 0.5 + d.next().abs()).collect();
        let (fp8, bf16) = match format {
            WeightFormat::Fp8 => (
                sources
                    .iter()
                    .map(|v| Fp8Weight::quantise(v, n, k))
                    .collect::<Result<Vec<_>, _>>()?,
                Vec::new(),
            ),
            WeightFormat::Bf16 => (
                Vec::new(),
                sources
                    .iter()
                    .map(|v| v.iter().map(|&w| bf16_bits(w)).collect())
                    .collect(),
            ),
        };
        Ok(Problem {
            name: format!("{pattern:?} {format:?} {pairing:?} n {n} k {k} rows {rows} {finish:?}"),
            pairing,
            format,
            n,
            k,
            rows,
            fp8,
            bf16,
            x,
            finish,
            residual,
            row_scale,
        })
    }

    pub fn sources(&self) -> Vec<SourceWeight<'_>> {
        match self.format {
            WeightFormat::Fp8 => self.fp8.iter().map(SourceWeight::Fp8).collect(),
            WeightFormat::Bf16 => self
                .bf16
                .iter()
                .map(|bits| SourceWeight::Bf16 {
                    rows: self.n,
                    cols: self.k,
                    bits,
                })
                .collect(),
        }
    }

    pub fn packed(&self) -> Result<PackedWeight, WeightError> {
        pack(self.pairing, &self.sources())
    }

    pub fn x_values(&self) -> Vec<f32> {
        self.x.iter().map(|&b| bf16_value(b)).collect()
    }

    pub fn residual_values(&self) -> Vec<f32> {
        self.residual.iter().map(|&b| bf16_value(b)).collect()
    }

    pub fn has_row_scale(&self) -> bool {
        matches!(self.finish, Finish::RowScale | Finish::RowScaleResidual)
    }

    pub fn has_residual(&self) -> bool {
        matches!(self.finish, Finish::Residual | Finish::RowScaleResidual)
    }

    pub fn out_f32(&self) -> bool {
        self.finish == Finish::Fp32
    }

    /// The reference outputs `[rows, n]`.
    pub fn reference(&self) -> Result<Vec<f32>, WeightError> {
        let residual = self.residual_values();
        let epilogue = Epilogue {
            out_f32: self.out_f32(),
            row_scale: self.has_row_scale().then_some(&self.row_scale[..]),
            residual: self.has_residual().then_some(&residual[..]),
        };
        linear(
            self.pairing,
            &self.sources(),
            self.n,
            self.k,
            &self.x_values(),
            self.rows,
            &epilogue,
        )
    }
}
