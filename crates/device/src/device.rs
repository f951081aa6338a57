//! The safe layer over a backend: devices, typed buffers, streams, timing events, modules, kernels
//! and captured graphs. Everything returns an error; nothing panics.

use crate::backend::{Backend, DeviceInfo, Handle, Launch};
use crate::cache::{BuildReport, ModuleCache};
use crate::error::{DeviceError, Result};
use crate::resources::KernelResources;
use crate::source::KernelSource;
use bytemuck::Pod;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Which runtime to use; `Auto` tries CUDA, then HIP (when built with the `hip` feature). `Host`
/// is the CPU emulation of a device (`crate::host`): never chosen by `Auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    Auto,
    Cuda,
    Hip,
    Host,
}

impl BackendChoice {
    /// What `MONO_BACKEND=cuda|hip|host` asks for; `Auto` when it is unset or anything else.
    pub fn from_env() -> BackendChoice {
        match std::env::var("MONO_BACKEND").as_deref() {
            Ok("cuda") => BackendChoice::Cuda,
            Ok("hip") => BackendChoice::Hip,
            Ok("host") => BackendChoice::Host,
            _ => BackendChoice::Auto,
        }
    }
}

/// One GPU, with a stream of its own for host copies and an on-disk module cache.
pub struct Device {
    backend: Arc<dyn Backend>,
    stream: Stream,
    cache: ModuleCache,
}

impl Device {
    /// Opens GPU `ordinal`. `MONO_BACKEND=cuda|hip|host` forces a runtime (`host`: the CPU
    /// emulation, with `MONO_HOST_CTAS` CTAs).
    pub fn open(ordinal: usize) -> Result<Device> {
        Self::open_with(ordinal, BackendChoice::from_env())
    }

    pub fn open_with(ordinal: usize, choice: BackendChoice) -> Result<Device> {
        let backend: Arc<dyn Backend> = match choice {
            BackendChoice::Cuda => Arc::new(crate::cuda::Cuda::open(ordinal)?),
            BackendChoice::Hip => open_hip(ordinal)?,
            BackendChoice::Host => Arc::new(crate::host::Host::open(
                crate::host::ctas_from_env().unwrap_or(4),
            )?),
            BackendChoice::Auto => match crate::cuda::Cuda::open(ordinal) {
                Ok(cuda) => Arc::new(cuda),
                Err(DeviceError::NoDriver {
                    detail: cuda_detail,
                }) => match open_hip(ordinal) {
                    Err(DeviceError::NoDriver { detail }) => {
                        return Err(DeviceError::NoDriver {
                            detail: format!("{cuda_detail}; {detail}"),
                        })
                    }
                    Err(DeviceError::HipNotBuilt) => {
                        return Err(DeviceError::NoDriver {
                            detail: format!("{cuda_detail} (HIP support not built in)"),
                        })
                    }
                    other => other?,
                },
                Err(e) => return Err(e),
            },
        };
        Self::with_backend(backend)
    }

    fn with_backend(backend: Arc<dyn Backend>) -> Result<Device> {
        let stream = Stream::new(backend.clone())?;
        Ok(Device {
            backend,
            stream,
            cache: ModuleCache::default_location(),
        })
    }

    /// The CPU emulation of a device with `ctas` CTAs, whatever `MONO_BACKEND` and
    /// `MONO_HOST_CTAS` say (a caller that sizes the grid for its work).
    pub fn open_host(ctas: u32) -> Result<Device> {
        Self::with_backend(Arc::new(crate::host::Host::open(ctas)?))
    }

    pub fn info(&self) -> &DeviceInfo {
        self.backend.info()
    }

    pub fn compiler_version(&self) -> &str {
        self.backend.compiler().version()
    }

    /// Uses another cache folder (tests, or a read-only home).
    pub fn set_cache(&mut self, cache: ModuleCache) {
        self.cache = cache;
    }

    pub fn cache(&self) -> &ModuleCache {
        &self.cache
    }

