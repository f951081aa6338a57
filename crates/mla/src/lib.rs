//! Multi-head latent attention (spec §2.2–2.7): projections, the latent norms, rope, the MLA cache
//! (bf16, or FP8 latent with per-128 scales and a bf16 rope key) and absorbed attention over the
//! tokens the indexer selected.
//!
//! - [`layout`]: where each head's rows sit in the weights, each part of a cached token, and how a
//!   launch's attention is cut into tasks (cache writes, splits, combines) and boxes.
//! - [`reference`](mod@reference): the CPU reference, the oracle of the kernels.
//! - [`gpu`]: the kernels' sources, arguments, standalone launch and the stage the fused kernel's
//!   generator takes. The kernels are the sparse attention tasks of `mla_tasks`
//!   (`kernels/mla.hip`, decoder `kernels/mla_tasks.h`): cache writes, splits over blocks of the
//!   selected slots, combines (`kernels/mla_attn.h`); and the attention half's row tasks between
//!   its linears (`kernels/mla_rows.h`: the three RMSNorms, the ropes, the slot lists published
//!   from plain memory), which `executor::fused::attention` plans. Their own source also runs on
//!   CPU threads (`tests/host_emulation.rs`).
//! - [`trace`]: a trace build's per-task phase marks, read back into a timeline.

mod error;
pub mod gpu;
pub mod layout;
pub mod reference;
pub mod trace;

pub use error::{MlaError, Result};
pub use layout::{CacheLayout, HeadLayout};
