//! HIP backend (AMD): the HIP runtime through cubecl-hip-sys, loaded at run time; code objects built
//! by clang for the device's gfx target and loaded with hipModuleLoadData.

use crate::backend::{Backend, DeviceInfo, Handle, Launch};
use crate::compile::{Clang, Compiler};
use crate::error::{DeviceError, Result};
use crate::resources::KernelResources;
use cubecl_hip_sys as hip;
use std::ffi::{c_void, CStr, CString};
use std::mem::MaybeUninit;
use std::ptr::null_mut;

pub(crate) struct Hip {
    ordinal: i32,
    info: DeviceInfo,
    compiler: Clang,
}

fn check(call: &'static str, code: hip::hipError_t) -> Result<()> {
    if code == hip::hipError_t_hipSuccess {
        return Ok(());
    }
    let text = unsafe { hip::hipGetErrorString(code) };
    let message = if text.is_null() {
        format!("error {code}")
    } else {
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    };
    Err(DeviceError::Driver {
        backend: "HIP",
        call,
        message,
    })
}

fn cstr(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn p<T>(h: Handle) -> *mut T {
    h as *mut T
}

impl Hip {
    pub(crate) fn open(ordinal: usize) -> Result<Self> {
        // The bindings panic on first use when libamdhip64 is missing: probe first.
        if !hip::is_available() {
            return Err(DeviceError::NoDriver {
                detail: "libamdhip64.so / libhiprtc.so could not be loaded (set ROCM_PATH)".into(),
            });
        }
        check("hipInit", unsafe { hip::hipInit(0) })?;
        let mut count = 0;
        check("hipGetDeviceCount", unsafe {
            hip::hipGetDeviceCount(&mut count)
        })?;
        if ordinal >= count as usize {
            return Err(DeviceError::NoDevice {
                backend: "HIP",
                ordinal,
                count: count as usize,
            });
        }
        let ordinal = ordinal as i32;
        check("hipSetDevice", unsafe { hip::hipSetDevice(ordinal) })?;
        let mut props = MaybeUninit::<hip::hipDeviceProp_tR0600>::zeroed();
        check("hipGetDeviceProperties", unsafe {
            hip::hipGetDevicePropertiesR0600(props.as_mut_ptr(), ordinal)
        })?;
        let props = unsafe { props.assume_init() };
        // "gfx950:sramecc+:xnack-" -> "gfx950"
        let arch = cstr(&props.gcnArchName)
            .split(':')
            .next()
            .unwrap_or("")
            .to_string();
        let mut driver = 0;
        check("hipDriverGetVersion", unsafe {
            hip::hipDriverGetVersion(&mut driver)
        })?;
        let info = DeviceInfo {
            backend: "HIP",
            name: cstr(&props.name),
            arch: arch.clone(),
            ordinal: ordinal as usize,
            multiprocessors: props.multiProcessorCount as u32,
            total_memory: props.totalGlobalMem,
            wave_size: props.warpSize as u32,
            max_shared_per_block: props.sharedMemPerBlockOptin.max(props.sharedMemPerBlock) as u32,
            clock_khz: props.clockRate as u32,
            memory_clock_khz: props.memoryClockRate as u32,
            memory_bus_bits: props.memoryBusWidth as u32,
            l2_bytes: props.l2CacheSize as u32,
            driver_version: format!("HIP driver {driver}"),
        };
        Ok(Hip {
            ordinal,
            info,
            compiler: Clang::find(&arch)?,
        })
    }

    fn bind(&self) -> Result<()> {
        check("hipSetDevice", unsafe { hip::hipSetDevice(self.ordinal) })
    }
}

impl Backend for Hip {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn compiler(&self) -> &dyn Compiler {
        &self.compiler
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        self.bind()?;
        let mut ptr = null_mut();
        check("hipMalloc", unsafe {
            hip::hipMalloc(&mut ptr, bytes.max(1))
        })?;
        Ok(ptr as u64)
    }

    fn free(&self, ptr: u64) {
        if self.bind().is_ok() {
            let _ = unsafe { hip::hipFree(ptr as *mut c_void) };
        }
    }

    fn memset(&self, ptr: u64, byte: u8, bytes: usize, stream: Handle) -> Result<()> {
        self.bind()?;
        check("hipMemsetAsync", unsafe {
            hip::hipMemsetAsync(ptr as *mut c_void, byte as i32, bytes, p(stream))
        })
    }

    fn copy_to_device(&self, dst: u64, src: &[u8], stream: Handle) -> Result<()> {
        self.bind()?;
        check("hipMemcpyHtoDAsync", unsafe {
            hip::hipMemcpyHtoDAsync(
                dst as hip::hipDeviceptr_t,
                src.as_ptr().cast(),
                src.len(),
                p(stream),
            )
        })?;
        self.stream_sync(stream)
    }

    fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: Handle) -> Result<()> {
        self.bind()?;
        check("hipMemcpyDtoHAsync", unsafe {
            hip::hipMemcpyDtoHAsync(
                dst.as_mut_ptr().cast(),
                src as hip::hipDeviceptr_t,
                dst.len(),
                p(stream),
            )
        })?;
        self.stream_sync(stream)
    }

    fn copy_on_device(&self, dst: u64, src: u64, bytes: usize, stream: Handle) -> Result<()> {
        self.bind()?;
        check("hipMemcpyDtoDAsync", unsafe {
            hip::hipMemcpyDtoDAsync(
                dst as hip::hipDeviceptr_t,
                src as hip::hipDeviceptr_t,
                bytes,
                p(stream),
            )
        })
    }

    fn stream_create(&self) -> Result<Handle> {
        self.bind()?;
        let mut stream = null_mut();
        check("hipStreamCreateWithFlags", unsafe {
            hip::hipStreamCreateWithFlags(&mut stream, hip::hipStreamNonBlocking)
        })?;
        Ok(stream as Handle)
    }

    fn stream_destroy(&self, stream: Handle) {
        let _ = unsafe { hip::hipStreamDestroy(p(stream)) };
    }

    fn stream_sync(&self, stream: Handle) -> Result<()> {
        check("hipStreamSynchronize", unsafe {
            hip::hipStreamSynchronize(p(stream))
        })
    }

    fn event_create(&self) -> Result<Handle> {
        self.bind()?;
        let mut event = null_mut();
        check("hipEventCreateWithFlags", unsafe {
            hip::hipEventCreateWithFlags(&mut event, hip::hipEventDefault)
        })?;
        Ok(event as Handle)
    }

    fn event_destroy(&self, event: Handle) {
        let _ = unsafe { hip::hipEventDestroy(p(event)) };
    }

    fn event_record(&self, event: Handle, stream: Handle) -> Result<()> {
        check("hipEventRecord", unsafe {
            hip::hipEventRecord(p(event), p(stream))
        })
    }

    fn event_sync(&self, event: Handle) -> Result<()> {
        check("hipEventSynchronize", unsafe {
            hip::hipEventSynchronize(p(event))
        })
    }

    fn event_elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32> {
        let mut ms = 0.0f32;
        check("hipEventElapsedTime", unsafe {
            hip::hipEventElapsedTime(&mut ms, p(start), p(end))
        })?;
        Ok(ms)
    }

    fn module_load(&self, image: &[u8]) -> Result<Handle> {
        self.bind()?;
        let mut module = null_mut();
        check("hipModuleLoadData", unsafe {
            hip::hipModuleLoadData(&mut module, image.as_ptr().cast())
        })?;
        Ok(module as Handle)
    }

    fn module_unload(&self, module: Handle) {
        let _ = unsafe { hip::hipModuleUnload(p(module)) };
    }

    fn function(&self, module: Handle, name: &str) -> Result<Handle> {
        let cname = CString::new(name).map_err(|_| DeviceError::Launch {
            kernel: name.into(),
            message: "kernel name contains a NUL byte".into(),
        })?;
        let mut function = null_mut();
        check("hipModuleGetFunction", unsafe {
            hip::hipModuleGetFunction(&mut function, p(module), cname.as_ptr())
        })?;
        Ok(function as Handle)
    }

    fn function_resources(&self, function: Handle) -> Result<KernelResources> {
        let get = |a: hip::hipFunction_attribute| {
            let mut v = 0;
            check("hipFuncGetAttribute", unsafe {
                hip::hipFuncGetAttribute(&mut v, a, p(function))
            })
            .map(|()| v as u32)
        };
        Ok(KernelResources {
            kernel: String::new(),
            registers: get(hip::hipFunction_attribute_HIP_FUNC_ATTRIBUTE_NUM_REGS)?,
            sgprs: None,
            spills: 0,
            scratch_bytes: get(hip::hipFunction_attribute_HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            shared_bytes: get(hip::hipFunction_attribute_HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
        })
    }

    /// AMD kernels may use LDS up to the device limit without opting in.
    fn set_max_dynamic_shared(&self, _function: Handle, _bytes: u32) -> Result<()> {
        Ok(())
    }

    fn max_active_per_multiprocessor(
        &self,
        function: Handle,
        block: u32,
        shared_bytes: u32,
    ) -> Result<u32> {
        self.bind()?;
        let mut n = 0;
        check(
            "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor",
            unsafe {
                hip::hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(
                    &mut n,
                    p(function),
                    block as i32,
                    shared_bytes as usize,
                )
            },
        )?;
        Ok(n as u32)
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
        // `overlap_prior` has no HIP counterpart: the launch waits at the stream as usual, which
        // is what the kernel's `mono_wait_prior()` would have waited for.
        let (f, g, b, s) = (p(function), launch.grid, launch.block, launch.shared_bytes);
        if launch.cooperative {
            check(
                "hipModuleLaunchCooperativeKernel",
                hip::hipModuleLaunchCooperativeKernel(
                    f,
                    g,
                    1,
                    1,
                    b,
                    1,
                    1,
                    s,
                    p(stream),
                    params.as_mut_ptr(),
                ),
            )
        } else {
            check(
                "hipModuleLaunchKernel",
                hip::hipModuleLaunchKernel(
                    f,
                    g,
                    1,
                    1,
                    b,
                    1,
                    1,
                    s,
                    p(stream),
                    params.as_mut_ptr(),
                    null_mut(),
                ),
            )
        }
    }

    fn begin_capture(&self, stream: Handle) -> Result<()> {
        check("hipStreamBeginCapture", unsafe {
            hip::hipStreamBeginCapture(
                p(stream),
                hip::hipStreamCaptureMode_hipStreamCaptureModeThreadLocal,
            )
        })
    }

    fn end_capture(&self, stream: Handle) -> Result<(Handle, Handle)> {
        let mut graph = null_mut();
        check("hipStreamEndCapture", unsafe {
            hip::hipStreamEndCapture(p(stream), &mut graph)
        })?;
        let mut exec = null_mut();
        let instantiated = check("hipGraphInstantiate", unsafe {
            hip::hipGraphInstantiate(&mut exec, graph, null_mut(), null_mut(), 0)
        });
        if let Err(e) = instantiated {
            let _ = unsafe { hip::hipGraphDestroy(graph) };
            return Err(e);
        }
        Ok((graph as Handle, exec as Handle))
    }

    fn graph_launch(&self, exec: Handle, stream: Handle) -> Result<()> {
        check("hipGraphLaunch", unsafe {
            hip::hipGraphLaunch(p(exec), p(stream))
        })
    }

    fn graph_upload(&self, exec: Handle, stream: Handle) -> Result<()> {
        check("hipGraphUpload", unsafe {
            hip::hipGraphUpload(p(exec), p(stream))
        })
    }

    fn graph_destroy(&self, graph: Handle, exec: Handle) {
        let _ = unsafe { hip::hipGraphExecDestroy(p(exec)) };
        let _ = unsafe { hip::hipGraphDestroy(p(graph)) };
    }
}