    /// The device's own stream; host copies go through it.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    pub fn new_stream(&self) -> Result<Stream> {
        Stream::new(self.backend.clone())
    }

    /// An event that can time (recorded on a stream, compared with another).
    pub fn timer(&self) -> Result<Event> {
        Ok(Event {
            handle: self.backend.event_create()?,
            backend: self.backend.clone(),
        })
    }

    pub fn alloc_zeroed<T: Pod>(&self, len: usize) -> Result<Buffer<T>> {
        let bytes = len * std::mem::size_of::<T>();
        let buffer = Buffer {
            ptr: self.backend.alloc(bytes)?,
            len,
            backend: self.backend.clone(),
            stream: self.stream.handle,
            _t: PhantomData,
        };
        self.backend
            .memset(buffer.ptr, 0, bytes, self.stream.handle)?;
        self.stream.sync()?;
        Ok(buffer)
    }

    pub fn upload<T: Pod>(&self, data: &[T]) -> Result<Buffer<T>> {
        let buffer = Buffer {
            ptr: self.backend.alloc(std::mem::size_of_val(data))?,
            len: data.len(),
            backend: self.backend.clone(),
            stream: self.stream.handle,
            _t: PhantomData,
        };
        buffer.write(data)?;
        Ok(buffer)
    }

    /// Compiles `sources` at once, a thread each, into the module cache, so that the builds
    /// after it load them: several kernels then take about the longest one's compile rather than
    /// their sum. A source that fails here fails again, with its error, when it is built.
    pub fn prewarm(&self, sources: &[&KernelSource]) {
        let compiler = self.backend.compiler();
        std::thread::scope(|scope| {
            for &source in sources {
                scope.spawn(move || {
                    let _ = self.cache.build(source, compiler);
                });
            }
        });
    }

    /// Compiles `source` for this device (or loads it from the cache) and loads the module.
    pub fn build(&self, source: &KernelSource) -> Result<Module> {
        let (compiled, report) = self.cache.build(source, self.backend.compiler())?;
        let handle = self.backend.module_load(&compiled.image)?;
        Ok(Module {
            handle,
            backend: self.backend.clone(),
            resources: compiled.resources,
            report,
        })
    }
}

#[cfg(feature = "hip")]
fn open_hip(ordinal: usize) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(crate::hip::Hip::open(ordinal)?))
}

#[cfg(not(feature = "hip"))]
fn open_hip(_ordinal: usize) -> Result<Arc<dyn Backend>> {
    Err(DeviceError::HipNotBuilt)
}

/// `len` values of `T` in device memory, freed on drop.
pub struct Buffer<T: Pod> {
    ptr: u64,
    len: usize,
    backend: Arc<dyn Backend>,
    stream: Handle,
    _t: PhantomData<T>,
}

impl<T: Pod> Buffer<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The raw device address, for kernel arguments and address arithmetic.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Copies `data` in (on the device's stream, waiting for it). Other streams are the caller's to order.
    pub fn write(&self, data: &[T]) -> Result<()> {
        self.check_len(data.len())?;
        self.backend
            .copy_to_device(self.ptr, bytemuck::cast_slice(data), self.stream)
    }

    /// Copies `data` in from value `at` on (a part of a buffer too large to fill from one host
    /// copy; on the device's stream, waiting for it).
    pub fn write_range(&self, at: usize, data: &[T]) -> Result<()> {
        let end = at.saturating_add(data.len());
        if end > self.len {
            return Err(DeviceError::Size {
                message: format!("values {at}..{end} of a buffer of {}", self.len),
            });
        }
        let ptr = self.ptr + (at * std::mem::size_of::<T>()) as u64;
        self.backend
            .copy_to_device(ptr, bytemuck::cast_slice(data), self.stream)
    }

    pub fn download(&self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        self.backend
            .copy_to_host(bytemuck::cast_slice_mut(&mut out), self.ptr, self.stream)?;
        Ok(out)
    }

    /// Copies values `range` out (a part of a buffer too large to read whole).
    pub fn download_range(&self, range: std::ops::Range<usize>) -> Result<Vec<T>> {
        if range.start > range.end || range.end > self.len {
            return Err(DeviceError::Size {
                message: format!("values {range:?} of a buffer of {}", self.len),
            });
        }
        let mut out = vec![T::zeroed(); range.len()];
        let at = self.ptr + (range.start * std::mem::size_of::<T>()) as u64;
        self.backend
            .copy_to_host(bytemuck::cast_slice_mut(&mut out), at, self.stream)?;
        Ok(out)
    }

    pub fn zero(&self) -> Result<()> {
        self.backend
            .memset(self.ptr, 0, self.bytes(), self.stream)?;
        self.backend.stream_sync(self.stream)
    }

    /// Device-to-device copy of all of `src`, ordered on `stream`.
    pub fn copy_from(&self, src: &Buffer<T>, stream: &Stream) -> Result<()> {
        self.check_len(src.len)?;
        self.backend
            .copy_on_device(self.ptr, src.ptr, self.bytes(), stream.handle)
    }

    fn check_len(&self, len: usize) -> Result<()> {
        if len == self.len {
            Ok(())
        } else {
            Err(DeviceError::Size {
                message: format!("buffer holds {} values, got {len}", self.len),
            })
        }
    }
}

