//! The raw operations each GPU backend provides. Handles are opaque integers so that CUDA and HIP
//! share one safe layer on top (`Device`, `Buffer`, `Stream`, ...).

use crate::compile::Compiler;
use crate::error::Result;
use crate::resources::KernelResources;
use std::ffi::c_void;

pub(crate) type Handle = usize;

/// Facts about the device that placement and benchmarks need.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub backend: &'static str,
    pub name: String,
    /// Compile target: `sm_90a`, `gfx950`, ...
    pub arch: String,
    pub ordinal: usize,
    /// SMs (NVIDIA) or CUs (AMD).
    pub multiprocessors: u32,
    pub total_memory: usize,
    pub wave_size: u32,
    /// The most dynamic shared memory / LDS one block may opt into.
    pub max_shared_per_block: u32,
    pub clock_khz: u32,
    pub memory_clock_khz: u32,
    pub memory_bus_bits: u32,
    pub l2_bytes: u32,
    pub driver_version: String,
}

/// One kernel launch: a 1-D grid of 1-D blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub grid: u32,
    pub block: u32,
    /// Dynamic shared memory; above 48 KiB the kernel's limit is raised first.
    pub shared_bytes: u32,
    /// All blocks co-resident (cuLaunchCooperativeKernel); fails if the grid cannot fit.
    pub cooperative: bool,
    /// May start while the kernel before it on the stream still runs (CUDA's programmatic
    /// dependent launch, sm_90 and later): the kernel must call `mono_wait_prior()` before it
    /// touches global memory that kernel reads or writes. HIP launches it as usual.
    pub overlap_prior: bool,
}

impl Launch {
    pub fn new(grid: u32, block: u32) -> Self {
        Launch {
            grid,
            block,
            shared_bytes: 0,
            cooperative: false,
            overlap_prior: false,
        }
    }

    pub fn shared(mut self, bytes: u32) -> Self {
        self.shared_bytes = bytes;
        self
    }

    pub fn cooperative(mut self) -> Self {
        self.cooperative = true;
        self
    }

    pub fn overlap_prior(mut self) -> Self {
        self.overlap_prior = true;
        self
    }
}

pub(crate) trait Backend: Send + Sync {
    fn info(&self) -> &DeviceInfo;
    fn compiler(&self) -> &dyn Compiler;

    fn alloc(&self, bytes: usize) -> Result<u64>;
    fn free(&self, ptr: u64);
    fn memset(&self, ptr: u64, byte: u8, bytes: usize, stream: Handle) -> Result<()>;
    fn copy_to_device(&self, dst: u64, src: &[u8], stream: Handle) -> Result<()>;
    fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: Handle) -> Result<()>;
    fn copy_on_device(&self, dst: u64, src: u64, bytes: usize, stream: Handle) -> Result<()>;

    fn stream_create(&self) -> Result<Handle>;
    fn stream_destroy(&self, stream: Handle);
    fn stream_sync(&self, stream: Handle) -> Result<()>;

    fn event_create(&self) -> Result<Handle>;
    fn event_destroy(&self, event: Handle);
    fn event_record(&self, event: Handle, stream: Handle) -> Result<()>;
    fn event_sync(&self, event: Handle) -> Result<()>;
    fn event_elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32>;

    fn module_load(&self, image: &[u8]) -> Result<Handle>;
    fn module_unload(&self, module: Handle);
    fn function(&self, module: Handle, name: &str) -> Result<Handle>;
    fn function_resources(&self, function: Handle) -> Result<KernelResources>;
    fn set_max_dynamic_shared(&self, function: Handle, bytes: u32) -> Result<()>;
    fn max_active_per_multiprocessor(
        &self,
        function: Handle,
        block: u32,
        shared_bytes: u32,
    ) -> Result<u32>;
    /// # Safety
    /// `params` must point at values matching the kernel's parameter list, `sizes` their storage
    /// in bytes (each a multiple of 8, at least the value's size).
    unsafe fn launch(
        &self,
        function: Handle,
        launch: Launch,
        params: &mut [*mut c_void],
        sizes: &[usize],
        stream: Handle,
    ) -> Result<()>;

    fn begin_capture(&self, stream: Handle) -> Result<()>;
    /// Ends capture and instantiates: (graph, executable graph).
    fn end_capture(&self, stream: Handle) -> Result<(Handle, Handle)>;
    fn graph_launch(&self, exec: Handle, stream: Handle) -> Result<()>;
    fn graph_upload(&self, exec: Handle, stream: Handle) -> Result<()>;
    fn graph_destroy(&self, graph: Handle, exec: Handle);
}
