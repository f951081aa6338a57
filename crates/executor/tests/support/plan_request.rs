//! The planning request the placement tests give `executor::info_chain`: one request of `rows`
//! rows at an 8K context (or the preset's longest), FP8 weights, on a grid of `ctas`.

use executor::info_chain::ChainRequest;
use model::traffic::Load;
use model::{CacheFormat, ModelConfig, WeightFormat};

pub fn request(
    cfg: &ModelConfig,
    tp: usize,
    rows: u64,
    ctas: u32,
    cache: CacheFormat,
) -> ChainRequest<'_> {
    ChainRequest {
        config: cfg,
        tp,
        load: Load {
            requests: 1,
            rows_per_request: rows,
            context: 8192.min(cfg.max_position_embeddings as u64),
        },
        weights: WeightFormat::Fp8,
        cache,
        ctas,
        hand_off_us: 1.0,
    }
}
