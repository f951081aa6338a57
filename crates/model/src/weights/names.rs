//! The published tensor names and their full (TP 1) shapes, from the one weight table in
//! [`crate::RankShapes`]. Names follow the Hugging Face checkpoints of `glm_moe_dsa`, which
//! transformers' `GlmMoeDsaForCausalLM` loads as they are (routed experts one by one, which
//! transformers fuses on load).

use crate::error::Result;
use crate::format::Storage;
use crate::{ModelConfig, RankShapes, WeightSpec};

/// One tensor of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    /// Row-major; `[n]` for vectors.
    pub shape: Vec<usize>,
    pub storage: Storage,
}

/// `model.layers.{layer}.{suffix}`.
pub fn layer_tensor_name(layer: usize, suffix: &str) -> String {
    format!("model.layers.{layer}.{suffix}")
}

/// `model.layers.{layer}.mlp.experts.{expert}.{part}.weight`, `part` one of gate_proj, up_proj,
/// down_proj.
pub fn expert_tensor_name(layer: usize, expert: usize, part: &str) -> String {
    layer_tensor_name(layer, &format!("mlp.experts.{expert}.{part}.weight"))
}

/// Every tensor of the model at TP 1, in checkpoint order: embedding, layers, final norm, lm_head.
/// (The MTP layer `model.layers.{num_hidden_layers}` is not part of the main forward.)
pub fn checkpoint_tensors(cfg: &ModelConfig) -> Result<Vec<TensorSpec>> {
    let shapes = RankShapes::new(cfg, 1)?;
    let mut out = vec![spec(
        shapes.embedding().name.to_owned(),
        &shapes.embedding(),
    )];
    for layer in cfg.layer_plan()? {
        for weight in shapes.layer_weights(&layer) {
            if weight.count > 1 || weight.name.contains('*') {
                for expert in 0..weight.count {
                    let suffix = weight.name.replace('*', &expert.to_string());
                    out.push(spec(layer_tensor_name(layer.index, &suffix), &weight));
                }
            } else {
                out.push(spec(layer_tensor_name(layer.index, weight.name), &weight));
            }
        }
    }
    for weight in shapes.tail_weights() {
        out.push(spec(weight.name.to_owned(), &weight));
    }
    Ok(out)
}

fn spec(name: String, weight: &WeightSpec) -> TensorSpec {
    // The table writes vectors as [n, 1]; checkpoints store them 1-D.
    let shape = match weight.shape {
        [n, 1] => vec![n],
        [rows, cols] => vec![rows, cols],
    };
    TensorSpec {
        name,
        shape,
        storage: weight.storage,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_names_and_shapes() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let specs = checkpoint_tensors(&cfg).unwrap();
        let find = |name: &str| {
            specs
                .iter()
                .find(|s| s.name == name)
                .map(|s| s.shape.clone())
        };
        assert_eq!(find("model.embed_tokens.weight"), Some(vec![2048, 256]));
        assert_eq!(
            find("model.layers.0.self_attn.q_a_proj.weight"),
            Some(vec![128, 256])
        );
        assert_eq!(
            find("model.layers.4.self_attn.indexer.wk.weight"),
            Some(vec![64, 256])
        );
        // Layer 2 shares layer 1's top-k, so it has no indexer.
        assert_eq!(find("model.layers.2.self_attn.indexer.wk.weight"), None);
        assert_eq!(
            find("model.layers.5.mlp.experts.15.down_proj.weight"),
            Some(vec![256, 128])
        );
        assert_eq!(
            find("model.layers.1.mlp.gate_proj.weight"),
            Some(vec![512, 256])
        );
        assert_eq!(find("model.norm.weight"), Some(vec![256]));
        assert_eq!(find("lm_head.weight"), Some(vec![2048, 256]));
        let unique: std::collections::HashSet<_> = specs.iter().map(|s| &s.name).collect();
        assert_eq!(unique.len(), specs.len(), "duplicate names");
    }
}
