//! The fused launch (its CTA shape and generated kernel), the kernel registry and build table,
//! the CPU reference step, the task timeline, and the `mono` binary.

pub mod fused;
pub mod info;
pub mod info_chain;
pub mod kernels;
pub mod reference;
pub mod step;
pub mod trace;