impl<T: Pod> Drop for Buffer<T> {
    fn drop(&mut self) {
        self.backend.free(self.ptr);
    }
}

/// An ordered queue of device work.
pub struct Stream {
    handle: Handle,
    backend: Arc<dyn Backend>,
}

impl Stream {
    fn new(backend: Arc<dyn Backend>) -> Result<Stream> {
        Ok(Stream {
            handle: backend.stream_create()?,
            backend,
        })
    }

    pub fn sync(&self) -> Result<()> {
        self.backend.stream_sync(self.handle)
    }

    /// Enqueues `kernel` with `args`. Raises the kernel's dynamic shared memory limit when needed.
    pub fn launch(&self, kernel: &Kernel, launch: Launch, args: &Args) -> Result<()> {
        kernel.prepare(launch)?;
        let mut params = args.pointers();
        let sizes = args.sizes();
        unsafe {
            self.backend
                .launch(kernel.handle, launch, &mut params, &sizes, self.handle)
        }
        .map_err(|e| match e {
            DeviceError::Driver { message, call, .. } => DeviceError::Launch {
                kernel: kernel.name.clone(),
                message: format!(
                    "{call}: {message} (grid {}, block {}, {} B shared)",
                    launch.grid, launch.block, launch.shared_bytes
                ),
            },
            other => other,
        })
    }

    pub fn memset(&self, ptr: u64, byte: u8, bytes: usize) -> Result<()> {
        self.backend.memset(ptr, byte, bytes, self.handle)
    }

    /// Device-to-device copy of `bytes` from address `src` to address `dst`, ordered on this
    /// stream (a graph captures it as a copy node).
    pub fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.backend.copy_on_device(dst, src, bytes, self.handle)
    }

    /// Starts recording this stream's work into a graph instead of running it.
    pub fn begin_capture(&self) -> Result<()> {
        self.backend.begin_capture(self.handle)
    }

    pub fn end_capture(&self) -> Result<Graph> {
        let (graph, exec) = self.backend.end_capture(self.handle)?;
        Ok(Graph {
            graph,
            exec,
            backend: self.backend.clone(),
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.backend.stream_destroy(self.handle);
    }
}

/// A timing event.
pub struct Event {
    handle: Handle,
    backend: Arc<dyn Backend>,
}

impl Event {
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.backend.event_record(self.handle, stream.handle)
    }

    pub fn sync(&self) -> Result<()> {
        self.backend.event_sync(self.handle)
    }

    /// Milliseconds from `self` to `end`; both must have completed.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.backend.event_elapsed_ms(self.handle, end.handle)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        self.backend.event_destroy(self.handle);
    }
}

/// A loaded module, with what its build reported.
pub struct Module {
    handle: Handle,
    backend: Arc<dyn Backend>,
    resources: Vec<KernelResources>,
    report: BuildReport,
}

impl Module {
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        Ok(Kernel {
            handle: self.backend.function(self.handle, name)?,
            name: name.to_string(),
            backend: self.backend.clone(),
            shared_limit: AtomicU32::new(0),
        })
    }

    /// Compiler-reported resources of every entry point.
    pub fn resources(&self) -> &[KernelResources] {
        &self.resources
    }

    pub fn build_report(&self) -> &BuildReport {
        &self.report
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        self.backend.module_unload(self.handle);
    }
}

