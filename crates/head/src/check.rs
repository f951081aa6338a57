//! The contracts a device result of the head is held to.
//!
//! - The embedding is a copy: bit for bit.
//! - The norm: `kernels/ops/rows.h` computes in fp32 what the reference computes in f64, so each
//!   bf16 output may differ from the reference's by at most [`NORM_STEPS`] bf16 step.
//! - The argmax: on the device's own logits it is exact (the pair of the first largest logit by
//!   `total_cmp`), and the pick over shards is the largest pair. Against the reference's logits a
//!   token may differ only where the device's logits (held to the linear task's contract) could
//!   round either way: the reference's logit at the device's token must be within
//!   [`TOKEN_STEPS`] bf16 steps of the reference's largest.

use crate::layout::{pair_id, pair_logit};
use crate::reference::{argmax, shard_pair};

/// Allowed distance of a norm output from the reference's, in bf16 steps.
pub const NORM_STEPS: u32 = 1;
/// Allowed distance, in bf16 steps, of the reference's logit at the device's token from the
/// reference's largest logit, when the two tokens differ.
pub const TOKEN_STEPS: u32 = 1;

/// Distance in bf16 steps between two bf16 values (through zero when their signs differ).
pub fn bf16_steps(a: f32, b: f32) -> u32 {
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

/// What a passing comparison of bf16 values measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measured {
    pub outputs: usize,
    /// Outputs that differ from the reference's.
    pub off_reference: usize,
    /// The largest such difference in bf16 steps.
    pub max_steps: u32,
}

/// Each device value within `steps` bf16 steps of the reference's; errors name the first outside.
pub fn within_steps(
    what: &str,
    reference: &[f32],
    device: &[f32],
    steps: u32,
) -> Result<Measured, String> {
    if reference.len() != device.len() {
        return Err(format!(
            "{what}: {} device values for {} reference values",
            device.len(),
            reference.len()
        ));
    }
    let mut m = Measured {
        outputs: device.len(),
        ..Measured::default()
    };
    for (i, (&r, &d)) in reference.iter().zip(device).enumerate() {
        let s = bf16_steps(r, d);
        if d.is_nan() || s > steps {
            return Err(format!(
                "{what}: value {i} = {d}, reference {r}: {s} bf16 steps, allowed {steps}"
            ));
        }
        if s > 0 {
            m.off_reference += 1;
            m.max_steps = m.max_steps.max(s);
        }
    }
    Ok(m)
}

/// A row RMSNorm's device outputs against the reference's.
pub fn check_norm(reference: &[f32], device: &[f32]) -> Result<Measured, String> {
    within_steps("norm", reference, device, NORM_STEPS)
}

/// One shard's device pairs (`[rows]`) against the pairs of the device's own logits
/// (`[rows, n]`, bf16 values), bit for bit.
pub fn check_pairs(logits: &[f32], n: usize, first_id: u32, pairs: &[u64]) -> Result<(), String> {
    if n == 0 || logits.len() != pairs.len() * n {
        return Err(format!(
            "{} logits for {} rows of {n}",
            logits.len(),
            pairs.len()
        ));
    }
    for (r, (row, &got)) in logits.chunks_exact(n).zip(pairs).enumerate() {
        let want = shard_pair(row, first_id);
        if got != want {
            return Err(format!(
                "row {r}: pair of token {} (logit {}), the logits' argmax is token {} (logit {})",
                pair_id(got),
                pair_logit(got),
                pair_id(want),
                pair_logit(want)
            ));
        }
    }
    Ok(())
}

/// Rows whose device token is not the reference's (each within [`TOKEN_STEPS`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenMeasured {
    pub rows: usize,
    pub near_ties: usize,
}

/// Device tokens (`[rows]`) against the reference's whole-vocabulary logits (`[rows, vocab]`,
/// the reference's bf16 values): the reference's argmax, or a token whose reference logit is
/// within [`TOKEN_STEPS`] of the largest.
pub fn check_tokens(
    reference_logits: &[f32],
    vocab: usize,
    tokens: &[u32],
) -> Result<TokenMeasured, String> {
    if vocab == 0 || reference_logits.len() != tokens.len() * vocab {
        return Err(format!(
            "{} reference logits for {} rows of {vocab}",
            reference_logits.len(),
            tokens.len()
        ));
    }
    let mut m = TokenMeasured {
        rows: tokens.len(),
        near_ties: 0,
    };
    for (r, (row, &t)) in reference_logits.chunks_exact(vocab).zip(tokens).enumerate() {
        let best = argmax(row);
        if t == best {
            continue;
        }
        let Some(&at_t) = row.get(t as usize) else {
            return Err(format!(
                "row {r}: token {t} is past the vocabulary of {vocab}"
            ));
        };
        let steps = bf16_steps(at_t, row[best as usize]);
        if steps > TOKEN_STEPS {
            return Err(format!(
                "row {r}: token {t} (reference logit {at_t}), the reference's is {best} (logit {}): {steps} bf16 steps apart",
                row[best as usize]
            ));
        }
        m.near_ties += 1;
    }
    Ok(m)
}
