//! Normalisations. Sums run in f64 so the reference is at least as accurate as any kernel; the
//! result is f32 and the caller rounds to bf16 where the model stores bf16.

use crate::error::{bad_arg, Result};

/// RMSNorm: weight ⊙ x / sqrt(mean(x²) + eps). Transformers rounds to bf16 before the weight, the
/// DeepSeek reference after; this multiplies in full precision and leaves rounding to the caller.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f64) -> Result<Vec<f32>> {
    check_lengths("rms_norm", x, weight.len(), "weight")?;
    let mean_square = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / x.len() as f64;
    let inv_rms = 1.0 / (mean_square + eps).sqrt();
    Ok(x.iter()
        .zip(weight)
        .map(|(&v, &w)| (f64::from(v) * inv_rms * f64::from(w)) as f32)
        .collect())
}

/// LayerNorm with affine weight and bias (the indexer's k_norm, spec §3.1), biased variance as
/// torch computes it.
pub fn layer_norm(x: &[f32], weight: &[f32], bias: &[f32], eps: f64) -> Result<Vec<f32>> {
    check_lengths("layer_norm", x, weight.len(), "weight")?;
    check_lengths("layer_norm", x, bias.len(), "bias")?;
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let variance = x
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    let inv_std = 1.0 / (variance + eps).sqrt();
    Ok(x.iter()
        .zip(weight.iter().zip(bias))
        .map(|(&v, (&w, &b))| {
            ((f64::from(v) - mean) * inv_std * f64::from(w) + f64::from(b)) as f32
        })
        .collect())
}

fn check_lengths(what: &'static str, x: &[f32], len: usize, name: &str) -> Result<()> {
    if x.is_empty() {
        return Err(bad_arg(what, "input is empty"));
    }
    if x.len() != len {
        return Err(bad_arg(
            what,
            format!("input has {} elements but {name} has {len}", x.len()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mean(v: &[f32]) -> f64 {
        v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64
    }

    #[test]
    fn rms_norm_applies_the_weight() {
        let out = rms_norm(&[3.0, -4.0], &[2.0, 0.5], 0.0).unwrap();
        // rms = sqrt(12.5)
        let rms = 12.5f64.sqrt();
        assert!((f64::from(out[0]) - 6.0 / rms).abs() < 1e-6);
        assert!((f64::from(out[1]) + 2.0 / rms).abs() < 1e-6);
    }

    #[test]
    fn length_mismatch_is_an_error() {
        assert!(rms_norm(&[1.0, 2.0], &[1.0], 1e-5).is_err());
        assert!(rms_norm(&[], &[], 1e-5).is_err());
        assert!(layer_norm(&[1.0, 2.0], &[1.0, 1.0], &[0.0], 1e-6).is_err());
    }

    #[test]
    fn eps_keeps_a_zero_vector_finite() {
        let out = rms_norm(&[0.0; 8], &[1.0; 8], 1e-5).unwrap();
        assert!(out.iter().all(|&v| v == 0.0));
        let out = layer_norm(&[5.0; 8], &[1.0; 8], &[0.25; 8], 1e-6).unwrap();
        assert!(out.iter().all(|&v| v == 0.25));
    }

    proptest! {
        #[test]
        fn rms_norm_output_has_unit_rms(x in prop::collection::vec(-100f32..100.0, 1..512)) {
            prop_assume!(x.iter().any(|v| v.abs() > 0.01));
            let out = rms_norm(&x, &vec![1.0; x.len()], 1e-12).unwrap();
            let squares: Vec<f32> = out.iter().map(|v| v * v).collect();
            prop_assert!((mean(&squares) - 1.0).abs() < 1e-4);
        }

        #[test]
        fn layer_norm_output_has_zero_mean_unit_variance(
            x in prop::collection::vec(-100f32..100.0, 2..512),
        ) {
            let m = mean(&x);
            prop_assume!(x.iter().any(|&v| (f64::from(v) - m).abs() > 0.01));
            let ones = vec![1.0; x.len()];
            let zeros = vec![0.0; x.len()];
            let out = layer_norm(&x, &ones, &zeros, 1e-12).unwrap();
            let centred: Vec<f32> = out.iter().map(|v| v * v).collect();
            prop_assert!(mean(&out).abs() < 1e-5);
            prop_assert!((mean(&centred) - 1.0).abs() < 1e-4);
        }
    }
}
