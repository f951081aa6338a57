use std::path::PathBuf;

use crate::error::ModelError;

/// What went wrong while finding, reading or checking a weight. Messages name the tensor (and the
/// file where there is one), so they can be printed as they are.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path} is not a valid safetensors file: {reason}")]
    Format { path: PathBuf, reason: String },

    #[error(
        "{dir} holds no checkpoint: neither model.safetensors.index.json nor model.safetensors \
         (found: {})",
        if found.is_empty() { "nothing".to_owned() } else { found.join(", ") }
    )]
    NoCheckpoint { dir: PathBuf, found: Vec<String> },

    #[error("{path} is not a valid safetensors index: {reason}")]
    Index { path: PathBuf, reason: String },

    #[error("{index} puts tensor `{name}` in {file}, which does not exist")]
    ShardMissing {
        index: PathBuf,
        name: String,
        file: PathBuf,
    },

    #[error("{index} puts tensor `{name}` in {file}, which does not hold it")]
    NotInShard {
        index: PathBuf,
        name: String,
        file: PathBuf,
    },

    #[error("tensor `{name}` is missing from {source_desc}")]
    Missing { name: String, source_desc: String },

    #[error("tensor `{name}`: expected shape {expected:?}, found {found:?}{location}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
        /// " in `<file>`" where the tensor came from a file, else empty.
        location: String,
    },

    #[error("tensor `{name}` in {path}: {reason}")]
    Dtype {
        name: String,
        path: PathBuf,
        reason: String,
    },

    #[error("matrix of {rows} x {cols} given {len} values")]
    MatrixSize {
        rows: usize,
        cols: usize,
        len: usize,
    },

    #[error("product with a {rows} x {cols} matrix over rows {range:?} given an operand of {len}")]
    Operand {
        rows: usize,
        cols: usize,
        range: std::ops::Range<usize>,
        len: usize,
    },

    #[error("packing a weight for the device: {reason}")]
    Packing { reason: String },

    #[error(transparent)]
    Config(#[from] ModelError),
}
