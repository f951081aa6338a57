//! Shared parts of the executor's tests.

pub mod half;
pub mod half_gpu;
