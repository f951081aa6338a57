//! The exact top-k (k = 2048) of score rows by radix select (ARCHITECTURE.md).
//!
//! - [`reference`](mod@reference): the contract, written to be read, and the sort-based check.
//! - [`check`]: entry-by-entry comparison, "missed", and the negative controls.
//! - [`layout`]: k and the candidate room, digits, slicing, placement of slices, scratch regions.
//! - [`descent`]: the steps of the digit descent as the kernels take them.
//! - [`cases`]: the adversarial score rows of the checks and benchmarks.
//! - [`cpu`]: the one-CTA, registers and multi-slice kernels in CPU form (the last on threads + the
//!   mailbox protocol).
//! - [`gpu`]: host side of the kernels (`kernels/select.hip`, `kernels/select*.h`).

pub mod cases;
pub mod check;
pub mod cpu;
pub mod descent;
pub mod gpu;
pub mod layout;
pub mod reference;

pub use check::{check_output, CheckError, Mismatch};
pub use layout::{select_slices, Slices, TopK, TOP_K};
pub use reference::{radix_key, select_row, select_rows, sorted_top_k, Pages, Rows, SelectError};
