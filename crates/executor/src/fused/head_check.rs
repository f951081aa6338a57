//! Problems for the head's parts and the checks of a launch's outputs against the references,
//! shared by the host emulation (`tests/fused_head.rs`), the GPU test and the bench.
//!
//! Every stage is checked on the device's own input to it, by that stage's contract: the
//! embedding bit for bit, a norm within `head::check::NORM_STEPS`, each matrix by
//! `linear::check` (its sums within a bound of the exact sums, every rounding after them exact),
//! the argmax pairs bit for bit on the device's logits, the tokens against the reference's
//! logits (`head::check::check_tokens`). End to end, the dense MLP's output is held to
//! [`DENSE_TOLERANCE`] of `moe::reference::mlp` (through `head::reference::dense_mlp`) from the
//! same input, the measured error beside it.

use super::head::{DenseShape, TailShape};
use head::check::{check_norm, check_pairs, check_tokens, Measured, TokenMeasured};
use head::reference::{dense_mlp, embed, rms_norm_rows, tail};
use linear::cases::{bf16_value, Finish, Pattern, Problem};
use linear::check::check;
use model::numerics::bf16_round;
use model::weights::linear::dequantise;
use model::weights::packed::{PackedWeight, Pairing};
use model::weights::Matrix;
use model::WeightFormat;
use moe::reference::MlpWeights;

/// Allowed ‖device − reference‖₂ / ‖reference‖₂ of the dense MLP's output, end to end: a few bf16
/// roundings (2⁻⁹ each) compounding through the norm, gate/up, SwiGLU and down.
pub const DENSE_TOLERANCE: f64 = 1.0 / 128.0;

/// A deterministic stream of uniform values in [-1, 1).
struct Draw(u64);
impl Draw {
    fn uniform(&mut self) -> f32 {
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

fn values(bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|&b| bf16_value(b)).collect()
}

/// Norm weights around 1, as trained models have them.
fn norm_weight(n: usize, d: &mut Draw) -> Vec<u16> {
    (0..n).map(|_| bf16_bits(1.0 + 0.5 * d.uniform())).collect()
}

/// The embedding of a step: a table and the step's tokens (repeats included).
#[derive(Clone, Debug)]
pub struct EmbedCase {
    pub vocab: usize,
    pub hidden: usize,
    /// `[vocab, hidden]` bf16 bits.
    pub table: Vec<u16>,
    pub tokens: Vec<u32>,
}

impl EmbedCase {
    pub fn new(vocab: usize, hidden: usize, rows: usize, seed: u64) -> EmbedCase {
        let mut d = Draw(seed);
        let table = (0..vocab * hidden)
            .map(|_| bf16_bits(d.uniform()))
            .collect();
        let mut tokens: Vec<u32> = (0..rows)
            .map(|_| ((d.uniform() + 1.0) * 0.5 * vocab as f32) as u32 % vocab as u32)
            .collect();
        tokens[rows - 1] = vocab as u32 - 1;
        if rows > 2 {
            tokens[1] = tokens[0];
        }
        EmbedCase {
            vocab,
            hidden,
            table,
            tokens,
        }
    }

    /// `[rows, hidden]` bf16 bits, as the launch should write them.
    pub fn reference(&self) -> Result<Vec<u16>, String> {
        let table =
            Matrix::new(self.vocab, self.hidden, values(&self.table)).map_err(|e| e.to_string())?;
        let rows = embed(&table, &self.tokens).map_err(|e| e.to_string())?;
        Ok(rows.into_iter().map(bf16_bits).collect())
    }

    pub fn check(&self, embedded: &[u16]) -> Result<(), String> {
        let want = self.reference()?;
        match want.iter().zip(embedded).position(|(a, b)| a != b) {
            None if want.len() == embedded.len() => Ok(()),
            None => Err(format!(
                "embedding: {} values for {}",
                embedded.len(),
                want.len()
            )),
            Some(i) => Err(format!(
                "embedding: value {i} (row {}, token {}) = {}, the table's {}",
                i / self.hidden,
                self.tokens[i / self.hidden],
                bf16_value(embedded[i]),
                bf16_value(want[i])
            )),
        }
    }
}

/// A linear problem for one of the parts' matrices (its x and residual replaced by what the
/// device fed it when checked).
fn matrix_problem(
    format: WeightFormat,
    pairing: Pairing,
    n: u32,
    k: u32,
    rows: u32,
    finish: Finish,
    seed: u64,
) -> Result<Problem, String> {
    Problem::new(
        Pattern::Random,
        format,
        pairing,
        n as usize,
        k as usize,
        rows as usize,
        finish,
        seed,
    )
    .map_err(|e| e.to_string())
}

/// A device matrix's output checked on the device's own input.
fn check_matrix(
    p: &Problem,
    x: &[u16],
    residual: Option<&[u16]>,
    y: &[u16],
) -> Result<linear::check::Measured, String> {
    let mut p = p.clone();
    p.x = x.to_vec();
    if let Some(r) = residual {
        p.residual = r.to_vec();
    }
    check(&p, &values(y))
}

/// The tail's problem: the final norm's input rows, its weight, and lm_head's shard.
#[derive(Clone, Debug)]
pub struct TailCase {
    pub shape: TailShape,
    /// `[rows, hidden]` bf16 bits.
    pub x: Vec<u16>,
    pub final_norm: Vec<u16>,
    pub lm_head: Problem,
    pub packed: PackedWeight,
    /// lm_head rows made equal to the first of them (each wins row 0).
    pub tied: Vec<u32>,
}

/// What a passing tail measured.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TailMeasured {
    pub norm: Measured,
    pub logits: linear::check::Measured,
    pub tokens: TokenMeasured,
}

