//! Where the CPU references get their weights: a Hugging Face safetensors checkpoint (memory-mapped,
//! FP8 block scales multiplied in) or deterministic synthetic values for runs without one. Both
//! answer by the published tensor names (`model.layers.{i}.self_attn.q_a_proj.weight`, ...) and
//! check every shape against the config, so a reference cannot silently read the wrong tensor.

mod error;
mod fp8;
pub mod linear;
mod matrix;
mod names;
pub mod packed;
mod safetensors;
mod synthetic;

pub use self::safetensors::{write_checkpoint, Checkpoint, INDEX_FILE, SINGLE_FILE};
pub use error::WeightError;
pub use fp8::{scale_shape, Fp8Weight};
pub use matrix::Matrix;
pub use names::{checkpoint_tensors, expert_tensor_name, layer_tensor_name, TensorSpec};
pub use synthetic::{synthetic_values, Synthetic, SyntheticKind, SyntheticRule};

/// A store of named tensors. Every tensor comes back as f32 (bf16 and FP8 values are exact in
/// f32), after a check that it exists and has the shape the caller expects.
pub trait WeightSource {
    /// The tensor `name` with `shape` (row-major; `[n]` for vectors).
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightError>;

    /// A `[rows, cols]` weight (`out x in`, as checkpoints store linear layers).
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, WeightError> {
        let data = self.tensor(name, &[rows, cols])?;
        Matrix::new(rows, cols, data)
    }

    /// A 1-D tensor of `len` elements (norm weights, biases).
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, WeightError> {
        self.tensor(name, &[len])
    }

    /// The `[rows, cols]` weight `name` as FP8 codes and block scales, where the store keeps it
    /// so (a published FP8 checkpoint); `None` where it holds other values. A device that keeps
    /// the weight in FP8 takes these as they are: quantising [`WeightSource::tensor`]'s values
    /// again would not give back scales that are not powers of two.
    fn fp8(&self, name: &str, rows: usize, cols: usize) -> Result<Option<Fp8Weight>, WeightError> {
        let _ = (name, rows, cols);
        Ok(None)
    }
}
