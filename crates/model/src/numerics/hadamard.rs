//! The Sylvester Hadamard transform of the indexer (spec §3.3): H[i][j] = (-1)^popcount(i & j).

use crate::error::{bad_arg, Result};

/// One entry of the n x n Sylvester Hadamard matrix, for any n that is a power of two above i, j.
pub fn sylvester_entry(i: usize, j: usize) -> f32 {
    if (i & j).count_ones() % 2 == 0 {
        1.0
    } else {
        -1.0
    }
}

/// x ← H x, unscaled (so applying it twice multiplies by n), by log2(n) butterfly passes in f64.
pub fn hadamard(x: &mut [f32]) -> Result<()> {
    let n = x.len();
    if !n.is_power_of_two() {
        return Err(bad_arg(
            "hadamard",
            format!("length {n} is not a power of two"),
        ));
    }
    let mut work: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let mut span = 1;
    while span < n {
        for block in work.chunks_exact_mut(2 * span) {
            let (low, high) = block.split_at_mut(span);
            for (a, b) in low.iter_mut().zip(high) {
                (*a, *b) = (*a + *b, *a - *b);
            }
        }
        span *= 2;
    }
    for (out, v) in x.iter_mut().zip(work) {
        *out = v as f32;
    }
    Ok(())
}

/// x ← H x / sqrt(n): orthogonal and symmetric, so it is its own inverse and keeps dot products.
pub fn hadamard_scaled(x: &mut [f32]) -> Result<()> {
    hadamard(x)?;
    let scale = 1.0 / (x.len() as f64).sqrt();
    for v in x.iter_mut() {
        *v = (f64::from(*v) * scale) as f32;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum()
    }

    #[test]
    fn matches_the_explicit_matrix() {
        let n = 16;
        for column in 0..n {
            let mut e = vec![0.0; n];
            e[column] = 1.0;
            hadamard(&mut e).unwrap();
            for (row, &value) in e.iter().enumerate() {
                assert_eq!(value, sylvester_entry(row, column), "H[{row}][{column}]");
            }
        }
    }

    #[test]
    fn rejects_other_lengths() {
        assert!(hadamard(&mut [1.0; 3]).is_err());
        assert!(hadamard(&mut []).is_err());
        assert!(hadamard_scaled(&mut [1.0; 96]).is_err());
        assert!(hadamard(&mut [2.5]).is_ok());
    }

    proptest! {
        /// H·H = nI, checked exactly on small integers (every partial sum is an exact float).
        #[test]
        fn twice_unscaled_is_n_times(
            log_n in 0u32..9,
            seed in prop::collection::vec(-1000i32..1000, 256),
        ) {
            let n = 1usize << log_n;
            let x: Vec<f32> = seed[..n].iter().map(|&v| v as f32).collect();
            let mut y = x.clone();
            hadamard(&mut y).unwrap();
            hadamard(&mut y).unwrap();
            let expected: Vec<f32> = x.iter().map(|&v| v * n as f32).collect();
            prop_assert_eq!(y, expected);
        }

        #[test]
        fn scaled_keeps_dot_products(
            a in prop::collection::vec(-10f32..10.0, 128),
            b in prop::collection::vec(-10f32..10.0, 128),
        ) {
            let (mut ha, mut hb) = (a.clone(), b.clone());
            hadamard_scaled(&mut ha).unwrap();
            hadamard_scaled(&mut hb).unwrap();
            prop_assert!((dot(&ha, &hb) - dot(&a, &b)).abs() < 1e-3);
        }
    }
}
