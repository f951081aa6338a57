//! The head's fused launches on a device: the built kernel of the linear and head stages
//! ([`HeadKernel`]) and one planned launch's buffers ([`HeadLaunch`]): its task table, scratch,
//! activation arena, linear matrices and head descriptors; the epoch node then one cooperative
//! launch of one CTA a SM.

use super::head::{head_source, HeadDescriptors};
use super::{CtaShape, FitError, FusedKernel, PlannedLaunch};
use device::{Args, Buffer, Device, DeviceError, Kernel, Launch, Module, Stream};
use head::gpu::HeadArgs;
use linear::gpu::{LinArgs, LinMatrix};
use mailbox::gpu::{DeviceTable, EpochNode, LaunchTable, Variant};
use mailbox::layout::Tags;
use mailbox::trace::{decode, Trace};
use mailbox::{Stall, TaskTable, DIAG_WORDS};

#[derive(Debug, thiserror::Error)]
pub enum HeadGpuError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Fit(#[from] FitError),
    #[error(transparent)]
    Mailbox(#[from] mailbox::gpu::GpuError),
    #[error("{0}")]
    Shape(String),
    #[error("the fused launch stalled: {0}")]
    Stalled(Stall),
    #[error(transparent)]
    Trace(#[from] mailbox::trace::TraceError),
}

pub type Result<T, E = HeadGpuError> = std::result::Result<T, E>;

/// The kernel's name in messages.
const NAME: &str = "the head's fused kernel";

/// The built fused kernel of the head's parts, and its epoch node.
pub struct HeadKernel {
    // Declared before the module: a kernel must not outlive its module.
    kernel: Kernel,
    epoch: EpochNode,
    _module: Module,
    shape: CtaShape,
    ctas: u32,
    variant: Variant,
}

impl HeadKernel {
    /// Builds the kernel (with `MONO_FAULT = fault` when a test asks for one, `head_tasks.h`)
    /// and checks that one CTA of the fused shape is resident on every SM at once.
    pub fn build(dev: &Device, variant: Variant, fault: Option<u32>) -> Result<Self> {
        Self::build_as(dev, variant, fault, false)
    }

    /// The same kernel writing every task's record (`mailbox::trace`), for [`HeadLaunch::trace`].
    pub fn build_traced(dev: &Device, variant: Variant) -> Result<Self> {
        Self::build_as(dev, variant, None, true)
    }

    fn build_as(dev: &Device, variant: Variant, fault: Option<u32>, traced: bool) -> Result<Self> {
        let shape = CtaShape::of_device(dev, NAME)?;
        let mut source =
            head_source(shape, variant).map_err(|e| HeadGpuError::Shape(e.to_string()))?;
        if let Some(f) = fault {
            source = source.define("MONO_FAULT", f);
        }
        if traced {
            source = mailbox::trace::traced(source);
        }
        let ctas = dev.info().multiprocessors;
        let FusedKernel {
            kernel,
            module,
            shape,
        } = FusedKernel::build(dev, NAME, &source, shape, 0, ctas)?;
        Ok(HeadKernel {
            kernel,
            epoch: EpochNode::build(dev, variant)?,
            _module: module,
            shape,
            ctas,
            variant,
        })
    }

    /// CTAs a launch is planned for: one a SM.
    pub fn ctas(&self) -> u32 {
        self.ctas
    }

    pub fn shape(&self) -> CtaShape {
        self.shape
    }
}

fn upload_list<T: bytemuck::Pod + Default>(dev: &Device, list: &[T]) -> Result<Buffer<T>> {
    // A list nobody uses still gets a valid address.
    if list.is_empty() {
        return Ok(dev.upload(&[T::default()])?);
    }
    Ok(dev.upload(list)?)
}

/// One planned launch on the device.
pub struct HeadLaunch {
    table: DeviceTable,
    tasks: TaskTable,
    scratch: Buffer<u64>,
    epoch: Buffer<u32>,
    diag: Buffer<u32>,
    /// The launch's activation arena (`PlannedLaunch::arena`), zeroed at first.
    pub arena: Buffer<u8>,
    _mats: Buffer<LinMatrix>,
    _lists: [Buffer<u8>; 4],
    lin: LinArgs,
    head: HeadArgs,
    tags: Tags,
}

impl HeadLaunch {
    /// Allocates the arena, has `bind` fill the matrices and descriptors at its address, uploads
    /// them with the task table, after checking that the tasks' shared memory (`lds`) fits.
    pub fn new(
        dev: &Device,
        kernel: &HeadKernel,
        planned: &PlannedLaunch,
        lds: u32,
        bind: impl FnOnce(u64) -> (Vec<LinMatrix>, HeadDescriptors),
    ) -> Result<Self> {
        if lds > kernel.shape.shared_bytes {
            return Err(HeadGpuError::Shape(format!(
                "the launch's tasks take {lds} bytes of shared memory; a CTA of this kernel gets {}",
                kernel.shape.shared_bytes
            )));
        }
        if planned.placement.placement().ctas() != kernel.ctas {
            return Err(HeadGpuError::Shape(format!(
                "the launch is planned for {} CTAs; the kernel runs {}",
                planned.placement.placement().ctas(),
                kernel.ctas
            )));
        }
        let arena = dev.alloc_zeroed::<u8>(planned.arena.bytes.max(1) as usize)?;
        let (mats, d) = bind(arena.device_ptr());
        if mats.len() != planned.matrices as usize {
            return Err(HeadGpuError::Shape(format!(
                "{} matrices bound; the launch reserved {}",
                mats.len(),
                planned.matrices
            )));
        }
        let mats = upload_list(dev, &mats)?;
        let bytes = |v: &[u8]| -> Result<Buffer<u8>> { upload_list(dev, v) };
        let lists = [
            bytes(bytemuck::cast_slice(&d.embeds))?,
            bytes(bytemuck::cast_slice(&d.norms))?,
            bytes(bytemuck::cast_slice(&d.argmaxes))?,
            bytes(bytemuck::cast_slice(&d.picks))?,
        ];
        let head = HeadArgs {
            embeds: lists[0].device_ptr(),
            norms: lists[1].device_ptr(),
            argmaxes: lists[2].device_ptr(),
            picks: lists[3].device_ptr(),
            n_embeds: d.embeds.len() as u32,
            n_norms: d.norms.len() as u32,
            n_argmaxes: d.argmaxes.len() as u32,
            n_picks: d.picks.len() as u32,
        };
        let lin = LinArgs {
            mats: mats.device_ptr(),
            n_mats: planned.matrices,
            experts: 0,
            n_experts: 0,
        };
        Ok(HeadLaunch {
            table: DeviceTable::upload(dev, &planned.placement)?,
            tasks: planned.placement.placement().table(),
            scratch: dev.alloc_zeroed(planned.layout.boxes().max(1) as usize)?,
            epoch: dev.alloc_zeroed(1)?,
            diag: dev.alloc_zeroed(DIAG_WORDS)?,
            arena,
            _mats: mats,
            _lists: lists,
            lin,
            head,
            tags: Tags::new(1).map_err(|e| HeadGpuError::Shape(e.to_string()))?,
        })
    }

    /// The epoch node, then the one fused launch (a graph capture records both).
    pub fn enqueue(&self, kernel: &HeadKernel, stream: &Stream) -> Result<()> {
        self.enqueue_with(kernel, stream, None)
    }

    /// The launch's task table, as a trace's spans index it.
    pub fn tasks(&self) -> &TaskTable {
        &self.tasks
    }

    /// One launch on a kernel of [`HeadKernel::build_traced`], waited for: every task's span.
    pub fn trace(&self, dev: &Device, kernel: &HeadKernel, stream: &Stream) -> Result<Trace> {
        let words = self.table.trace_buffer(dev)?;
        self.enqueue_with(kernel, stream, Some(&words))?;
        stream.sync()?;
        Ok(decode(&self.tasks, &words.download()?)?)
    }

    fn enqueue_with(
        &self,
        kernel: &HeadKernel,
        stream: &Stream,
        trace: Option<&Buffer<u64>>,
    ) -> Result<()> {
        kernel
            .epoch
            .enqueue(stream, &self.epoch, &self.scratch, self.tags)?;
        let mut table = LaunchTable::new(
            &self.table,
            &self.scratch,
            &self.epoch,
            &self.diag,
            self.tags,
            0,
        )?;
        if let Some(words) = trace {
            table = table.with_trace(&self.table, words)?;
        }
        let launch = Launch::new(self.table.ctas, kernel.shape.threads)
            .shared(kernel.shape.shared_bytes)
            .cooperative();
        let args = Args::new().value(&table).value(&self.lin).value(&self.head);
        stream.launch(&kernel.kernel, launch, &args)?;
        Ok(())
    }

    /// The first stall a debug build reported, if any.
    pub fn check_stall(&self, kernel: &HeadKernel) -> Result<()> {
        let diag = self.diag.download()?;
        let limit = kernel.variant.debug.map_or(0, |d| u64::from(d.poll_limit));
        if let Some((stall, _)) = Stall::from_diag(&diag, limit) {
            return Err(HeadGpuError::Stalled(stall));
        }
        Ok(())
    }

    /// `len` values of `T` at `offset` bytes of the arena.
    pub fn read<T: bytemuck::Pod>(&self, offset: u64, len: usize) -> Result<Vec<T>> {
        let bytes = self.arena.download()?;
        let size = std::mem::size_of::<T>();
        let at = offset as usize;
        let Some(slice) = bytes.get(at..at + len * size) else {
            return Err(HeadGpuError::Shape(format!(
                "{len} values at byte {offset} pass the arena's {} bytes",
                bytes.len()
            )));
        };
        Ok(slice
            .chunks_exact(size)
            .map(bytemuck::pod_read_unaligned)
            .collect())
    }

    /// Writes `data` at `offset` bytes of the arena (an input the host provides).
    pub fn write<T: bytemuck::Pod>(&self, offset: u64, data: &[T]) -> Result<()> {
        let mut bytes = self.arena.download()?;
        let src: &[u8] = bytemuck::cast_slice(data);
        let at = offset as usize;
        let Some(dst) = bytes.get_mut(at..at + src.len()) else {
            return Err(HeadGpuError::Shape(format!(
                "{} bytes at {offset} pass the arena's {}",
                src.len(),
                bytes.len()
            )));
        };
        dst.copy_from_slice(src);
        self.arena.write(&bytes)?;
        Ok(())
    }
}
