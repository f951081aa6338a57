//! The one CTA shape of a fused launch: every task of every stage runs in it.
//!
//! sm_90a (H100/H200): 512 threads (four warpgroups), one CTA per SM, at most 128 registers a
//! thread (`__launch_bounds__(512, 1)`), the SM's whole shared memory (227 KiB of dynamic shared
//! memory). Four warpgroups let a stage split the CTA into teams the way the wgmma scorer wants
//! (warpgroups stream pages while others compute), and 128 registers hold the wgmma accumulators;
//! one CTA a SM gives each task the SM's whole shared memory for its rings.
//!
//! gfx950 (MI355X): 512 threads (eight waves of 64), one CTA per CU, 160 KiB of LDS.
//!
//! What the shape costs each stage against its own best shape (H200, graph replays; the stages'
//! PERF.md have the runs): the indexer's scoring, as two 256-thread run teams in one CTA against
//! two 256-thread CTAs a SM, 128K x 1 row 11.25 against 9.78 us, 128K x 4 14.87 against 12.34,
//! 512K x 1 25.03 against 22.93, 512K x 4 36.35 against 32.27 (the later launch can start only
//! when the whole CTA is done, so overlapping launches gain little); select's registers kind at
//! 8K x 4 rows 5.25 against 4.40 us at 1024 threads, its slices at 128K x 4 12.26 against 11.80
//! at two CTAs a SM. The MLA attention and the linear task were written for this shape (93-101
//! and 94-96 registers, no spills). 384 threads, the other candidate on sm_90a, was not measured:
//! the wgmma scorer's page pairs and the attention's splits are laid out in warpgroup pairs.

use device::{Device, DeviceError, DeviceInfo, Kernel, KernelSource, Module};

use super::ENTRY;

/// Threads, the per-thread register cap that follows from one CTA a SM, and the dynamic shared
/// memory every task may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtaShape {
    pub threads: u32,
    pub shared_bytes: u32,
}

/// Largest dynamic shared memory a CTA may ask for on sm_90 (227 KiB).
const SM90_SHARED: u32 = 227 * 1024;
/// LDS of a gfx950 CU.
const GFX950_SHARED: u32 = 160 * 1024;

impl CtaShape {
    /// The shape for a compile target (`sm_90a` or `gfx950`), or the host backend's (`host`: CPU
    /// threads that run the NVIDIA source's paths, so sm_90a's shape).
    pub fn for_target(target: &str) -> Option<CtaShape> {
        match target {
            "sm_90a" | "host" => Some(CtaShape {
                threads: 512,
                shared_bytes: SM90_SHARED,
            }),
            "gfx950" => Some(CtaShape {
                threads: 512,
                shared_bytes: GFX950_SHARED,
            }),
            _ => None,
        }
    }

    /// The shape for the device in hand, capped by what it reports it can give a CTA.
    pub fn for_device(info: &DeviceInfo) -> Option<CtaShape> {
        let shape = CtaShape::for_target(&info.arch)?;
        Some(CtaShape {
            shared_bytes: shape.shared_bytes.min(info.max_shared_per_block),
            ..shape
        })
    }
}

/// Why a fused kernel was not built: the device's error, or a CTA that does not fit (the message
/// names the kernel and what did not fit).
#[derive(Debug, thiserror::Error)]
pub enum FitError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("{0}")]
    Fit(String),
}

impl CtaShape {
    /// The fused shape of the device in hand, or an error naming `kernel` and the device.
    pub fn of_device(dev: &Device, kernel: &str) -> Result<CtaShape, FitError> {
        CtaShape::for_device(dev.info()).ok_or_else(|| {
            FitError::Fit(format!(
                "{kernel}: no fused CTA shape for {}",
                dev.info().arch
            ))
        })
    }
}

/// A fused kernel built for the device in hand, and the CTA it runs in.
pub struct FusedKernel {
    // Declared before the module: a kernel must not outlive its module.
    pub kernel: Kernel,
    pub module: Module,
    /// The shape the source was generated for, its shared memory less what the kernel declares
    /// statically (a debug build's report words).
    pub shape: CtaShape,
}

impl FusedKernel {
    /// Builds `source` (the fused kernel `name`, generated for `shape`) and checks that it fits:
    /// its CTA keeps at least `need_shared` bytes of dynamic shared memory (what the stages' tasks
    /// take) beside what it declares statically, and `ctas` CTAs of it are resident at once (a
    /// persistent launch whose CTAs wait on each other hangs otherwise).
    pub fn build(
        dev: &Device,
        name: &str,
        source: &KernelSource,
        shape: CtaShape,
        need_shared: u32,
        ctas: u32,
    ) -> Result<Self, FitError> {
        let module = dev.build(source)?;
        let kernel = module.kernel(ENTRY)?;
        let fixed = kernel.resources()?.shared_bytes;
        let shape = CtaShape {
            shared_bytes: shape
                .shared_bytes
                .min(dev.info().max_shared_per_block.saturating_sub(fixed)),
            ..shape
        };
        if shape.shared_bytes < need_shared {
            return Err(FitError::Fit(format!(
                "{name}: the stages' tasks take {need_shared} bytes of shared memory; a CTA of \
                 this kernel gets {} ({fixed} declared statically)",
                shape.shared_bytes
            )));
        }
        let resident = kernel.max_coresident_grid(shape.threads, shape.shared_bytes)?;
        if resident < ctas {
            return Err(FitError::Fit(format!(
                "{name}: {resident} CTAs of {} threads and {} bytes of shared memory are resident \
                 at once; the launch needs {ctas}",
                shape.threads, shape.shared_bytes
            )));
        }
        Ok(FusedKernel {
            kernel,
            module,
            shape,
        })
    }
}
