//! Rotary position embedding. GLM-5 uses the interleaved form for both MLA and the indexer
//! (spec §2.4, §3.2); the half-split form is DeepSeek-V3.2's indexer and is kept to test that the
//! two are told apart.

use crate::error::{bad_arg, Result};

/// Which dimensions rotate together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// GPT-J: pairs (2i, 2i+1).
    Interleaved,
    /// NeoX: pairs (i, i + d/2).
    HalfSplit,
}

impl RopeStyle {
    /// The style a config's `rope_interleave` / `indexer_rope_interleave` flag selects.
    pub fn from_interleave(interleave: bool) -> Self {
        if interleave {
            RopeStyle::Interleaved
        } else {
            RopeStyle::HalfSplit
        }
    }
}

/// θ_i = theta^(-2i/dim) for i in 0..dim/2: pair i turns by position x θ_i.
pub fn rope_inv_freq(dim: usize, theta: f64) -> Vec<f64> {
    (0..dim / 2)
        .map(|i| theta.powf(-2.0 * i as f64 / dim as f64))
        .collect()
}

/// Rotates `v` in place for `position`. Angles and products in f64: the oracle should not carry
/// the bf16 cos/sin tables transformers uses.
pub fn apply_rope(v: &mut [f32], position: u64, theta: f64, style: RopeStyle) -> Result<()> {
    let dim = v.len();
    if dim % 2 != 0 {
        return Err(bad_arg(
            "apply_rope",
            format!("vector has {dim} elements; rope needs an even number"),
        ));
    }
    let half = dim / 2;
    for (i, freq) in rope_inv_freq(dim, theta).into_iter().enumerate() {
        let (a, b) = match style {
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            RopeStyle::HalfSplit => (i, i + half),
        };
        let (sin, cos) = (position as f64 * freq).sin_cos();
        let (x, y) = (f64::from(v[a]), f64::from(v[b]));
        v[a] = (x * cos - y * sin) as f32;
        v[b] = (y * cos + x * sin) as f32;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn norm(v: &[f32]) -> f64 {
        v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt()
    }

    fn dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum()
    }

    fn roped(v: &[f32], position: u64, style: RopeStyle) -> Vec<f32> {
        let mut out = v.to_vec();
        apply_rope(&mut out, position, 1e6, style).unwrap();
        out
    }

    /// (v[0], v[2], ..., v[1], v[3], ...): the order transformers puts an interleaved vector in.
    fn evens_then_odds(v: &[f32]) -> Vec<f32> {
        v.iter()
            .step_by(2)
            .chain(v.iter().skip(1).step_by(2))
            .copied()
            .collect()
    }

    #[test]
    fn first_pair_turns_by_the_position_in_radians() {
        let mut v = [1.0, 0.0];
        apply_rope(&mut v, 3, 1e6, RopeStyle::Interleaved).unwrap();
        assert!((f64::from(v[0]) - 3f64.cos()).abs() < 1e-7);
        assert!((f64::from(v[1]) - 3f64.sin()).abs() < 1e-7);
    }

    #[test]
    fn inv_freq_matches_glm5() {
        let f = rope_inv_freq(64, 1e6);
        assert_eq!(f.len(), 32);
        assert_eq!(f[0], 1.0);
        assert!((f[31] / 1e6f64.powf(-62.0 / 64.0) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn odd_length_is_an_error() {
        assert!(apply_rope(&mut [1.0; 3], 1, 1e6, RopeStyle::Interleaved).is_err());
    }

    #[test]
    fn interleaved_and_half_split_differ() {
        let v: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let a = roped(&v, 5, RopeStyle::Interleaved);
        let b = roped(&v, 5, RopeStyle::HalfSplit);
        let gap = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(gap > 0.1, "styles agree to {gap}");
    }

    proptest! {
        #[test]
        fn position_zero_is_identity(v in prop::collection::vec(-10f32..10.0, 32)) {
            prop_assert_eq!(roped(&v, 0, RopeStyle::Interleaved), v.clone());
            prop_assert_eq!(roped(&v, 0, RopeStyle::HalfSplit), v);
        }

        #[test]
        fn rope_preserves_the_norm(
            v in prop::collection::vec(-10f32..10.0, 64),
            position in 0u64..1_000_000,
        ) {
            for style in [RopeStyle::Interleaved, RopeStyle::HalfSplit] {
                let r = roped(&v, position, style);
                prop_assert!((norm(&r) - norm(&v)).abs() <= 1e-5 * norm(&v) + 1e-6);
            }
        }

        #[test]
        fn scores_depend_only_on_relative_position(
            q in prop::collection::vec(-1f32..1.0, 64),
            k in prop::collection::vec(-1f32..1.0, 64),
            m in 0u64..10_000,
            n in 0u64..10_000,
            shift in 0u64..10_000,
        ) {
            let style = RopeStyle::Interleaved;
            let before = dot(&roped(&q, m, style), &roped(&k, n, style));
            let after = dot(&roped(&q, m + shift, style), &roped(&k, n + shift, style));
            prop_assert!((before - after).abs() < 1e-4);
        }

        /// Spec §2.4: transformers permutes to evens-then-odds and rotates half-split; that is
        /// the interleaved rotation with its output in the permuted order.
        #[test]
        fn interleaved_is_half_split_on_permuted_dims(
            v in prop::collection::vec(-10f32..10.0, 64),
            position in 0u64..100_000,
        ) {
            let direct = evens_then_odds(&roped(&v, position, RopeStyle::Interleaved));
            let via_permutation = roped(&evens_then_odds(&v), position, RopeStyle::HalfSplit);
            prop_assert_eq!(direct, via_permutation);
        }
    }
}
