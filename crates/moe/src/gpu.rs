//! Host side of the MoE launch on a device: the standalone entry's source (`kernels/moe.hip`:
//! the linear and MoE stages in one task-list loop) and the MoE stage for the fused generator,
//! a built kernel (the standalone entry, or a fused module's entry), and one problem's memory,
//! task table and arguments on the device.

use crate::check::DeviceResult;
use crate::layout::MoePlan;
use crate::memory::{MoeArgs, MoeMemory};
use crate::problem::MoeProblem;
use device::{Args, Buffer, Device, DeviceError, Kernel, KernelSource, Launch, Module, Stream};
use linear::gpu::{LinArgs, LinExpert, LinMatrix};
use mailbox::gpu::{LaunchTable, Variant};

pub const MOE_HIP: (&str, &str) = ("moe.hip", include_str!("../kernels/moe.hip"));
pub const MOE_TASK_H: (&str, &str) = ("moe_task.h", include_str!("../kernels/moe_task.h"));
/// The standalone entry's name.
pub const ENTRY: &str = "moe_layer_tasks";

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Mailbox(#[from] mailbox::gpu::GpuError),
    #[error(transparent)]
    Placement(#[from] mailbox::PlacementError),
    #[error("the launch stopped: {0}")]
    Stalled(String),
    #[error("{0}")]
    Shape(String),
}

pub type Result<T, E = GpuError> = std::result::Result<T, E>;

/// `moe.hip` for CTAs of `threads`.
pub fn source(threads: u32, variant: Variant) -> KernelSource {
    variant
        .apply(
            mailbox::gpu::source(MOE_HIP)
                .header(linear::gpu::LIN_TASK_H.0, linear::gpu::LIN_TASK_H.1)
                .header(MOE_TASK_H.0, MOE_TASK_H.1),
        )
        .define("MONO_CTA_THREADS", threads)
}

/// The production build for the kernel table: the fused shape's 512 threads.
pub fn sources() -> Vec<KernelSource> {
    vec![source(512, Variant::default())]
}

/// The MoE stage for the fused kernel's generator (`moe_task.h`, `moe_args`, `moe_decode`); a
/// launch that runs it also runs the linear stage (`linear::gpu::stage_kernel`).
pub fn stage_kernel() -> mailbox::StageKernel {
    mailbox::StageKernel {
        stage: mailbox::Stage::Moe,
        include: MOE_TASK_H.0,
        headers: vec![MOE_TASK_H, linear::gpu::LIN_TASK_H],
        args_type: "moe_args",
        decoder: "moe_decode",
        defines: Default::default(),
    }
}

/// A built kernel taking `(mbx_launch, lin_args, moe_args)`: the standalone entry, or a fused
/// module's entry over the linear and MoE stages in that order.
pub struct MoeKernel {
    kernel: Kernel,
    threads: u32,
    _module: Module,
}

impl MoeKernel {
    pub fn build(dev: &Device, threads: u32, variant: Variant) -> Result<Self> {
        Self::from_source(dev, &source(threads, variant), ENTRY, threads)
    }

    pub fn from_source(
        dev: &Device,
        source: &KernelSource,
        entry: &str,
        threads: u32,
    ) -> Result<Self> {
        let module = dev.build(source)?;
        Ok(MoeKernel {
            kernel: module.kernel(entry)?,
            threads,
            _module: module,
        })
    }

    pub fn threads(&self) -> u32 {
        self.threads
    }

    /// Dynamic shared memory a launch gives each CTA: all the device allows beside the kernel's
    /// static words, at least `need` (`layout::lds_bytes`). The linear tile streams through what
    /// lies beyond its partial sums and x rows, so more keeps more bytes in flight.
    pub fn lds_budget(&self, dev: &Device, need: u32) -> Result<u32> {
        let fixed = self.kernel.resources()?.shared_bytes;
        let budget = dev.info().max_shared_per_block.saturating_sub(fixed);
        if budget < need {
            return Err(GpuError::Shape(format!(
                "the launch needs {need} bytes of shared memory a CTA; the device gives {budget}"
            )));
        }
        Ok(budget)
    }

    /// The largest grid whose CTAs are all resident with `lds` bytes of shared memory each.
    pub fn max_resident(&self, lds: u32) -> Result<u32> {
        Ok(self.kernel.max_coresident_grid(self.threads, lds)?)
    }

    pub fn launch(
        &self,
        stream: &Stream,
        table: &LaunchTable,
        lin: &LinArgs,
        moe: &MoeArgs,
        lds: u32,
    ) -> Result<()> {
        let launch = Launch::new(table.n_ctas, self.threads).shared(lds);
        let args = Args::new().value(table).value(lin).value(moe);
        Ok(stream.launch(&self.kernel, launch, &args)?)
    }
}

/// One problem on the device: its arena, arguments, task table and scratch.
pub struct DeviceMoe {
    pub arena: Buffer<u8>,
    pub mats: Buffer<LinMatrix>,
    pub experts: Buffer<LinExpert>,
    pub args: MoeArgs,
    pub table: mailbox::gpu::DeviceTable,
    pub scratch: Buffer<u64>,
    pub epoch: Buffer<u32>,
    pub diag: Buffer<u32>,
    pub lds: u32,
}

impl DeviceMoe {
    /// Uploads `mem` and checks `plan` against what `kernel` keeps resident with `lds` bytes.
    pub fn new(
        dev: &Device,
        kernel: &MoeKernel,
        p: &MoeProblem,
        mem: &MoeMemory,
        plan: &MoePlan,
        lds: u32,
    ) -> Result<Self> {
        let limits = mailbox::Limits {
            max_resident: kernel.max_resident(lds)?,
            scratch_boxes: plan.end_box,
        };
        let valid = plan.placement.clone().check(limits)?;
        let arena = dev.upload(&mem.bytes)?;
        let (mats, experts, args) = mem.args(arena.device_ptr(), p);
        Ok(DeviceMoe {
            mats: dev.upload(&mats)?,
            experts: dev.upload(&experts)?,
            args,
            table: mailbox::gpu::DeviceTable::upload(dev, &valid)?,
            scratch: dev.alloc_zeroed(plan.end_box as usize)?,
            epoch: dev.alloc_zeroed(1)?,
            diag: dev.alloc_zeroed(mailbox::DIAG_WORDS)?,
            arena,
            lds,
        })
    }

    pub fn lin_args(&self) -> LinArgs {
        LinArgs {
            mats: self.mats.device_ptr(),
            experts: self.experts.device_ptr(),
            n_mats: self.mats.len() as u32,
            n_experts: self.experts.len() as u32,
        }
    }

    /// Enqueues launch `index` of a step of `tags` (the caller's epoch node advances the epoch).
    pub fn launch(
        &self,
        stream: &Stream,
        kernel: &MoeKernel,
        tags: mailbox::Tags,
        index: u32,
    ) -> Result<()> {
        let table = LaunchTable::new(
            &self.table,
            &self.scratch,
            &self.epoch,
            &self.diag,
            tags,
            index,
        )?;
        kernel.launch(stream, &table, &self.lin_args(), &self.args, self.lds)
    }

    /// The results, after the launch; an error if a wait gave up (debug builds).
    pub fn read(&self, mem: &MoeMemory) -> Result<DeviceResult> {
        let diag = self.diag.download()?;
        if let Some((stall, _)) = mailbox::Stall::from_diag(&diag, 0) {
            return Err(GpuError::Stalled(stall.to_string()));
        }
        Ok(mem.read(&self.arena.download()?))
    }
}
