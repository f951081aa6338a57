//! The caches a decode keeps between steps: per request, per layer, the MLA cache; per full
//! indexer layer, the index keys.

use indexer::reference::ScaledVector;
use mla::reference::MlaCache;
use model::IndexerKind;

use super::{ReferenceModel, ReferenceOptions, Result};

/// One request's caches.
#[derive(Debug, Clone)]
pub(super) struct RequestCache {
    pub mla: Vec<MlaCache>,
    /// `Some` on full indexer layers: one key per cached position.
    pub index_keys: Vec<Option<Vec<ScaledVector>>>,
}

/// The caches of every request, created empty for `requests` requests.
#[derive(Debug, Clone)]
pub struct DecodeState {
    pub(super) requests: Vec<RequestCache>,
    pub(super) options: ReferenceOptions,
}

impl DecodeState {
    /// Empty caches in the formats `options` picks; the same options must be used for every step.
    /// Fails when the config does not suit a format or kernel the options ask for.
    pub fn new(model: &ReferenceModel, requests: usize, options: ReferenceOptions) -> Result<Self> {
        options.check(&model.cfg, "the step's ReferenceOptions")?;
        let request = RequestCache {
            mla: model
                .layers
                .iter()
                .map(|_| MlaCache::new(&model.cfg, options.mla_cache))
                .collect::<mla::Result<_>>()?,
            index_keys: model
                .layers
                .iter()
                .map(|l| (l.plan.indexer == IndexerKind::Full).then(Vec::new))
                .collect(),
        };
        Ok(DecodeState {
            requests: vec![request; requests],
            options,
        })
    }

    pub fn options(&self) -> &ReferenceOptions {
        &self.options
    }

    /// Requests the state holds caches for.
    pub fn requests(&self) -> usize {
        self.requests.len()
    }

    /// The MLA cache records of `request` at `layer` as encoded (token-major, one
    /// `mla::CacheLayout` record a token); `None` outside the state or when the cache keeps exact
    /// values (`CacheStore::F32`).
    pub fn mla_bytes(&self, request: usize, layer: usize) -> Option<&[u8]> {
        self.requests.get(request)?.mla.get(layer)?.bytes()
    }

    /// The index keys of `request` at a full-indexer `layer`, one a cached position.
    pub fn index_keys(&self, request: usize, layer: usize) -> Option<&[ScaledVector]> {
        self.requests
            .get(request)?
            .index_keys
            .get(layer)?
            .as_deref()
    }

    /// Tokens cached for `request` (every layer holds the same count).
    pub fn cached(&self, request: usize) -> Option<usize> {
        self.requests
            .get(request)
            .map(|r| r.mla.first().map_or(0, MlaCache::len))
    }
}
