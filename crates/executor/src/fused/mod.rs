//! The fused launch: one persistent kernel per layer, its CTA shape, how its parts compose
//! (`graph`), and its generated source.

pub mod attention;
pub mod front;
pub mod front_gpu;
pub mod graph;
pub mod head;
pub mod head_check;
pub mod head_gpu;
pub mod host;
pub mod layer;
pub mod moe;
pub mod shape;
pub mod source;

pub use graph::{ArenaSlice, Completion, GraphError, Handoff, LaunchGraph, PlannedLaunch};
pub use shape::{CtaShape, FitError, FusedKernel};
pub use source::{fused_source, FusedSourceError, ENTRY};