impl TailCase {
    /// Random rows and weights, with adversarial rows: row 0 is lm_head row `tied[0]` itself, so
    /// the equal rows `tied` (across tile boundaries, in one FP8 scale block) give its largest
    /// logits; row 1 (with 3 rows or more) is zero, so every logit is 0 and the token is 0.
    pub fn new(shape: TailShape, tied: &[u32], seed: u64) -> Result<TailCase, String> {
        let (rows, hidden, n) = (shape.rows, shape.hidden, shape.vocab_rows);
        let mut lm_head = matrix_problem(
            shape.format,
            Pairing::Plain,
            n,
            hidden,
            rows,
            Finish::Rounded,
            seed,
        )?;
        let k = hidden as usize;
        if let Some((&first, rest)) = tied.split_first() {
            let first = first as usize;
            for &t in rest {
                let t = t as usize;
                if t / 128 != first / 128 {
                    return Err(format!(
                        "tied rows {first} and {t} lie in different scale blocks"
                    ));
                }
                match shape.format {
                    WeightFormat::Fp8 => {
                        let codes = &mut lm_head.fp8[0].codes;
                        codes.copy_within(first * k..(first + 1) * k, t * k);
                    }
                    WeightFormat::Bf16 => {
                        let bits = &mut lm_head.bf16[0];
                        bits.copy_within(first * k..(first + 1) * k, t * k);
                    }
                }
            }
        }
        let packed = lm_head.packed().map_err(|e| e.to_string())?;
        let mut d = Draw(seed ^ 0x5eed);
        let mut x: Vec<u16> = (0..rows as usize * k)
            .map(|_| bf16_bits(4.0 * d.uniform()))
            .collect();
        if let Some(&first) = tied.first() {
            let w = dequantise(&lm_head.sources()[0]);
            let row = &w[first as usize * k..(first as usize + 1) * k];
            let scale = 1.0 / row.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
            for (xi, wi) in x[..k].iter_mut().zip(row) {
                *xi = bf16_bits(wi * scale);
            }
        }
        if rows >= 3 {
            x[k..2 * k].fill(0);
        }
        Ok(TailCase {
            shape,
            x,
            final_norm: norm_weight(k, &mut d),
            lm_head,
            packed,
            tied: tied.to_vec(),
        })
    }

    /// The device's final norm output, logits, this shard's pairs and the tokens.
    pub fn check(
        &self,
        z: &[u16],
        logits: &[u16],
        pairs: &[u64],
        tokens: &[u32],
    ) -> Result<TailMeasured, String> {
        let s = self.shape;
        let (rows, n) = (s.rows as usize, s.vocab_rows as usize);
        let first_id = s.shard * s.vocab_rows;
        let reference = tail(
            &values(&self.x),
            rows,
            &values(&self.final_norm),
            f64::from(s.eps),
            &self.lm_head.sources()[0],
            n,
            first_id,
        )
        .map_err(|e| e.to_string())?;
        let norm = check_norm(&reference.z, &values(z)).map_err(|e| format!("final {e}"))?;
        let logits_m =
            check_matrix(&self.lm_head, z, None, logits).map_err(|e| format!("lm_head: {e}"))?;
        let mine: Vec<u64> = pairs
            .iter()
            .skip(s.shard as usize)
            .step_by(s.shards as usize)
            .copied()
            .collect();
        check_pairs(&values(logits), n, first_id, &mine)?;
        // One GPU holds one shard: its pick reads this shard's pairs alone.
        let local: Vec<u32> = tokens.iter().map(|&t| t.wrapping_sub(first_id)).collect();
        let tokens_m = check_tokens(&reference.logits, n, &local)?;
        if let Some(&first) = self.tied.first() {
            if tokens[0] != first_id + first {
                return Err(format!(
                    "row 0: token {}, the first of the tied rows {:?} is {}",
                    tokens[0],
                    self.tied,
                    first_id + first
                ));
            }
        }
        if rows >= 3 && tokens[1] != first_id {
            return Err(format!(
                "row 1 (every logit 0): token {}, the first id is {first_id}",
                tokens[1]
            ));
        }
        Ok(TailMeasured {
            norm,
            logits: logits_m,
            tokens: tokens_m,
        })
    }
}

