//! The CPU reference of the linear lives in the model crate beside the packed layout, since MLA,
//! the experts and the head use both; re-exported here so the stage reads like every other.

pub use model::weights::linear::{dequantise, linear, Epilogue};
pub use model::weights::packed::{pack, PackedLayout, PackedWeight, Pairing, SourceWeight};
