//! One layer launch of the step on a device: the layer's caches ([`caches`]) and the weights its
//! parts read ([`weights`]).

pub mod caches;
pub mod front;
pub mod launch;
pub mod moe;
pub mod step;
pub mod weights;

pub use caches::{CacheImages, LayerCache, StepCaches};
pub use weights::{ExpertBank, IndexerWeights, LayerWeights, MlpWeights, ModelWeights, MoeWeights};