/// One entry point of a module. Must not outlive its module.
pub struct Kernel {
    handle: Handle,
    name: String,
    backend: Arc<dyn Backend>,
    shared_limit: AtomicU32,
}

impl Kernel {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn resources(&self) -> Result<KernelResources> {
        let mut r = self.backend.function_resources(self.handle)?;
        r.kernel = self.name.clone();
        Ok(r)
    }

    /// Blocks of this kernel one SM/CU holds at once.
    pub fn max_active_per_multiprocessor(&self, block: u32, shared_bytes: u32) -> Result<u32> {
        self.raise_shared_limit(shared_bytes)?;
        self.backend
            .max_active_per_multiprocessor(self.handle, block, shared_bytes)
    }

    /// The largest grid whose blocks are all resident at once: what a persistent launch may use.
    pub fn max_coresident_grid(&self, block: u32, shared_bytes: u32) -> Result<u32> {
        Ok(self.max_active_per_multiprocessor(block, shared_bytes)?
            * self.backend.info().multiprocessors)
    }

    fn prepare(&self, launch: Launch) -> Result<()> {
        if launch.grid == 0 || launch.block == 0 {
            return Err(DeviceError::Launch {
                kernel: self.name.clone(),
                message: format!("empty grid or block ({} x {})", launch.grid, launch.block),
            });
        }
        let limit = self.backend.info().max_shared_per_block;
        if launch.shared_bytes > limit {
            return Err(DeviceError::Launch {
                kernel: self.name.clone(),
                message: format!(
                    "{} B of dynamic shared memory; the device allows {limit}",
                    launch.shared_bytes
                ),
            });
        }
        self.raise_shared_limit(launch.shared_bytes)
    }

    /// The driver's default dynamic limit is 48 KiB minus the kernel's static shared memory, so
    /// a kernel with static shared memory can fail below 48 KiB: raise it for any dynamic size.
    fn raise_shared_limit(&self, bytes: u32) -> Result<()> {
        if bytes > self.shared_limit.load(Ordering::Relaxed) {
            self.backend.set_max_dynamic_shared(self.handle, bytes)?;
            self.shared_limit.store(bytes, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Kernel arguments in order, each kept in 8-byte-aligned storage until the launch copies them.
#[derive(Default)]
pub struct Args {
    slots: Vec<Box<[u64]>>,
}

impl Args {
    pub fn new() -> Self {
        Args::default()
    }

    /// Any plain value or `#[repr(C)]` struct the kernel takes by value.
    pub fn value<T: Pod>(mut self, value: &T) -> Self {
        let bytes = bytemuck::bytes_of(value);
        let mut slot = vec![0u64; bytes.len().div_ceil(8).max(1)].into_boxed_slice();
        bytemuck::cast_slice_mut::<u64, u8>(&mut slot)[..bytes.len()].copy_from_slice(bytes);
        self.slots.push(slot);
        self
    }

    pub fn buf<T: Pod>(self, buffer: &Buffer<T>) -> Self {
        self.value(&buffer.ptr)
    }

    pub fn u32(self, v: u32) -> Self {
        self.value(&v)
    }

    pub fn i32(self, v: i32) -> Self {
        self.value(&v)
    }

    pub fn u64(self, v: u64) -> Self {
        self.value(&v)
    }

    pub fn f32(self, v: f32) -> Self {
        self.value(&v)
    }

    fn sizes(&self) -> Vec<usize> {
        self.slots.iter().map(|s| s.len() * 8).collect()
    }

    fn pointers(&self) -> Vec<*mut c_void> {
        self.slots
            .iter()
            .map(|s| s.as_ptr() as *mut c_void)
            .collect()
    }
}

/// A captured, instantiated graph: replays its launches with their arguments frozen.
pub struct Graph {
    graph: Handle,
    exec: Handle,
    backend: Arc<dyn Backend>,
}

impl Graph {
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        self.backend.graph_launch(self.exec, stream.handle)
    }

    /// Moves the graph to the device ahead of the first replay, so that replay is not timed with it.
    pub fn upload(&self, stream: &Stream) -> Result<()> {
        self.backend.graph_upload(self.exec, stream.handle)
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        self.backend.graph_destroy(self.graph, self.exec);
    }
}