/// The dense MLP's problem: its input rows, the post-attention norm's weight, gate/up and down.
#[derive(Clone, Debug)]
pub struct DenseCase {
    pub shape: DenseShape,
    /// `[rows, hidden]` bf16 bits (the residual stream the MLP adds to).
    pub h: Vec<u16>,
    pub post_norm: Vec<u16>,
    pub gate_up: Problem,
    pub down: Problem,
    pub gate_up_packed: PackedWeight,
    pub down_packed: PackedWeight,
}

/// What a passing dense MLP measured.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DenseMeasured {
    pub norm: Measured,
    pub gate_up: linear::check::Measured,
    pub down: linear::check::Measured,
    /// ‖device − reference‖₂ / ‖reference‖₂ end to end.
    pub relative_error: f64,
}

impl DenseCase {
    /// Random weights; `h` given (the embedding's rows in a layer-0 launch) or random.
    pub fn new(shape: DenseShape, h: Option<Vec<u16>>, seed: u64) -> Result<DenseCase, String> {
        let (rows, hidden, inter) = (shape.rows, shape.hidden, shape.intermediate);
        let finish = if shape.residual {
            Finish::Residual
        } else {
            Finish::Rounded
        };
        let gate_up = matrix_problem(
            shape.format,
            Pairing::GateUp,
            inter,
            hidden,
            rows,
            Finish::Rounded,
            seed,
        )?;
        let down = matrix_problem(
            shape.format,
            Pairing::Plain,
            hidden,
            inter,
            rows,
            finish,
            seed + 1,
        )?;
        let mut d = Draw(seed ^ 0xd3e5);
        let h = h.unwrap_or_else(|| {
            (0..rows as usize * hidden as usize)
                .map(|_| bf16_bits(2.0 * d.uniform()))
                .collect()
        });
        Ok(DenseCase {
            shape,
            post_norm: norm_weight(hidden as usize, &mut d),
            gate_up_packed: gate_up.packed().map_err(|e| e.to_string())?,
            down_packed: down.packed().map_err(|e| e.to_string())?,
            h,
            gate_up,
            down,
        })
    }

    /// The device's post-attention norm output, SwiGLU activations and output.
    pub fn check(&self, h_hat: &[u16], act: &[u16], out: &[u16]) -> Result<DenseMeasured, String> {
        let s = self.shape;
        let rows = s.rows as usize;
        let post_norm = values(&self.post_norm);
        let h = values(&self.h);
        let norm_ref =
            rms_norm_rows(&h, &post_norm, f64::from(s.eps), rows).map_err(|e| e.to_string())?;
        let norm = check_norm(&norm_ref, &values(h_hat)).map_err(|e| format!("post {e}"))?;
        let gate_up = check_matrix(&self.gate_up, h_hat, None, act)
            .map_err(|e| format!("dense gate/up: {e}"))?;
        let residual = s.residual.then_some(&self.h[..]);
        let down =
            check_matrix(&self.down, act, residual, out).map_err(|e| format!("dense down: {e}"))?;
        let relative_error = if s.residual {
            let weights = self.mlp_weights()?;
            let reference = dense_mlp(&h, rows, &post_norm, f64::from(s.eps), &weights)
                .map_err(|e| e.to_string())?;
            let device = values(out);
            let diff: f64 = device
                .iter()
                .zip(&reference.out)
                .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
                .sum();
            let norm: f64 = reference.out.iter().map(|&b| f64::from(b).powi(2)).sum();
            let e = (diff / norm.max(f64::MIN_POSITIVE)).sqrt();
            if e.is_nan() || e > DENSE_TOLERANCE {
                return Err(format!(
                    "dense MLP end to end: relative error {e:.3e}, allowed {DENSE_TOLERANCE:.3e}"
                ));
            }
            e
        } else {
            0.0
        };
        Ok(DenseMeasured {
            norm,
            gate_up,
            down,
            relative_error,
        })
    }

    /// The matrices as `moe::reference` takes them (dequantised values).
    fn mlp_weights(&self) -> Result<MlpWeights, String> {
        let (h, i) = (self.shape.hidden as usize, self.shape.intermediate as usize);
        let m = |rows, cols, v| Matrix::new(rows, cols, v).map_err(|e| e.to_string());
        let gu = self.gate_up.sources();
        Ok(MlpWeights {
            gate: m(i, h, dequantise(&gu[0]))?,
            up: m(i, h, dequantise(&gu[1]))?,
            down: m(h, i, dequantise(&self.down.sources()[0]))?,
        })
    }
}
