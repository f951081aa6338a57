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
        found_list(found)
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

/// Entries of a folder a message names before it says how many more there are: a folder that is
/// not a checkpoint may hold thousands.
const FOUND_SHOWN: usize = 8;

fn found_list(found: &[String]) -> String {
    match found.len() {
        0 => "nothing".to_owned(),
        n if n <= FOUND_SHOWN => found.join(", "),
        n => format!(
            "{} and {} more",
            found[..FOUND_SHOWN].join(", "),
            n - FOUND_SHOWN
        ),
    }
}
