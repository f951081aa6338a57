//! Every weight a reference step reads, loaded once from a [`WeightSource`].

use indexer::reference::OwnedIndexerWeights;
use mla::reference::MlaWeights;
use model::weights::{layer_tensor_name, Matrix, WeightSource};
use model::{IndexerKind, LayerPlan, MlpKind, ModelConfig};
use moe::reference::{MlpWeights, MoeWeights};

use super::Result;

#[derive(Debug, Clone)]
pub enum MlpBlock {
    Dense(MlpWeights),
    Moe(MoeWeights),
}

#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub plan: LayerPlan,
    pub input_norm: Vec<f32>,
    pub mla: MlaWeights,
    /// Present on full indexer layers only.
    pub indexer: Option<OwnedIndexerWeights>,
    pub post_norm: Vec<f32>,
    pub mlp: MlpBlock,
}

/// The whole model's weights, TP 1.
#[derive(Debug, Clone)]
pub struct ReferenceModel {
    pub cfg: ModelConfig,
    pub embedding: Matrix,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>,
    pub lm_head: Matrix,
}

impl ReferenceModel {
    pub fn load(cfg: &ModelConfig, source: &dyn WeightSource) -> Result<Self> {
        cfg.validate()?;
        let hidden = cfg.hidden_size;
        let layers = cfg
            .layer_plan()?
            .into_iter()
            .map(|plan| {
                let i = plan.index;
                let mlp = match plan.mlp {
                    MlpKind::Dense => MlpBlock::Dense(MlpWeights::load(
                        source,
                        &layer_tensor_name(i, "mlp"),
                        hidden,
                        cfg.intermediate_size,
                    )?),
                    MlpKind::Moe => MlpBlock::Moe(MoeWeights::load(source, cfg, i)?),
                };
                let indexer = match plan.indexer {
                    IndexerKind::Full => Some(OwnedIndexerWeights::load(source, cfg, i)?),
                    IndexerKind::Shared { .. } => None,
                };
                Ok(LayerWeights {
                    plan,
                    input_norm: source
                        .vector(&layer_tensor_name(i, "input_layernorm.weight"), hidden)?,
                    mla: MlaWeights::load(source, cfg, i)?,
                    indexer,
                    post_norm: source.vector(
                        &layer_tensor_name(i, "post_attention_layernorm.weight"),
                        hidden,
                    )?,
                    mlp,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let embedding = source.matrix("model.embed_tokens.weight", cfg.vocab_size, hidden)?;
        // Tied, the output projection is the embedding, as transformers ties them; such
        // checkpoints need not hold an `lm_head.weight`.
        let lm_head = if cfg.tie_word_embeddings {
            embedding.clone()
        } else {
            source.matrix("lm_head.weight", cfg.vocab_size, hidden)?
        };
        Ok(ReferenceModel {
            cfg: cfg.clone(),
            embedding,
            layers,
            final_norm: source.vector("model.norm.weight", hidden)?,
            lm_head,
        })
    }
}
