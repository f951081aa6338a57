//! The layer task graph, placement, the CPU emulator and the `mono` binary.

pub mod fused;
pub mod info;
pub mod kernels;
pub mod reference;
pub mod trace;
