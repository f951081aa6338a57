//! The fused launch: one persistent kernel per layer, its CTA shape, and its generated source.

pub mod attention;
pub mod front;
pub mod front_gpu;
pub mod shape;
pub mod source;

pub use shape::CtaShape;
pub use source::{fused_source, FusedSourceError, ENTRY};
