//! Tagged-pair hand-offs between the stages of a persistent launch (ARCHITECTURE.md sections 4 and 5).
//!
//! - [`layout`]: the box format, launch tags from the device-side epoch, named scratch regions.
//! - [`task`], [`placement`]: the task descriptor, per-CTA task lists and the deadlock-freedom rule, gangs included.
//! - [`protocol`], [`emulator`]: the protocol on CPU atomics and a one-thread-per-CTA emulator.
//! - [`chain`]: the longest chain of hand-offs in a placed launch, a floor of its time.
//! - [`diag`]: what a wait that gave up reports (emulator and debug device builds alike).
//! - [`stage`]: what a stage hands the fused kernel's generator (headers, arguments, decoder).
//! - [`synth`]: synthetic tasks for exercising all of the above; [`gpu`]: the device side's host code.
//! - [`trace`]: the per-task timeline a traced launch records, as spans, a Perfetto trace and an SVG.
//! - `kernels/mailbox.h`: the device header every stage includes.

pub mod chain;
pub mod diag;
pub mod emulator;
pub mod gpu;
pub mod layout;
pub mod placement;
pub mod protocol;
pub mod stage;
pub mod synth;
pub mod task;
pub mod trace;

pub use diag::{Stall, DIAG_WORDS};
pub use emulator::{EmuConfig, EmuError, Scratch, TaskFailed, TaskFn};
pub use layout::{pack, tag_of, value_of, BoxRange, BoxValue, Region, ScratchLayout, Tags};
pub use placement::{Limits, Placement, PlacementError, TaskTable, ValidPlacement};
pub use protocol::{BoxWord, Patience, PollMode};
pub use stage::StageKernel;
pub use task::{Stage, Task, MAX_INPUTS, STAGE_SHIFT};
