//! Host side of the mailbox kernels: their sources and build variants, the epoch node, task tables
//! on the device, and the synthetic and latency kernels that the GPU tests and benchmarks launch.

use crate::diag::DIAG_WORDS;
use crate::layout::{Tags, BOXES_PER_LINE};
use crate::placement::{Placement, PlacementError, ValidPlacement};
use crate::synth::{SynthDag, ROW_MAX};
use crate::task::Task;
use crate::trace::{self, RECORD_WORDS};
use device::{Args, Buffer, Device, DeviceError, Kernel, KernelSource, Launch, Module, Stream};

/// `#include "mailbox.h"`: the header every stage's device code uses.
pub const HEADER: (&str, &str) = ("mailbox.h", include_str!("../kernels/mailbox.h"));
pub const EPOCH_HIP: (&str, &str) = ("epoch.hip", include_str!("../kernels/epoch.hip"));
pub const SYNTHETIC_HIP: (&str, &str) = ("synthetic.hip", include_str!("../kernels/synthetic.hip"));
pub const LATENCY_HIP: (&str, &str) = ("latency.hip", include_str!("../kernels/latency.hip"));
/// Every entry-point file of the crate, for compile checks.
pub const KERNEL_FILES: [(&str, &str); 3] = [EPOCH_HIP, SYNTHETIC_HIP, LATENCY_HIP];

/// Threads per CTA of the synthetic kernel: rows are at most 64 words, inputs up to 4 rows.
pub const SYNTHETIC_BLOCK: u32 = 128;
/// Threads per CTA of the latency ring: a thread per box of the longest row.
pub const LATENCY_BLOCK: u32 = 64;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error("{0}")]
    Shape(String),
}

pub type Result<T, E = GpuError> = std::result::Result<T, E>;

/// A source file that may include `mailbox.h` (and the prelude).
pub fn source(file: (&str, &str)) -> KernelSource {
    KernelSource::new(file.0, file.1).header(HEADER.0, HEADER.1)
}

/// The debug bound on polls (`MBX_DEBUG=1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebugBound {
    /// `MBX_POLL_LIMIT`: tries of one poll before it gives up.
    pub poll_limit: u32,
    /// `MBX_DEBUG_TRAP`: trap after reporting (else stop the launch and let the host read the report).
    pub trap: bool,
}

/// Build-time choices of `mailbox.h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// `MBX_POLL_ACQUIRE`: acquire polls instead of relaxed polls and one fence.
    pub poll_acquire: bool,
    pub debug: Option<DebugBound>,
    /// `MBX_EPOCH_CLEAR`: false only for the test that shows why the wrap must clear.
    pub epoch_clear: bool,
}

impl Default for Variant {
    fn default() -> Self {
        Variant {
            poll_acquire: false,
            debug: None,
            epoch_clear: true,
        }
    }
}

impl Variant {
    pub fn apply(&self, src: KernelSource) -> KernelSource {
        let src = src
            .define("MBX_POLL_ACQUIRE", self.poll_acquire as u32)
            .define("MBX_EPOCH_CLEAR", self.epoch_clear as u32);
        match self.debug {
            None => src.define("MBX_DEBUG", 0),
            Some(d) => src
                .define("MBX_DEBUG", 1)
                .define("MBX_POLL_LIMIT", format!("{}u", d.poll_limit))
                .define("MBX_DEBUG_TRAP", d.trap as u32),
        }
    }
}

/// The epoch node of a step graph.
pub struct EpochNode {
    // Declared before the module: a kernel must not outlive its module.
    kernel: Kernel,
    _module: Module,
}

impl EpochNode {
    pub fn build(dev: &Device, variant: Variant) -> Result<Self> {
        let module = dev.build(&variant.apply(source(EPOCH_HIP)))?;
        Ok(EpochNode {
            kernel: module.kernel("mailbox_epoch")?,
            _module: module,
        })
    }

    /// Enqueues one advance of the epoch word (clearing `scratch` when it wraps).
    pub fn enqueue(
        &self,
        stream: &Stream,
        epoch: &Buffer<u32>,
        scratch: &Buffer<u64>,
        tags: Tags,
    ) -> Result<()> {
        let args = Args::new()
            .buf(epoch)
            .buf(scratch)
            .u32(scratch.len() as u32)
            .u32(tags.launches_per_step());
        Ok(stream.launch(&self.kernel, Launch::new(1, 1024), &args)?)
    }
}

/// A placement's task table in device memory (`TaskTable`).
pub struct DeviceTable {
    pub tasks: Buffer<Task>,
    pub offsets: Buffer<u32>,
    pub ctas: u32,
    /// Tasks of the table (`tasks` holds one unused task when there are none).
    pub n_tasks: u32,
    /// The longest range any task writes or waits on.
    pub longest_range: u32,
}

