//! The decode step on a device: one rank's weights made there ([`weights`]), the step's inputs in
//! device buffers with the greedy feed ([`inputs`]), every launch of the step captured once and
//! replayed ([`graph`]), digests of what each launch wrote ([`digest`]), the step checked against
//! the CPU reference step and the reference select ([`check`]), timing beside the HBM
//! floor ([`mod@bench`]), and the GPU side of `mono step`, `dump`, `compare` and `bench` ([`cli`]).
//!
//! The launches that exist so far join through [`graph::StepLaunch`]; the fused front half
//! ([`front`]) is the first.

pub mod bench;
pub mod check;
pub mod cli;
pub mod digest;
pub mod front;
pub mod graph;
pub mod inputs;
pub mod layer;
pub mod scene;
pub mod weights;

pub use digest::{compare, Comparison, Dump};
pub use graph::{LaunchSlot, Output, StepFrame, StepGraph, StepLaunch};
pub use inputs::{Batch, Feed, FeedKernel, HostRows, RequestInput, StepInputs};

/// What building or running a step can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error(transparent)]
    Device(#[from] device::DeviceError),
    #[error(transparent)]
    Mailbox(#[from] mailbox::gpu::GpuError),
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error(transparent)]
    Weights(#[from] model::weights::WeightError),
    #[error(transparent)]
    Front(#[from] crate::fused::front_gpu::FrontGpuError),
    #[error(transparent)]
    Fit(#[from] crate::fused::FitError),
    #[error(
        "{what} need {:.2} GB and {:.2} GB more for the step; the device has {:.2} GB (--layers N \
         runs the model's first N layers and its head)",
        *need as f64 / 1e9,
        *reserve as f64 / 1e9,
        *device as f64 / 1e9
    )]
    Memory {
        what: String,
        need: usize,
        device: usize,
        reserve: usize,
    },
    #[error("launch {launch}: {message}")]
    Launch { launch: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = StepError> = std::result::Result<T, E>;
