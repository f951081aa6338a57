//! GPU backends behind one API: CUDA (driver + NVRTC) and HIP (feature `hip`), both loaded at run
//! time, so one binary starts on any machine and says clearly when there is no GPU; and `host`,
//! a device emulated on CPU threads from the kernels' own source (`MONO_BACKEND=host`).

mod backend;
mod bench_filter;
mod cache;
mod compile;
mod cuda;
mod device;
mod error;
#[cfg(feature = "hip")]
mod hip;
pub mod host;
pub mod pages;
pub mod probes;
pub mod report;
mod resources;
mod skips;
mod source;
pub mod timing;

pub use backend::{DeviceInfo, Launch};
pub use bench_filter::BenchFilter;
pub use cache::{BuildReport, ModuleCache};
pub use compile::{
    compiler_for, compilers_required, optional_compiler, Clang, Compiled, Compiler, Nvrtc,
};
pub use device::{Args, BackendChoice, Buffer, Device, Event, Graph, Kernel, Module, Stream};
pub use error::{DeviceError, Result};
pub use resources::{parse_clang_remarks, parse_ptxas_log, KernelResources};
pub use skips::{record_skipped_check, skip_summary, skipped_checks};
pub use source::{KernelSource, HOST_LAUNCH, HOST_PRELUDE, NUMERICS, OPS, PRELUDE};