impl DeviceTable {
    pub fn upload(dev: &Device, placement: &ValidPlacement) -> Result<Self> {
        Self::upload_unchecked(dev, placement.placement())
    }

    /// Uploads a placement that was not checked: only for showing what the debug bound reports.
    pub fn upload_unchecked(dev: &Device, placement: &Placement) -> Result<Self> {
        let table = placement.table();
        let n_tasks = table.tasks.len() as u32;
        // A buffer of no tasks cannot be allocated on every backend; one zero task is never read.
        let tasks = if table.tasks.is_empty() {
            vec![Task::default()]
        } else {
            table.tasks
        };
        let longest_range = placement
            .tasks()
            .flat_map(|(_, t)| std::iter::once(t.out.len).chain(t.inputs().iter().map(|r| r.len)))
            .max()
            .unwrap_or(0);
        Ok(DeviceTable {
            tasks: dev.upload(&tasks)?,
            offsets: dev.upload(&table.offsets)?,
            ctas: placement.ctas(),
            n_tasks,
            longest_range,
        })
    }

    /// A zeroed trace buffer for launches of this table: [`RECORD_WORDS`] words per task.
    pub fn trace_buffer(&self, dev: &Device) -> Result<Buffer<u64>> {
        Ok(dev.alloc_zeroed(self.n_tasks.max(1) as usize * RECORD_WORDS)?)
    }

    fn check_trace(&self, trace: &Buffer<u64>) -> Result<()> {
        let words = self.n_tasks as usize * RECORD_WORDS;
        if trace.len() < words {
            return Err(GpuError::Shape(format!(
                "a trace of {} tasks needs {words} words; the buffer has {}",
                self.n_tasks,
                trace.len()
            )));
        }
        Ok(())
    }
}

/// What every task-list launch takes besides its stages' arguments, in the byte layout of
/// `struct mbx_launch` (`kernels/mailbox.h`): passed by value as the kernel's first argument.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LaunchTable {
    pub tasks: u64,
    pub offsets: u64,
    pub scratch: u64,
    pub epoch: u64,
    pub diag: u64,
    /// The trace records (`mbx_launch.trace`); 0: none.
    pub trace: u64,
    pub n_ctas: u32,
    pub launches_per_step: u32,
    pub launch_index: u32,
    pub pad: u32,
}

impl LaunchTable {
    /// Launch `launch_index` of a step of `tags`, running `table` over `scratch`; `diag` holds
    /// [`DIAG_WORDS`] zeroed words.
    pub fn new(
        table: &DeviceTable,
        scratch: &Buffer<u64>,
        epoch: &Buffer<u32>,
        diag: &Buffer<u32>,
        tags: Tags,
        launch_index: u32,
    ) -> Result<Self> {
        if diag.len() < DIAG_WORDS {
            return Err(GpuError::Shape(format!(
                "diagnostics need {DIAG_WORDS} words"
            )));
        }
        Ok(LaunchTable {
            tasks: table.tasks.device_ptr(),
            offsets: table.offsets.device_ptr(),
            scratch: scratch.device_ptr(),
            epoch: epoch.device_ptr(),
            diag: diag.device_ptr(),
            trace: 0,
            n_ctas: table.ctas,
            launches_per_step: tags.launches_per_step(),
            launch_index,
            pad: 0,
        })
    }

    /// The same launch writing its task records to `trace` (read only by kernels built with
    /// [`trace::traced`]); `table` is the table this launch runs.
    pub fn with_trace(self, table: &DeviceTable, trace: &Buffer<u64>) -> Result<Self> {
        table.check_trace(trace)?;
        Ok(LaunchTable {
            trace: trace.device_ptr(),
            ..self
        })
    }
}

const _: () = assert!(std::mem::size_of::<LaunchTable>() == 64);

/// The synthetic persistent kernel and the step counter of its test graphs.
pub struct SyntheticKernel {
    kernel: Kernel,
    step_counter: Kernel,
    _module: Module,
}

/// Device buffers and numbers of one synthetic launch.
pub struct SyntheticLaunch<'a> {
    pub table: &'a DeviceTable,
    pub scratch: &'a Buffer<u64>,
    pub epoch: &'a Buffer<u32>,
    pub tags: Tags,
    pub launch_index: u32,
    pub inputs: &'a Buffer<u32>,
    pub step: &'a Buffer<u32>,
    /// `out_slots` slots of `out_words` words; launch (step, index) writes slot `step * L + index`.
    pub out: &'a Buffer<u32>,
    pub out_words: u32,
    /// [`DIAG_WORDS`] words, zeroed.
    pub diag: &'a Buffer<u32>,
    /// Where a kernel built with [`SyntheticKernel::build_traced`] writes its task records.
    pub trace: Option<&'a Buffer<u64>>,
}

