/// Everything that can go wrong in this crate; each variant says what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum IndexerError {
    /// An input of the wrong size, or a config the indexer cannot run.
    #[error("{what}: {reason}")]
    Shape { what: &'static str, reason: String },

    #[error(transparent)]
    Model(#[from] model::ModelError),

    #[error(transparent)]
    Weights(#[from] model::weights::WeightError),

    #[error(transparent)]
    Device(#[from] device::DeviceError),
}

pub type Result<T, E = IndexerError> = std::result::Result<T, E>;

pub(crate) fn shape(what: &'static str, reason: impl Into<String>) -> IndexerError {
    IndexerError::Shape {
        what,
        reason: reason.into(),
    }
}

/// Fails unless `values` holds `expected` elements.
pub(crate) fn check_len(
    what: &'static str,
    name: &str,
    values: usize,
    expected: usize,
) -> Result<()> {
    if values == expected {
        Ok(())
    } else {
        Err(shape(
            what,
            format!("{name} has {values} elements, expected {expected}"),
        ))
    }
}
