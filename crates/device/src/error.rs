use std::path::PathBuf;

/// Everything the device layer can fail with. Messages say what was wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "no GPU driver found: {detail}. Install the NVIDIA driver (libcuda.so) or ROCm (libamdhip64.so), \
         or run without one: MONO_BACKEND=host emulates a GPU on CPU threads (its kernels built with g++; \
         `mono step` does so by itself where it finds no GPU, and `mono step --cpu` runs the CPU reference step)"
    )]
    NoDriver { detail: String },

    #[error("the {backend} driver is loaded but reports no GPU (device {ordinal} of {count}); check `nvidia-smi` / `rocm-smi`")]
    NoDevice {
        backend: &'static str,
        ordinal: usize,
        count: usize,
    },

    #[error("{compiler} not found: {detail}")]
    NoCompiler {
        compiler: &'static str,
        detail: String,
    },

    #[error("this binary was built without the `hip` feature; rebuild with `--features hip` to use an AMD GPU")]
    HipNotBuilt,

    #[error("{backend} call {call} failed: {message}")]
    Driver {
        backend: &'static str,
        call: &'static str,
        message: String,
    },

    #[error("compiling {kernel} for {target} failed:\n{log}")]
    Compile {
        kernel: String,
        target: String,
        log: String,
    },

    #[error("kernel source {kernel}: {message}")]
    Source { kernel: String, message: String },

    #[error("module cache at {path}: {source}")]
    Cache {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("invalid launch of {kernel}: {message}")]
    Launch { kernel: String, message: String },

    #[error("bench record file {path}: {source}")]
    Report {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("buffer size mismatch: {message}")]
    Size { message: String },
}

pub type Result<T, E = DeviceError> = std::result::Result<T, E>;
