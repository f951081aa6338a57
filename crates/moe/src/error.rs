/// Everything that can go wrong in this crate; each variant says what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum MoeError {
    #[error("{what}: {reason}")]
    Invalid { what: &'static str, reason: String },

    #[error(transparent)]
    Model(#[from] model::ModelError),

    #[error(transparent)]
    Weights(#[from] model::weights::WeightError),
}

pub type Result<T, E = MoeError> = std::result::Result<T, E>;

pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> MoeError {
    MoeError::Invalid {
        what,
        reason: reason.into(),
    }
}
