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

    /// Rows `row0..row0 + rows` and columns `col0..col0 + cols` with their blocks' scales, when
    /// the window covers whole 128 x 128 blocks (each edge on a block boundary or the matrix's
    /// end): a tensor-parallel shard of a checkpoint's weight, its codes and scales as stored.
    /// `None` for a window that cuts a block or lies outside the matrix.
    pub fn window(&self, row0: usize, rows: usize, col0: usize, cols: usize) -> Option<Self> {
        let on_blocks = |start: usize, len: usize, whole: usize| {
            start % WEIGHT_BLOCK == 0
                && start + len <= whole
                && ((start + len) % WEIGHT_BLOCK == 0 || start + len == whole)
        };
        if !on_blocks(row0, rows, self.rows) || !on_blocks(col0, cols, self.cols) {
            return None;
        }
        let codes = (row0..row0 + rows)
            .flat_map(|r| {
                let start = r * self.cols + col0;
                self.codes[start..start + cols].iter().copied()
            })
            .collect();
        let block_cols = scale_shape(self.rows, self.cols)[1];
        let [grid_rows, grid_cols] = scale_shape(rows, cols);
        let (block_row0, block_col0) = (row0 / WEIGHT_BLOCK, col0 / WEIGHT_BLOCK);
        let scales = (0..grid_rows)
            .flat_map(|br| {
                let start = (block_row0 + br) * block_cols + block_col0;
                self.scales[start..start + grid_cols].iter().copied()
            })
            .collect();
        Some(Fp8Weight {
            rows,
            cols,
            codes,
            scales,
        })
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
    use proptest::prelude::*;

    /// A `[rows, cols]` weight with distinct codes and scales, so that a misplaced one shows.
    fn numbered(rows: usize, cols: usize) -> Fp8Weight {
        let [br, bc] = scale_shape(rows, cols);
        Fp8Weight {
            rows,
            cols,
            // Codes below 0x7f: no NaN, whose inequality would hide a match.
            codes: (0..rows * cols).map(|i| (i % 127) as u8).collect(),
            scales: (0..br * bc).map(|b| 0.75 + b as f32).collect(),
        }
    }

    proptest! {
        /// A window on block boundaries holds the matrix's codes and scales of its rows and
        /// columns: dequantised, it is the same window of the whole matrix dequantised.
        #[test]
        fn a_window_on_blocks_is_the_same_part_of_the_matrix(
            grid in (1usize..4, 1usize..4, 1usize..130, 1usize..130),
            picks in (0usize..4, 0usize..4, 1usize..4, 1usize..4),
        ) {
            let (br, bc, last_rows, last_cols) = grid;
            let (rows, cols) = ((br - 1) * 128 + last_rows, (bc - 1) * 128 + last_cols);
            let w = numbered(rows, cols);
            let (b0, c0) = (picks.0 % br, picks.1 % bc);
            let (b1, c1) = ((b0 + picks.2).min(br), (c0 + picks.3).min(bc));
            let (row0, col0) = (b0 * 128, c0 * 128);
            let (row_end, col_end) = ((b1 * 128).min(rows), (c1 * 128).min(cols));
            let part = w.window(row0, row_end - row0, col0, col_end - col0).unwrap();
            let whole = w.dequantise();
            let want: Vec<f32> = (row0..row_end)
                .flat_map(|r| whole[r * cols + col0..r * cols + col_end].to_vec())
                .collect();
            prop_assert_eq!(part.dequantise(), want);
        }
    }

    #[test]
    fn a_window_that_cuts_a_block_is_refused() {
        let w = numbered(300, 256);
        assert!(w.window(0, 300, 0, 256).is_some());
        assert!(w.window(128, 172, 128, 128).is_some());
        assert!(w.window(0, 100, 0, 256).is_none(), "ends inside a block");
        assert!(w.window(64, 128, 0, 256).is_none(), "starts inside a block");
        assert!(w.window(0, 128, 0, 384).is_none(), "past the last column");
    }

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
