//! The MLP side of a layer (spec §2.9–2.10): the router (sigmoid, correction bias, group-limited
//! top-k, normalised and scaled weights), the shared expert, the routed SwiGLU experts, and the
//! dense MLP of the first layers; and the MoE layer as fused-launch tasks.
//!
//! - [`layout`]: which rows each expert serves (the dispatch every implementation shares), and
//!   the MoE launch: its tasks (the linear stage's router, shared expert and expert banks, this
//!   stage's route and combine), boxes, placement and shared memory.
//! - [`reference`](mod@reference): the CPU reference, the oracle of the device tasks.
//! - [`problem`], [`memory`], [`check`]: problems (random and adversarial), one launch's memory
//!   and arguments, and the contract a device result is held to.
//! - [`gpu`]: the device side's host code (`kernels/moe_task.h`, the standalone entry
//!   `kernels/moe.hip`); the same source runs on CPU threads in `tests/host_emulation.rs`.

pub mod check;
mod error;
pub mod gpu;
pub mod layout;
pub mod memory;
pub mod problem;
pub mod reference;

pub use error::{MoeError, Result};
pub use layout::{dispatch, Route};
