//! FP8 weights as checkpoints store them: E4M3 codes plus one fp32 scale per 128 x 128 block
//! (`weight_scale_inv`, multiplied in despite its name; spec §1.4).

use super::WeightError;
use crate::format::WEIGHT_BLOCK;
use crate::numerics::{e4m3_decode, quantise_block_e4m3};

/// A `[rows, cols]` weight in FP8: codes row-major, scales `[ceil(rows/128), ceil(cols/128)]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Weight {
    pub rows: usize,
    pub cols: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
}

/// The scale grid's shape for a `[rows, cols]` weight.
pub fn scale_shape(rows: usize, cols: usize) -> [usize; 2] {
    [rows.div_ceil(WEIGHT_BLOCK), cols.div_ceil(WEIGHT_BLOCK)]
}

impl Fp8Weight {
    /// Quantises each 128 x 128 block with its own power-of-two scale (spec §3.4's rule applied to
    /// a weight block).
    pub fn quantise(values: &[f32], rows: usize, cols: usize) -> Result<Self, WeightError> {
        if values.len() != rows * cols {
            return Err(WeightError::MatrixSize {
                rows,
                cols,
                len: values.len(),
            });
        }
        let [block_rows, block_cols] = scale_shape(rows, cols);
        let mut codes = vec![0u8; values.len()];
        let mut scales = vec![0f32; block_rows * block_cols];
        for (b, scale) in scales.iter_mut().enumerate() {
            let cells = block_cells(b / block_cols, b % block_cols, rows, cols);
            let block: Vec<f32> = cells.clone().map(|i| values[i]).collect();
            let quantised = quantise_block_e4m3(&block);
            for (i, code) in cells.zip(quantised.codes) {
                codes[i] = code;
            }
            *scale = quantised.scale;
        }
        Ok(Fp8Weight {
            rows,
            cols,
            codes,
            scales,
        })
    }

    /// code x scale of its block, for every element.
    pub fn dequantise(&self) -> Vec<f32> {
        let block_cols = scale_shape(self.rows, self.cols)[1];
        self.codes
            .iter()
            .enumerate()
            .map(|(i, &code)| {
                let (r, c) = (i / self.cols, i % self.cols);
                let scale = self.scales[(r / WEIGHT_BLOCK) * block_cols + c / WEIGHT_BLOCK];
                e4m3_decode(code) * scale
            })
            .collect()
    }
}

/// Flat indices of block (br, bc) of a `[rows, cols]` matrix, row by row.
fn block_cells(
    br: usize,
    bc: usize,
    rows: usize,
    cols: usize,
) -> impl Iterator<Item = usize> + Clone {
    let row_range = br * WEIGHT_BLOCK..((br + 1) * WEIGHT_BLOCK).min(rows);
    let col_range = bc * WEIGHT_BLOCK..((bc + 1) * WEIGHT_BLOCK).min(cols);
    row_range.flat_map(move |r| col_range.clone().map(move |c| r * cols + c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_get_their_own_scale() {
        // 130 x 3: two block rows; the second holds the two large values.
        let (rows, cols) = (130, 3);
        let mut values = vec![0.01f32; rows * cols];
        values[128 * cols] = 96.0;
        values[129 * cols + 2] = -3.0;
        let w = Fp8Weight::quantise(&values, rows, cols).unwrap();
        assert_eq!(w.scales.len(), 2);
        assert!(w.scales[1] > w.scales[0] * 1000.0);
        let back = w.dequantise();
        assert_eq!(back[128 * cols], 96.0);
        assert_eq!(back[129 * cols + 2], -3.0);
        for (v, b) in values.iter().zip(&back) {
            assert!((v - b).abs() <= v.abs() / 16.0 + 1e-6, "{v} -> {b}");
        }
    }
}
