use std::ops::Range;

use super::WeightError;

/// A dense row-major f32 matrix, `rows = out` and `cols = in` as linear layers are stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl Matrix {
    pub fn new(rows: usize, cols: usize, data: Vec<f32>) -> Result<Self, WeightError> {
        if data.len() != rows * cols {
            return Err(WeightError::MatrixSize {
                rows,
                cols,
                len: data.len(),
            });
        }
        Ok(Matrix { rows, cols, data })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn data(&self) -> &[f32] {
        &self.data
    }

    fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// y = W x.
    pub fn matvec(&self, x: &[f32]) -> Result<Vec<f32>, WeightError> {
        self.matvec_rows(0..self.rows, x)
    }

    /// y = W\[rows\] x for a contiguous range of output rows (one head's slice, ...).
    pub fn matvec_rows(&self, rows: Range<usize>, x: &[f32]) -> Result<Vec<f32>, WeightError> {
        self.check(&rows, x.len(), self.cols)?;
        Ok(rows.map(|r| dot(self.row(r), x)).collect())
    }

    /// y = W\[rows\]ᵀ x: `x` has one element per row in `rows`, the result `cols`. For weights that
    /// act from the other side (MLA's absorbed W_UK).
    pub fn transposed_matvec_rows(
        &self,
        rows: Range<usize>,
        x: &[f32],
    ) -> Result<Vec<f32>, WeightError> {
        self.check(&rows, x.len(), rows.len())?;
        let mut acc = vec![0f64; self.cols];
        for (r, &xv) in rows.zip(x) {
            let xv = f64::from(xv);
            for (a, &w) in acc.iter_mut().zip(self.row(r)) {
                *a += f64::from(w) * xv;
            }
        }
        Ok(acc.into_iter().map(|v| v as f32).collect())
    }

    fn check(&self, rows: &Range<usize>, len: usize, expected: usize) -> Result<(), WeightError> {
        if rows.end > self.rows || rows.start > rows.end || len != expected {
            return Err(WeightError::Operand {
                rows: self.rows,
                cols: self.cols,
                range: rows.clone(),
                len,
            });
        }
        Ok(())
    }
}

/// Dot product with f64 accumulation: products of bf16 values are exact, so this is as close to
/// the exact sum as any kernel gets.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Four independent sums keep the loop vectorisable.
    let mut acc = [0f64; 4];
    let whole = a.len() / 4 * 4;
    for (ca, cb) in a[..whole].chunks_exact(4).zip(b[..whole].chunks_exact(4)) {
        for k in 0..4 {
            acc[k] += f64::from(ca[k]) * f64::from(cb[k]);
        }
    }
    let tail: f64 = a[whole..]
        .iter()
        .zip(&b[whole..])
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    (acc.iter().sum::<f64>() + tail) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_and_transposed_products() {
        // [[1, 2, 3], [4, 5, 6]]
        let m = Matrix::new(2, 3, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        assert_eq!(m.matvec(&[1.0, 0.0, -1.0]).unwrap(), vec![-2.0, -2.0]);
        assert_eq!(m.matvec_rows(1..2, &[1.0, 1.0, 1.0]).unwrap(), vec![15.0]);
        assert_eq!(
            m.transposed_matvec_rows(0..2, &[1.0, -1.0]).unwrap(),
            vec![-3.0, -3.0, -3.0]
        );
    }

    #[test]
    fn wrong_operands_are_errors() {
        let m = Matrix::new(2, 3, vec![0.0; 6]).unwrap();
        assert!(m.matvec(&[1.0, 2.0]).is_err());
        assert!(m.matvec_rows(1..3, &[0.0; 3]).is_err());
        assert!(m.transposed_matvec_rows(0..2, &[0.0; 3]).is_err());
        assert!(Matrix::new(2, 2, vec![0.0; 3]).is_err());
    }
}
