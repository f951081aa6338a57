//! The CPU reference of the linear task: y[r, c] = Σ_k x[r, k] W[c, k] on the published (not
//! packed) weights, summed in f64, then the epilogue with the roundings a bf16 model stores:
//!
//! - plain: `y` (fp32 output), or `bf16(y)`;
//! - a per-row scale `w` (a routed expert's weight): `bf16(bf16(y) * w)`;
//! - a residual `h`: `bf16(h + v)` where `v` is the value above;
//! - SwiGLU (gate/up): `bf16(bf16(silu(bf16(g))) * bf16(u))` (moe's reference, step by step).

use super::fp8::Fp8Weight;
use super::packed::{Pairing, SourceWeight};
use super::WeightError;
use crate::numerics::{bf16_round, silu};

/// What the linear writes after the sums.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Epilogue<'a> {
    /// fp32 output with no rounding (the router's logits); only for plain pairing without the
    /// other terms.
    pub out_f32: bool,
    /// `[rows]` weights each output row is scaled by.
    pub row_scale: Option<&'a [f32]>,
    /// `[rows, n_out]` bf16 values added last.
    pub residual: Option<&'a [f32]>,
}

impl Epilogue<'_> {
    pub const BF16: Epilogue<'static> = Epilogue {
        out_f32: false,
        row_scale: None,
        residual: None,
    };
    pub const F32: Epilogue<'static> = Epilogue {
        out_f32: true,
        row_scale: None,
        residual: None,
    };
}

/// A source's values as f32 (FP8 codes times their block scale; bf16 exactly).
pub fn dequantise(source: &SourceWeight) -> Vec<f32> {
    match source {
        SourceWeight::Fp8(w) => Fp8Weight::dequantise(w),
        SourceWeight::Bf16 { bits, .. } => bits
            .iter()
            .map(|&b| f32::from_bits(u32::from(b) << 16))
            .collect(),
    }
}

fn dot(w: &[f32], x: &[f32]) -> f64 {
    w.iter()
        .zip(x)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum()
}

/// The linear of `rows` rows of `x` (`[rows, k]`, bf16 values) with `sources` (one, or gate then
/// up) of shape `[n, k]`: `[rows, n]` outputs (n SwiGLU columns for gate/up).
pub fn linear(
    pairing: Pairing,
    sources: &[SourceWeight],
    n: usize,
    k: usize,
    x: &[f32],
    rows: usize,
    epilogue: &Epilogue,
) -> Result<Vec<f32>, WeightError> {
    let bad = |reason: String| WeightError::Packing { reason };
    if sources.len() != pairing.sources() || x.len() != rows * k {
        return Err(bad(format!(
            "linear reference: {} sources for {pairing:?}, x of {} for {rows} x {k}",
            sources.len(),
            x.len()
        )));
    }
    let gate_up = pairing == Pairing::GateUp;
    let others = epilogue.row_scale.is_some() || epilogue.residual.is_some();
    if epilogue.out_f32 && (gate_up || others) || gate_up && others {
        return Err(bad(
            "fp32 output takes no other epilogue, SwiGLU no scale or residual".into(),
        ));
    }
    if epilogue.row_scale.is_some_and(|s| s.len() != rows)
        || epilogue.residual.is_some_and(|h| h.len() != rows * n)
    {
        return Err(bad(format!(
            "row scales / residual do not match {rows} rows of {n}"
        )));
    }
    let values: Vec<Vec<f32>> = sources.iter().map(dequantise).collect();
    let mut y = vec![0f32; rows * n];
    for r in 0..rows {
        let xr = &x[r * k..(r + 1) * k];
        for c in 0..n {
            let sum = |s: usize| dot(&values[s][c * k..(c + 1) * k], xr) as f32;
            y[r * n + c] = if gate_up {
                let (g, u) = (bf16_round(sum(0)), bf16_round(sum(1)));
                bf16_round(bf16_round(silu(g)) * u)
            } else if epilogue.out_f32 {
                sum(0)
            } else {
                let mut v = bf16_round(sum(0));
                if let Some(s) = epilogue.row_scale {
                    v = bf16_round(v * s[r]);
                }
                if let Some(h) = epilogue.residual {
                    v = bf16_round(h[r * n + c] + v);
                }
                v
            };
        }
    }
    Ok(y)
}