impl SyntheticKernel {
    pub fn build(dev: &Device, variant: Variant) -> Result<Self> {
        Self::build_source(dev, variant.apply(source(SYNTHETIC_HIP)))
    }

    /// The build that records every task's start and end (`MBX_TRACE=1`).
    pub fn build_traced(dev: &Device, variant: Variant) -> Result<Self> {
        Self::build_source(dev, trace::traced(variant.apply(source(SYNTHETIC_HIP))))
    }

    fn build_source(dev: &Device, src: KernelSource) -> Result<Self> {
        let module = dev.build(&src.define("MBX_SYN_ROW_MAX", ROW_MAX))?;
        Ok(SyntheticKernel {
            kernel: module.kernel("mailbox_synthetic")?,
            step_counter: module.kernel("mailbox_step_counter")?,
            _module: module,
        })
    }

    /// The largest grid whose CTAs are all resident at once.
    pub fn max_resident(&self) -> Result<u32> {
        Ok(self.kernel.max_coresident_grid(SYNTHETIC_BLOCK, 0)?)
    }

    pub fn launch(&self, stream: &Stream, l: &SyntheticLaunch) -> Result<()> {
        if l.table.longest_range > ROW_MAX {
            return Err(GpuError::Shape(format!(
                "a task uses a range of {} boxes; the synthetic kernel stages at most {ROW_MAX}",
                l.table.longest_range
            )));
        }
        if l.diag.len() < DIAG_WORDS {
            return Err(GpuError::Shape(format!(
                "diagnostics need {DIAG_WORDS} words"
            )));
        }
        if let Some(t) = l.trace {
            l.table.check_trace(t)?;
        }
        let out_slots = l.out.len() as u64 / l.out_words.max(1) as u64;
        let args = Args::new()
            .buf(&l.table.tasks)
            .buf(&l.table.offsets)
            .u32(l.table.ctas)
            .buf(l.scratch)
            .buf(l.epoch)
            .u32(l.tags.launches_per_step())
            .u32(l.launch_index)
            .buf(l.inputs)
            .buf(l.step)
            .buf(l.out)
            .u32(out_slots.min(u32::MAX as u64) as u32)
            .u32(l.out_words)
            .buf(l.diag)
            .u64(l.trace.map_or(0, |t| t.device_ptr()));
        Ok(stream.launch(
            &self.kernel,
            Launch::new(l.table.ctas, SYNTHETIC_BLOCK),
            &args,
        )?)
    }

    /// Enqueues one advance of the step word.
    pub fn advance_step(&self, stream: &Stream, step: &Buffer<u32>) -> Result<()> {
        Ok(stream.launch(
            &self.step_counter,
            Launch::new(1, 32),
            &Args::new().buf(step),
        )?)
    }
}

/// A traced synthetic launch as the host reads it back.
#[derive(Clone, Debug)]
pub struct TracedLaunch {
    /// [`RECORD_WORDS`] words per task of the table (`trace::decode` reads them).
    pub trace: Vec<u64>,
    /// The launch's output words (as [`SynthDag::outputs`] gathers them on the CPU).
    pub outputs: Vec<u32>,
    /// The diagnostics words (all zero unless a debug wait gave up).
    pub diag: Vec<u32>,
    /// The traced launch by events.
    pub kernel_ms: f32,
}

impl SyntheticKernel {
    /// Runs `placement` of `dag` twice as the two launches of one step on `inputs` (so the traced
    /// second one finds the module loaded and the table in cache) and returns the second's trace.
    /// Only a kernel from [`SyntheticKernel::build_traced`] writes the records.
    pub fn run_traced(
        &self,
        dev: &Device,
        dag: &SynthDag,
        placement: &ValidPlacement,
        inputs: &[u32],
    ) -> Result<TracedLaunch> {
        if inputs.len() < dag.input_words as usize {
            return Err(GpuError::Shape(format!(
                "the DAG reads {} input words; {} given",
                dag.input_words,
                inputs.len()
            )));
        }
        let table = DeviceTable::upload(dev, placement)?;
        let scratch = dev.alloc_zeroed::<u64>(dag.layout.boxes().max(1) as usize)?;
        let epoch = dev.alloc_zeroed::<u32>(1)?;
        let step = dev.alloc_zeroed::<u32>(1)?;
        let input_buf = dev.upload(inputs)?;
        let out_words = dag.out_words.max(1);
        let out = dev.alloc_zeroed::<u32>(2 * out_words as usize)?;
        let diag = dev.alloc_zeroed::<u32>(DIAG_WORDS)?;
        let trace = table.trace_buffer(dev)?;
        let tags = Tags::new(2).map_err(|e| GpuError::Shape(e.to_string()))?;
        let stream = dev.new_stream()?;
        let (t0, t1) = (dev.timer()?, dev.timer()?);
        for index in 0..2 {
            let launch = SyntheticLaunch {
                table: &table,
                scratch: &scratch,
                epoch: &epoch,
                tags,
                launch_index: index,
                inputs: &input_buf,
                step: &step,
                out: &out,
                out_words,
                diag: &diag,
                trace: (index == 1).then_some(&trace),
            };
            if index == 1 {
                t0.record(&stream)?;
            }
            self.launch(&stream, &launch)?;
        }
        t1.record(&stream)?;
        stream.sync()?;
        let mut outputs = out.download()?;
        outputs.drain(..out_words as usize);
        outputs.truncate(dag.out_words as usize);
        Ok(TracedLaunch {
            trace: trace.download()?,
            outputs,
            diag: diag.download()?,
            kernel_ms: t0.elapsed_ms(&t1)?,
        })
    }
}

