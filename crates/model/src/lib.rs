//! The model as data: config (Hugging Face `config.json` or a preset), per-rank shapes under
//! tensor parallelism, the bytes a launch must move, the paged caches' page table and page size
//! ([`paging`]), and the CPU numerics every stage's reference shares. The math is the model's; ARCHITECTURE.md section 8 names its sources and
//! the section numbers that comments cite as "spec §".

mod config;
mod error;
mod format;
pub mod numerics;
pub mod paging;
mod shapes;
pub mod traffic;
pub mod weights;

pub use config::{IndexerKind, IndexerType, LayerPlan, MlpKind, ModelConfig, Preset};
pub use error::{ModelError, Result};
pub use format::{
    index_cache_bytes_per_token, mla_cache_bytes_per_token, CacheFormat, Storage, WeightFormat,
    E4M3_MAX, MLA_CACHE_TILE, WEIGHT_BLOCK,
};
pub use shapes::{RankShapes, WeightClass, WeightSpec, SUPPORTED_TP};
