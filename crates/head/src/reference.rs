//! The CPU references of the head's tasks and of the two chains they make with the linear task,
//! as the reference step computes them (`executor::reference`, bf16 activations): the embedding
//! row of each token; the RMSNorm rounded to bf16; lm_head's logits rounded to bf16 and the first
//! index of the largest by `total_cmp`; the dense MLP as `moe::reference::mlp`, then the residual
//! `bf16(h + y)`. Sums run in f64 (the model's and moe's references).

use crate::layout::{pair_id, pair_of};
use model::numerics::{bf16_round, rms_norm};
use model::weights::linear::{linear, Epilogue};
use model::weights::packed::{Pairing, SourceWeight};
use model::weights::{Matrix, WeightError};
use moe::reference::{mlp, MlpWeights};

#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    #[error("row {row}: token {token} is outside the vocabulary of {vocab}")]
    Token {
        row: usize,
        token: u32,
        vocab: usize,
    },
    #[error("{what}: {len} values for {rows} rows of {width}")]
    Shape {
        what: &'static str,
        len: usize,
        rows: usize,
        width: usize,
    },
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error(transparent)]
    Weights(#[from] WeightError),
    #[error(transparent)]
    Moe(#[from] moe::MoeError),
}

pub type Result<T, E = ReferenceError> = std::result::Result<T, E>;

fn rows_of<'a>(
    what: &'static str,
    x: &'a [f32],
    rows: usize,
    width: usize,
) -> Result<std::slice::ChunksExact<'a, f32>> {
    if width == 0 || x.len() != rows * width {
        return Err(ReferenceError::Shape {
            what,
            len: x.len(),
            rows,
            width,
        });
    }
    Ok(x.chunks_exact(width))
}

/// `[rows, hidden]`: the table's row of each token (`table` is `[vocab, hidden]`).
pub fn embed(table: &Matrix, tokens: &[u32]) -> Result<Vec<f32>> {
    let hidden = table.cols();
    let mut out = Vec::with_capacity(tokens.len() * hidden);
    for (row, &token) in tokens.iter().enumerate() {
        let t = token as usize;
        if t >= table.rows() {
            return Err(ReferenceError::Token {
                row,
                token,
                vocab: table.rows(),
            });
        }
        out.extend_from_slice(&table.data()[t * hidden..(t + 1) * hidden]);
    }
    Ok(out)
}

/// `[rows, n]`: each row's RMSNorm with `weight`, rounded to bf16.
pub fn rms_norm_rows(x: &[f32], weight: &[f32], eps: f64, rows: usize) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(x.len());
    for row in rows_of("rms_norm", x, rows, weight.len())? {
        out.extend(rms_norm(row, weight, eps)?.into_iter().map(bf16_round));
    }
    Ok(out)
}

/// The first index of the largest value by `total_cmp` (the reference step's argmax).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if v.total_cmp(&values[best]).is_gt() {
            best = i;
        }
    }
    best as u32
}

/// The largest pair of one shard's logits, whose first token id is `first_id`.
pub fn shard_pair(logits: &[f32], first_id: u32) -> u64 {
    logits
        .iter()
        .enumerate()
        .map(|(c, &v)| pair_of(v, first_id + c as u32))
        .max()
        .unwrap_or(0)
}

/// The token of the largest of the shards' pairs.
pub fn pick(pairs: &[u64]) -> u32 {
    pair_id(pairs.iter().copied().max().unwrap_or(0))
}

/// What the tail computes for one vocabulary shard.
#[derive(Clone, Debug, PartialEq)]
pub struct TailOutput {
    /// `[rows, hidden]`: the final norm's output, bf16 values.
    pub z: Vec<f32>,
    /// `[rows, n]`: the shard's logits, bf16 values.
    pub logits: Vec<f32>,
    /// `[rows]`: the shard's pair of each row.
    pub pairs: Vec<u64>,
    /// `[rows]`: the shard's argmax as a token id.
    pub tokens: Vec<u32>,
}

/// The tail over one vocabulary shard: lm_head's rows `first_id .. first_id + n` as `lm_head`
/// (`[n, hidden]`), on `rows` rows of `x` (`[rows, hidden]`, bf16 values).
pub fn tail(
    x: &[f32],
    rows: usize,
    final_norm: &[f32],
    eps: f64,
    lm_head: &SourceWeight,
    n: usize,
    first_id: u32,
) -> Result<TailOutput> {
    let hidden = final_norm.len();
    let z = rms_norm_rows(x, final_norm, eps, rows)?;
    let logits = linear(
        Pairing::Plain,
        std::slice::from_ref(lm_head),
        n,
        hidden,
        &z,
        rows,
        &Epilogue::BF16,
    )?;
    let pairs: Vec<u64> = logits
        .chunks_exact(n)
        .map(|row| shard_pair(row, first_id))
        .collect();
    let tokens = pairs.iter().map(|&p| pair_id(p)).collect();
    Ok(TailOutput {
        z,
        logits,
        pairs,
        tokens,
    })
}

/// What the dense MLP computes.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseOutput {
    /// `[rows, hidden]`: the post-attention norm's output.
    pub h_hat: Vec<f32>,
    /// `[rows, hidden]`: `bf16(h + mlp(h_hat))`, the next layer's input.
    pub out: Vec<f32>,
}

/// The dense MLP of a layer with its norm and residual: `h` is `[rows, hidden]` (bf16 values).
pub fn dense_mlp(
    h: &[f32],
    rows: usize,
    post_norm: &[f32],
    eps: f64,
    weights: &MlpWeights,
) -> Result<DenseOutput> {
    let h_hat = rms_norm_rows(h, post_norm, eps, rows)?;
    let hidden = post_norm.len();
    let mut out = Vec::with_capacity(h.len());
    for (h_r, x_r) in h.chunks_exact(hidden).zip(h_hat.chunks_exact(hidden)) {
        let y = mlp(weights, x_r, true)?;
        out.extend(h_r.iter().zip(&y).map(|(&a, &b)| bf16_round(a + b)));
    }
    Ok(DenseOutput { h_hat, out })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn argmax_takes_the_first_of_equal_values() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -2.0]), 1);
        // total_cmp: +0 is above -0.
        assert_eq!(argmax(&[-0.0, 0.0, -1.0]), 1);
        assert_eq!(argmax(&[-1.0, -0.5, -0.5]), 1);
    }

    proptest! {
        /// Any split of a row into shards picks the argmax of the whole row.
        #[test]
        fn shards_pick_the_whole_rows_argmax(
            // Few distinct values, so that ties are common.
            values in prop::collection::vec(-3i32..3, 1..300),
            cuts in prop::collection::vec(0usize..300, 0..6),
            negative_zero in any::<bool>(),
        ) {
            let row: Vec<f32> = values
                .iter()
                .map(|&v| if v == 0 && negative_zero { -0.0 } else { v as f32 * 0.5 })
                .collect();
            let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c % row.len()).collect();
            bounds.extend([0, row.len()]);
            bounds.sort_unstable();
            bounds.dedup();
            let pairs: Vec<u64> = bounds
                .windows(2)
                .map(|w| shard_pair(&row[w[0]..w[1]], w[0] as u32))
                .collect();
            prop_assert_eq!(pick(&pairs), argmax(&row));
        }

        #[test]
        fn pairs_keep_the_logit(v in any::<f32>(), id in any::<u32>()) {
            let p = pair_of(v, id);
            prop_assert_eq!(pair_id(p), id);
            prop_assert_eq!(crate::layout::pair_logit(p).to_bits(), v.to_bits());
        }
    }
}
