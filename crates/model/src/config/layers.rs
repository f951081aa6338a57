//! Which MLP and which indexer each layer runs.

use serde::{Deserialize, Serialize};

use super::ModelConfig;
use crate::error::{invalid, Result};

/// A layer's indexer as Hugging Face's `indexer_types` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexerType {
    Full,
    Shared,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MlpKind {
    Dense,
    Moe,
}

/// A layer either runs its own indexer or reuses, unchanged, the top-k of `source_layer`: the
/// closest earlier full layer (spec §1.2, §3.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexerKind {
    Full,
    Shared { source_layer: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerPlan {
    pub index: usize,
    pub mlp: MlpKind,
    pub indexer: IndexerKind,
}

impl ModelConfig {
    /// Hugging Face's rule (spec §1.2): layer i is full iff max(i - offset + 1, 0) mod freq == 0.
    pub(crate) fn indexer_types_from_rule(&self) -> Vec<IndexerType> {
        // transformers clamps the frequency to at least 1; validate() rejects 0 anyway.
        let freq = self.index_topk_freq.max(1) as i64;
        (0..self.num_hidden_layers)
            .map(|i| {
                let shifted = (i as i64)
                    .saturating_sub(self.index_skip_topk_offset)
                    .saturating_add(1)
                    .max(0);
                if shifted % freq == 0 {
                    IndexerType::Full
                } else {
                    IndexerType::Shared
                }
            })
            .collect()
    }

    /// The per-layer indexer list: the explicit one if the config has it, else the rule's.
    pub fn indexer_types(&self) -> Vec<IndexerType> {
        self.indexer_types
            .clone()
            .unwrap_or_else(|| self.indexer_types_from_rule())
    }

    /// One entry per layer, in order. Fails when a shared layer has no full layer before it or the
    /// explicit list has the wrong length.
    pub fn layer_plan(&self) -> Result<Vec<LayerPlan>> {
        let types = self.indexer_types();
        if types.len() != self.num_hidden_layers {
            return Err(invalid(
                "indexer_types",
                format!(
                    "has {} entries but num_hidden_layers is {}",
                    types.len(),
                    self.num_hidden_layers
                ),
            ));
        }
        let mut last_full = None;
        let mut plan = Vec::with_capacity(types.len());
        for (index, kind) in types.into_iter().enumerate() {
            let indexer = match (kind, last_full) {
                (IndexerType::Full, _) => {
                    last_full = Some(index);
                    IndexerKind::Full
                }
                (IndexerType::Shared, Some(source_layer)) => IndexerKind::Shared { source_layer },
                (IndexerType::Shared, None) => {
                    return Err(invalid(
                        "indexer_types",
                        format!(
                            "makes layer {index} shared, but no earlier layer runs a full \
                             indexer for it to reuse"
                        ),
                    ))
                }
            };
            let mlp = if index < self.first_k_dense_replace {
                MlpKind::Dense
            } else {
                MlpKind::Moe
            };
            plan.push(LayerPlan {
                index,
                mlp,
                indexer,
            });
        }
        Ok(plan)
    }
}
