//! CUDA backend: the driver API through cudarc's raw layers, loaded at run time.

use crate::backend::{Backend, DeviceInfo, Handle, Launch};
use crate::compile::{Compiler, Nvrtc};
use crate::error::{DeviceError, Result};
use crate::resources::KernelResources;
use cudarc::driver::sys::{self, CUdevice_attribute as Attr, CUfunction_attribute as FnAttr};
use cudarc::driver::{result, DriverError};
use std::ffi::{c_void, CString};

pub(crate) struct Cuda {
    context: sys::CUcontext,
    device: sys::CUdevice,
    info: DeviceInfo,
    compiler: Nvrtc,
}

// The context handle is only ever made current and used through the driver, which is thread-safe.
unsafe impl Send for Cuda {}
unsafe impl Sync for Cuda {}

fn fail(call: &'static str) -> impl Fn(DriverError) -> DeviceError {
    move |e| DeviceError::Driver {
        backend: "CUDA",
        call,
        message: e
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{e:?}")),
    }
}

fn h<T>(p: *mut T) -> Handle {
    p as Handle
}

fn p<T>(h: Handle) -> *mut T {
    h as *mut T
}

fn attribute(
    id: sys::CUlaunchAttributeID,
    set: impl FnOnce(&mut sys::CUlaunchAttributeValue),
) -> sys::CUlaunchAttribute {
    // SAFETY: the value is a C union of plain integers and structs of them; all zeroes is valid.
    let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    set(&mut value);
    sys::CUlaunchAttribute {
        id,
        pad: [0; 4],
        value,
    }
}

/// A launch through cuLaunchKernelEx with programmatic stream serialisation: the kernel may be
/// scheduled before the one before it on the stream has finished (its `griddepcontrol.wait`
/// holds it until that one's memory is visible). Cooperative launches keep that attribute too.
///
/// # Safety
/// As `Backend::launch`.
unsafe fn launch_overlapping(
    function: Handle,
    launch: Launch,
    params: &mut [*mut c_void],
    stream: Handle,
) -> Result<()> {
    use sys::CUlaunchAttributeID as Id;
    let mut attrs = vec![attribute(
        Id::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        |v| v.programmaticStreamSerializationAllowed = 1,
    )];
    if launch.cooperative {
        attrs.push(attribute(Id::CU_LAUNCH_ATTRIBUTE_COOPERATIVE, |v| {
            v.cooperative = 1
        }));
    }
    let config = sys::CUlaunchConfig {
        gridDimX: launch.grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: launch.block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: launch.shared_bytes,
        hStream: p(stream),
        attrs: attrs.as_mut_ptr(),
        numAttrs: attrs.len() as u32,
    };
    sys::cuLaunchKernelEx(
        &config,
        p(function),
        params.as_mut_ptr(),
        std::ptr::null_mut(),
    )
    .result()
    .map_err(fail("cuLaunchKernelEx"))
}