/// One measurement of the latency ring.
#[derive(Clone, Debug, PartialEq)]
pub struct RingResult {
    pub ctas: u32,
    pub distinct_sms: usize,
    pub row_words: u32,
    /// Hops timed by the in-kernel clock (those after every CTA started).
    pub timed_hops: u64,
    pub ns_per_hop: f64,
    /// The whole kernel by events, launch included.
    pub kernel_ms: f32,
    /// Words (row values and payload) that arrived wrong.
    pub errors: u32,
}

/// The hand-off latency ring (`kernels/latency.hip`).
pub struct LatencyRing {
    kernel: Kernel,
    _module: Module,
}

impl LatencyRing {
    pub fn build(dev: &Device, variant: Variant) -> Result<Self> {
        let module = dev.build(
            &variant
                .apply(source(LATENCY_HIP))
                .define("MBX_LAT_ROW_MAX", ROW_MAX),
        )?;
        Ok(LatencyRing {
            kernel: module.kernel("mailbox_latency_ring")?,
            _module: module,
        })
    }

    /// Runs `rounds` times around a ring of `ctas` CTAs with rows of `row_words` boxes
    /// (1: one box that one thread waits for and puts, the bare hand-off; more: a tagged row that
    /// the block waits for), each hop also publishing `payload_words` plain words beside the box
    /// (publish/acquire, block-wide wait) when `row_words` is 1.
    pub fn run(
        &self,
        dev: &Device,
        ctas: u32,
        rounds: u32,
        row_words: u32,
        payload_words: u32,
    ) -> Result<RingResult> {
        let max = self.kernel.max_coresident_grid(LATENCY_BLOCK, 0)?;
        if ctas < 2 || ctas > max || rounds < 2 || !(1..=ROW_MAX).contains(&row_words) {
            return Err(GpuError::Shape(format!(
                "ring of {ctas} CTAs (2..={max} resident), {rounds} rounds (>= 2), rows of {row_words} (1..={ROW_MAX})"
            )));
        }
        let stride = ROW_MAX.div_ceil(BOXES_PER_LINE) * BOXES_PER_LINE;
        let boxes = dev.alloc_zeroed::<u64>((ctas * stride) as usize)?;
        let times = dev.alloc_zeroed::<u64>(2)?;
        let errors = dev.alloc_zeroed::<u32>(1)?;
        let sm_ids = dev.alloc_zeroed::<u32>(ctas as usize)?;
        let payload = dev.alloc_zeroed::<u32>((ctas * payload_words.max(1)) as usize)?;
        let diag = dev.alloc_zeroed::<u32>(DIAG_WORDS)?;
        let stream = dev.new_stream()?;
        let (t0, t1) = (dev.timer()?, dev.timer()?);
        let args = Args::new()
            .buf(&boxes)
            .u32(row_words)
            .u32(stride)
            .u32(rounds)
            .u32(1) // tag base: fresh zeroed boxes, so any nonzero base works
            .buf(&times)
            .buf(&errors)
            .buf(&sm_ids)
            .buf(&payload)
            .u32(payload_words)
            .buf(&diag);
        t0.record(&stream)?;
        stream.launch(&self.kernel, Launch::new(ctas, LATENCY_BLOCK), &args)?;
        t1.record(&stream)?;
        stream.sync()?;
        let t = times.download()?;
        let mut sms = sm_ids.download()?;
        sms.sort_unstable();
        sms.dedup();
        let timed_hops = (rounds as u64 * ctas as u64 - 1) - ctas as u64;
        Ok(RingResult {
            ctas,
            distinct_sms: sms.len(),
            row_words,
            timed_hops,
            ns_per_hop: t[1].saturating_sub(t[0]) as f64 / timed_hops as f64,
            kernel_ms: t0.elapsed_ms(&t1)?,
            errors: errors.download()?[0],
        })
    }
}
