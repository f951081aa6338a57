//! Multi-head latent attention (spec §2.2–2.7): projections, the latent norms, rope, the MLA cache
//! (bf16, or FP8 latent with per-128 scales and a bf16 rope key) and absorbed attention over the
//! tokens the indexer selected.
//!
//! - [`layout`]: where each head's rows sit in the weights, and each part of a cached token.
//! - [`reference`](mod@reference): the CPU reference, the oracle for the kernels to come.

mod error;
pub mod layout;
pub mod reference;

pub use error::{MlaError, Result};
pub use layout::{CacheLayout, HeadLayout};