impl Cuda {
    pub(crate) fn open(ordinal: usize) -> Result<Self> {
        // cudarc panics when libcuda is missing: probe before the first call.
        if !unsafe { sys::is_culib_present() } {
            return Err(DeviceError::NoDriver {
                detail: "libcuda.so could not be loaded".into(),
            });
        }
        result::init().map_err(fail("cuInit"))?;
        let count = result::device::get_count().map_err(fail("cuDeviceGetCount"))? as usize;
        if ordinal >= count {
            return Err(DeviceError::NoDevice {
                backend: "CUDA",
                ordinal,
                count,
            });
        }
        let device = result::device::get(ordinal as i32).map_err(fail("cuDeviceGet"))?;
        let context = unsafe { result::primary_ctx::retain(device) }
            .map_err(fail("cuDevicePrimaryCtxRetain"))?;
        unsafe { result::ctx::set_current(context) }.map_err(fail("cuCtxSetCurrent"))?;
        let attr =
            |a: Attr| unsafe { result::device::get_attribute(device, a) }.unwrap_or(0) as u32;
        let (major, minor) = (
            attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        );
        // Arch-specific features (wgmma, setmaxnreg) need the `a` targets from Hopper on.
        let arch = format!("sm_{major}{minor}{}", if major >= 9 { "a" } else { "" });
        let mut driver = 0;
        unsafe { sys::cuDriverGetVersion(&mut driver) }
            .result()
            .map_err(fail("cuDriverGetVersion"))?;
        let info = DeviceInfo {
            backend: "CUDA",
            name: result::device::get_name(device).map_err(fail("cuDeviceGetName"))?,
            arch: arch.clone(),
            ordinal,
            multiprocessors: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            total_memory: unsafe { result::device::total_mem(device) }
                .map_err(fail("cuDeviceTotalMem"))?,
            wave_size: attr(Attr::CU_DEVICE_ATTRIBUTE_WARP_SIZE),
            max_shared_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            clock_khz: attr(Attr::CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
            memory_clock_khz: attr(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
            memory_bus_bits: attr(Attr::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
            l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
            driver_version: format!("CUDA driver {}.{}", driver / 1000, (driver % 1000) / 10),
        };
        let compiler = Nvrtc::new(&arch)?;
        Ok(Cuda {
            context,
            device,
            info,
            compiler,
        })
    }

    /// The driver keeps the current context per thread; any thread may call us.
    fn bind(&self) -> Result<()> {
        unsafe { result::ctx::set_current(self.context) }.map_err(fail("cuCtxSetCurrent"))
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        let _ = unsafe { result::primary_ctx::release(self.device) };
    }
}

impl Backend for Cuda {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn compiler(&self) -> &dyn Compiler {
        &self.compiler
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        self.bind()?;
        unsafe { result::malloc_sync(bytes.max(1)) }.map_err(fail("cuMemAlloc"))
    }

    fn free(&self, ptr: u64) {
        if self.bind().is_ok() {
            let _ = unsafe { result::free_sync(ptr) };
        }
    }

    fn memset(&self, ptr: u64, byte: u8, bytes: usize, stream: Handle) -> Result<()> {
        self.bind()?;
        unsafe { result::memset_d8_async(ptr, byte, bytes, p(stream)) }
            .map_err(fail("cuMemsetD8Async"))
    }

    fn copy_to_device(&self, dst: u64, src: &[u8], stream: Handle) -> Result<()> {
        self.bind()?;
        unsafe { result::memcpy_htod_async(dst, src, p(stream)) }
            .map_err(fail("cuMemcpyHtoDAsync"))?;
        self.stream_sync(stream)
    }

    fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: Handle) -> Result<()> {
        self.bind()?;
        unsafe { result::memcpy_dtoh_async(dst, src, p(stream)) }
            .map_err(fail("cuMemcpyDtoHAsync"))?;
        self.stream_sync(stream)
    }

    fn copy_on_device(&self, dst: u64, src: u64, bytes: usize, stream: Handle) -> Result<()> {
        self.bind()?;
        unsafe { result::memcpy_dtod_async(dst, src, bytes, p(stream)) }
            .map_err(fail("cuMemcpyDtoDAsync"))
    }

    fn stream_create(&self) -> Result<Handle> {
        self.bind()?;
        result::stream::create(result::stream::StreamKind::NonBlocking)
            .map(h)
            .map_err(fail("cuStreamCreate"))
    }

    fn stream_destroy(&self, stream: Handle) {
        if self.bind().is_ok() {
            let _ = unsafe { result::stream::destroy(p(stream)) };
        }
    }

    fn stream_sync(&self, stream: Handle) -> Result<()> {
        self.bind()?;
        unsafe { result::stream::synchronize(p(stream)) }.map_err(fail("cuStreamSynchronize"))
    }

    fn event_create(&self) -> Result<Handle> {
        self.bind()?;
        // CU_EVENT_DEFAULT: events made with DISABLE_TIMING cannot be timed.
        result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map(h)
            .map_err(fail("cuEventCreate"))
    }

    fn event_destroy(&self, event: Handle) {
        if self.bind().is_ok() {
            let _ = unsafe { result::event::destroy(p(event)) };
        }
    }

    fn event_record(&self, event: Handle, stream: Handle) -> Result<()> {
        self.bind()?;
        unsafe { result::event::record(p(event), p(stream)) }.map_err(fail("cuEventRecord"))
    }

    fn event_sync(&self, event: Handle) -> Result<()> {
        self.bind()?;
        unsafe { result::event::synchronize(p(event)) }.map_err(fail("cuEventSynchronize"))
    }

    fn event_elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32> {
        self.bind()?;
        unsafe { result::event::elapsed(p(start), p(end)) }.map_err(fail("cuEventElapsedTime"))
    }

    fn module_load(&self, image: &[u8]) -> Result<Handle> {
        self.bind()?;
        unsafe { result::module::load_data(image.as_ptr().cast()) }
            .map(h)
            .map_err(fail("cuModuleLoadData"))
    }

    fn module_unload(&self, module: Handle) {
        if self.bind().is_ok() {
            let _ = unsafe { result::module::unload(p(module)) };
        }
    }

    fn function(&self, module: Handle, name: &str) -> Result<Handle> {
        self.bind()?;
        let cname = CString::new(name).map_err(|_| DeviceError::Launch {
            kernel: name.into(),
            message: "kernel name contains a NUL byte".into(),
        })?;
        unsafe { result::module::get_function(p(module), cname) }
            .map(h)
            .map_err(fail("cuModuleGetFunction"))
    }

    fn function_resources(&self, function: Handle) -> Result<KernelResources> {
        self.bind()?;
        let get = |a: FnAttr| {
            unsafe { result::function::get_function_attribute(p(function), a) }
                .map(|v| v as u32)
                .map_err(fail("cuFuncGetAttribute"))
        };
        Ok(KernelResources {
            kernel: String::new(),
            registers: get(FnAttr::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            sgprs: None,
            spills: 0,
            scratch_bytes: get(FnAttr::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            shared_bytes: get(FnAttr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
        })
    }

    fn set_max_dynamic_shared(&self, function: Handle, bytes: u32) -> Result<()> {
        self.bind()?;
        unsafe {
            result::function::set_function_attribute(
                p(function),
                FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        }
        .map_err(fail("cuFuncSetAttribute"))
    }

    fn max_active_per_multiprocessor(
        &self,
        function: Handle,
        block: u32,
        shared_bytes: u32,
    ) -> Result<u32> {
        self.bind()?;
        unsafe {
            result::occupancy::max_active_block_per_multiprocessor(
                p(function),
                block as i32,
                shared_bytes as usize,
            )
        }
        .map(|n| n as u32)
        .map_err(fail("cuOccupancyMaxActiveBlocksPerMultiprocessor"))
    }

    unsafe fn launch(
        &self,
        function: Handle,
        launch: Launch,
        params: &mut [*mut c_void],
        _sizes: &[usize],
        stream: Handle,
    ) -> Result<()> {
        self.bind()?;
        if launch.overlap_prior {
            return launch_overlapping(function, launch, params, stream);
        }
        let grid = (launch.grid, 1, 1);
        let block = (launch.block, 1, 1);
        if launch.cooperative {
            result::launch_cooperative_kernel(
                p(function),
                grid,
                block,
                launch.shared_bytes,
                p(stream),
                params,
            )
            .map_err(fail("cuLaunchCooperativeKernel"))
        } else {
            result::launch_kernel(
                p(function),
                grid,
                block,
                launch.shared_bytes,
                p(stream),
                params,
            )
            .map_err(fail("cuLaunchKernel"))
        }
    }

    fn begin_capture(&self, stream: Handle) -> Result<()> {
        self.bind()?;
        unsafe {
            result::stream::begin_capture(
                p(stream),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(fail("cuStreamBeginCapture"))
    }

    fn end_capture(&self, stream: Handle) -> Result<(Handle, Handle)> {
        self.bind()?;
        let graph = unsafe { result::stream::end_capture(p(stream)) }
            .map_err(fail("cuStreamEndCapture"))?;
        if graph.is_null() {
            return Err(DeviceError::Launch {
                kernel: "graph".into(),
                message: "the capture recorded nothing".into(),
            });
        }
        let exec = unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) };
        match exec {
            Ok(exec) => Ok((h(graph), h(exec))),
            Err(e) => {
                let _ = unsafe { result::graph::destroy(graph) };
                Err(fail("cuGraphInstantiate")(e))
            }
        }
    }

    fn graph_launch(&self, exec: Handle, stream: Handle) -> Result<()> {
        self.bind()?;
        unsafe { result::graph::launch(p(exec), p(stream)) }.map_err(fail("cuGraphLaunch"))
    }

    fn graph_upload(&self, exec: Handle, stream: Handle) -> Result<()> {
        self.bind()?;
        unsafe { result::graph::upload(p(exec), p(stream)) }.map_err(fail("cuGraphUpload"))
    }

    fn graph_destroy(&self, graph: Handle, exec: Handle) {
        if self.bind().is_ok() {
            let _ = unsafe { result::graph::exec_destroy(p(exec)) };
            let _ = unsafe { result::graph::destroy(p(graph)) };
        }
    }
}
