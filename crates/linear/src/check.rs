//! The contract a device result is held to. The device's fp32 sum of an output may differ from the
//! exact sum by at most [`SUM_TOLERANCE`] x Σ|x w| (different summation order, FP8 scales applied
//! per k-block); every rounding after the sum is exact. So an fp32 output must lie that close to
//! the exact sum, and a bf16 output must equal the epilogue applied exactly to one of the bf16
//! values the sum can round to (SwiGLU: and its silu may differ by [`SILU_TOLERANCE`], relative,
//! since the device's exp is not the host's).

use crate::cases::Problem;
use model::numerics::{bf16_round, silu};
use model::weights::linear::dequantise;
use model::weights::packed::Pairing;

/// Allowed |device sum - exact sum| / Σ|x w| (2^-16).
pub const SUM_TOLERANCE: f64 = 1.0 / 65536.0;
/// Allowed relative difference of the device's silu (2^-20).
pub const SILU_TOLERANCE: f32 = 1.0 / 1_048_576.0;

/// What a passing result measured.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measured {
    pub outputs: usize,
    /// bf16 outputs that differ from the reference's own rounding.
    pub off_reference: usize,
    /// The largest such difference in bf16 steps.
    pub max_steps: u32,
    /// fp32 outputs: the largest |device - exact| / Σ|x w|.
    pub max_sum_error: f64,
}

/// The smallest interval holding f(v) for v in [lo, hi], f monotonic on it or not.
fn span(lo: f32, hi: f32, values: &[f32]) -> (f32, f32) {
    let (mut a, mut b) = (lo.min(hi), lo.max(hi));
    for &v in values {
        a = a.min(v);
        b = b.max(v);
    }
    (a, b)
}

/// Where silu has its minimum: silu is decreasing below it and increasing above.
const SILU_ARGMIN: f32 = -1.278_464_5;

/// The range of silu over [lo, hi].
fn silu_span(lo: f32, hi: f32) -> (f32, f32) {
    let inside = if lo < SILU_ARGMIN && SILU_ARGMIN < hi {
        vec![silu(SILU_ARGMIN)]
    } else {
        Vec::new()
    };
    span(silu(lo), silu(hi), &inside)
}

/// Widens [lo, hi] by a relative `tol` of each end's magnitude.
fn widen(lo: f32, hi: f32, tol: f32) -> (f32, f32) {
    (lo - lo.abs() * tol, hi + hi.abs() * tol)
}

/// Distance in bf16 steps between two bf16 values of one sign (or zero).
fn steps(a: f32, b: f32) -> u32 {
    let key = |v: f32| {
        let bits = (v.to_bits() >> 16) as i32;
        if bits & 0x8000 != 0 {
            -(bits & 0x7fff)
        } else {
            bits
        }
    };
    key(a).abs_diff(key(b))
}

/// Checks `y` (`[rows, n]`, the device's outputs as f32) against the problem's exact sums.
/// Errors name the first output outside the contract.
pub fn check(p: &Problem, y: &[f32]) -> Result<Measured, String> {
    if y.len() != p.rows * p.n {
        return Err(format!("{} outputs for {} x {}", y.len(), p.rows, p.n));
    }
    let reference = p.reference().map_err(|e| e.to_string())?;
    let w: Vec<Vec<f32>> = p.sources().iter().map(dequantise).collect();
    let x = p.x_values();
    let residual = p.residual_values();
    let mut m = Measured {
        outputs: y.len(),
        ..Measured::default()
    };
    for r in 0..p.rows {
        let xr = &x[r * p.k..(r + 1) * p.k];
        for c in 0..p.n {
            let at = r * p.n + c;
            let sum = |s: usize| {
                let row = &w[s][c * p.k..(c + 1) * p.k];
                let exact: f64 = row
                    .iter()
                    .zip(xr)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let abs: f64 = row
                    .iter()
                    .zip(xr)
                    .map(|(&a, &b)| f64::from(a * b).abs())
                    .sum();
                (exact, abs * SUM_TOLERANCE)
            };
            // The bf16 values the device's sum can round to lie in [round(lo), round(hi)].
            let rounded = |s: usize| {
                let (e, tol) = sum(s);
                (bf16_round((e - tol) as f32), bf16_round((e + tol) as f32))
            };
            let got = y[at];
            let (lo, hi) = if p.out_f32() {
                let (e, tol) = sum(0);
                let err = (f64::from(got) - e).abs();
                if err <= tol {
                    m.max_sum_error = m
                        .max_sum_error
                        .max(err / (tol / SUM_TOLERANCE).max(f64::MIN_POSITIVE));
                    continue;
                }
                return Err(format!(
                    "{}: output [{r}, {c}] = {got}, exact {e}, allowed error {tol}",
                    p.name
                ));
            } else if p.pairing == Pairing::GateUp {
                // Every step after the sums is monotonic in each operand (silu on each side of
                // its minimum), so the output lies between the roundings of the extreme products.
                let ((gl, gh), (ul, uh)) = (rounded(0), rounded(1));
                let (sl, sh) = silu_span(gl, gh);
                let (sl, sh) = widen(sl, sh, SILU_TOLERANCE);
                let (sl, sh) = (bf16_round(sl), bf16_round(sh));
                let corners = [sl * ul, sl * uh, sh * ul, sh * uh];
                let (pl, ph) = span(corners[0], corners[0], &corners);
                (bf16_round(pl), bf16_round(ph))
            } else {
                let finish = |mut v: f32| {
                    if p.has_row_scale() {
                        v = bf16_round(v * p.row_scale[r]);
                    }
                    if p.has_residual() {
                        v = bf16_round(residual[at] + v);
                    }
                    v
                };
                let (l, h) = rounded(0);
                span(finish(l), finish(h), &[])
            };
            if got.is_nan() || got < lo || got > hi {
                return Err(format!(
                    "{}: output [{r}, {c}] = {got}, reference {}, allowed [{lo}, {hi}]",
                    p.name, reference[at]
                ));
            }
            if got != reference[at] {
                m.off_reference += 1;
                m.max_steps = m.max_steps.max(steps(got, reference[at]));
            }
        }
    }
    Ok(m)
}
