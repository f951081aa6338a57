//! The exact top-k (k from the config's `index_topk`: 2048 for GLM-5) of score rows by radix select (ARCHITECTURE.md).
//!
//! - [`reference`](mod@reference): the contract, written to be read, and the sort-based check.
//! - [`check`]: entry-by-entry comparison, "missed", and the negative controls.
//! - [`layout`]: k and the candidate room, digits, slicing, a launch's task list, scratch regions.
//! - [`cases`]: the adversarial score rows of the checks and benchmarks, masked rows included.
//! - [`gpu`]: host side of the kernels: `select_tasks` (`kernels/select.hip`), the task-list
//!   entry over a plan of one-CTA, registers and slice tasks (a row's slices a gang), and the
//!   task functions and decoder in `kernels/select*.h`.
//!
//! The kernels' own source runs on CPU threads in `tests/host_emulation.rs`.

pub mod cases;
pub mod check;
pub mod gpu;
pub mod layout;
pub mod reference;

pub use check::{check_output, CheckError, Mismatch};
pub use layout::{select_slices, SelectKind, SelectPlan, Slices, TopK};
pub use reference::{
    radix_key, select_row, select_rows, sorted_top_k, RowPages, Rows, SelectError,
};
