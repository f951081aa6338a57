use std::path::PathBuf;

/// Everything that can go wrong in this crate. Each variant says what was wrong so the caller can
/// print it as is.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("config.json: {0}")]
    Json(#[from] serde_json::Error),

    #[error("invalid config: `{field}` {reason}")]
    InvalidConfig { field: &'static str, reason: String },

    /// A config the model runs, but not with a storage format or kernel a run asked for.
    #[error("{feature} (asked for by {asked_by}) cannot take this config: `{field}` {reason}")]
    Unsuited {
        feature: &'static str,
        asked_by: String,
        field: &'static str,
        reason: String,
    },

    #[error("unknown preset `{name}`; valid presets: {valid}")]
    UnknownPreset { name: String, valid: String },

    #[error("cannot shard for TP {tp}: {reason}")]
    Sharding { tp: usize, reason: String },

    #[error("{what}: {reason}")]
    InvalidArgument { what: &'static str, reason: String },
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// Shorthand for the config checks, which all name a field and say why it is wrong.
pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> ModelError {
    ModelError::InvalidConfig {
        field,
        reason: reason.into(),
    }
}

/// Shorthand for the rules of a format or kernel, which name the option that asked for it.
pub(crate) fn unsuited(
    feature: &'static str,
    asked_by: &str,
    field: &'static str,
    reason: impl Into<String>,
) -> ModelError {
    ModelError::Unsuited {
        feature,
        asked_by: asked_by.to_owned(),
        field,
        reason: reason.into(),
    }
}

/// Shorthand for numerics helpers given inputs of the wrong size.
pub(crate) fn bad_arg(what: &'static str, reason: impl Into<String>) -> ModelError {
    ModelError::InvalidArgument {
        what,
        reason: reason.into(),
    }
}
