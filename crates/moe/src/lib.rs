//! The MLP side of a layer (spec §2.9–2.10): the router (sigmoid, correction bias, top-k,
//! normalised and scaled weights), the shared expert, the routed SwiGLU experts, and the dense MLP
//! of the first layers.
//!
//! - [`layout`]: which rows each expert serves (the dispatch every implementation shares).
//! - [`reference`](mod@reference): the CPU reference, the oracle for the kernels to come.

mod error;
pub mod layout;
pub mod reference;

pub use error::{MoeError, Result};
pub use layout::{dispatch, Route};
