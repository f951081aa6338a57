//! Host side of the head stage: the sources, the kernel argument's twins (`HeadEmbed`,
//! `HeadNorm`, `HeadArgmax`, `HeadPick`, `HeadArgs` of `kernels/head_tasks.h`), what the fused
//! kernel's generator takes from the stage, and the standalone launch (`head_tasks`).

use crate::layout::{lds_bytes, LayoutError};
use device::{Args, Device, DeviceError, Kernel, KernelSource, Launch, Module, Stream};
use mailbox::gpu::{LaunchTable, Variant};

pub const HEAD_HIP: (&str, &str) = ("head.hip", include_str!("../kernels/head.hip"));
pub const HEAD_TASKS_H: (&str, &str) = ("head_tasks.h", include_str!("../kernels/head_tasks.h"));

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

pub type Result<T, E = GpuError> = std::result::Result<T, E>;

/// `struct head_embed`. Pointers are device addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct HeadEmbed {
    pub table: u64,
    pub tokens: u64,
    pub y: u64,
    pub vocab: u32,
    pub hidden: u32,
    pub y_stride: u32,
    pub pad: u32,
}

/// `struct head_norm`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct HeadNorm {
    pub x: u64,
    pub weight: u64,
    pub y: u64,
    pub n: u32,
    pub x_stride: u32,
    pub y_stride: u32,
    pub eps: f32,
}

/// `struct head_argmax`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct HeadArgmax {
    pub logits: u64,
    pub pairs: u64,
    pub n: u32,
    pub stride: u32,
    pub first_id: u32,
    pub shard: u32,
    pub shards: u32,
    pub pad: u32,
}

/// `struct head_pick`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct HeadPick {
    pub pairs: u64,
    pub tokens: u64,
    /// The pairs' row length.
    pub shards: u32,
    /// The shards picked over, `first .. first + count`: those whose pairs the launch holds.
    pub first: u32,
    pub count: u32,
    pub pad: u32,
}

/// `struct head_args`: each kind's list (device addresses) and its length.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct HeadArgs {
    pub embeds: u64,
    pub norms: u64,
    pub argmaxes: u64,
    pub picks: u64,
    pub n_embeds: u32,
    pub n_norms: u32,
    pub n_argmaxes: u32,
    pub n_picks: u32,
}

const _: () = assert!(std::mem::size_of::<HeadEmbed>() == 40);
const _: () = assert!(std::mem::size_of::<HeadNorm>() == 40);
const _: () = assert!(std::mem::size_of::<HeadArgmax>() == 40);
const _: () = assert!(std::mem::size_of::<HeadPick>() == 32);
const _: () = assert!(std::mem::size_of::<HeadArgs>() == 48);

/// `head.hip` for CTAs of `threads`.
pub fn source(threads: u32, variant: Variant) -> KernelSource {
    variant
        .apply(mailbox::gpu::source(HEAD_HIP).header(HEAD_TASKS_H.0, HEAD_TASKS_H.1))
        .define("MONO_CTA_THREADS", threads)
}

/// The production build for the kernel table: the fused shape's 512 threads.
pub fn sources() -> Vec<KernelSource> {
    vec![source(512, Variant::default())]
}

/// What the fused kernel's generator takes from this stage: its header, `head_args` and
/// `head_decode` (no shape defines: every size is in the descriptors).
pub fn stage_kernel() -> mailbox::StageKernel {
    mailbox::StageKernel {
        stage: mailbox::Stage::Head,
        include: HEAD_TASKS_H.0,
        headers: vec![HEAD_TASKS_H],
        args_type: "head_args",
        decoder: "head_decode",
        defines: Default::default(),
    }
}

/// The built standalone entry `head_tasks`.
pub struct HeadKernel {
    kernel: Kernel,
    threads: u32,
    _module: Module,
}

impl HeadKernel {
    pub fn build(dev: &Device, threads: u32, variant: Variant) -> Result<Self> {
        lds_bytes(threads)?;
        let module = dev.build(&source(threads, variant))?;
        Ok(HeadKernel {
            kernel: module.kernel("head_tasks")?,
            threads,
            _module: module,
        })
    }

    /// The largest grid whose CTAs are all resident.
    pub fn max_resident(&self) -> Result<u32> {
        let lds = lds_bytes(self.threads)?;
        Ok(self.kernel.max_coresident_grid(self.threads, lds)?)
    }

    pub fn launch(&self, stream: &Stream, table: &LaunchTable, args: &HeadArgs) -> Result<()> {
        let launch = Launch::new(table.n_ctas, self.threads).shared(lds_bytes(self.threads)?);
        Ok(stream.launch(&self.kernel, launch, &Args::new().value(table).value(args))?)
    }
}
