//! The weight-streaming linear stage: y = x Wᵀ for 1 to 16 bf16 rows, W FP8 with 128 x 128 block
//! scales or bf16, in the packed device layout of `model::weights::packed`; fused SwiGLU, row
//! scale and residual epilogues. The tile is `kernels/ops/linear.h` of the workspace (every stage
//! that streams weights includes it); this crate holds the task function, its placement, its
//! checks and its standalone launch.
//!
//! - [`layout`]: the task kind, tiles split over CTAs, boxes, shared memory.
//! - [`reference`](mod@reference): the CPU reference (model's); [`cases`], [`check`]: problems and
//!   the contract a device result is held to.
//! - [`shapes`]: the matrices one GLM-5.2 TP-8 rank streams, as the GPU test and bench use them.
//! - [`gpu`]: the standalone launch (`linear_tasks`, `kernels/linear.hip`); the same source runs
//!   on CPU threads in `tests/host_emulation.rs`.

pub mod cases;
pub mod check;
pub mod gpu;
pub mod layout;
pub mod reference;
pub mod shapes;
