//! The DSA lightning indexer (spec §3): index query and key (rope, Hadamard, FP8), the paged FP8
//! index-key cache, and scoring a request's rows together so each cached key is read once.
//!
//! - [`reference`](mod@reference): the CPU oracle (f64 sums), with switches for the variants engines differ on.
//! - [`layout`]: cache pages, row groups and runs of pages, used by kernels, reference and executor.
//! - [`gpu`]: host side of `indexer_tasks` (`kernels/indexer.hip`), the task-list entry over the
//!   key, query and score kinds: builds (wgmma scoring on sm_90a, the mma path elsewhere),
//!   arguments and launches.
//! - [`trace`]: the phase marks of a trace build's scorer, and their summary.

mod error;
pub mod gpu;
pub mod layout;
pub mod reference;
pub mod trace;

pub use error::{IndexerError, Result};
