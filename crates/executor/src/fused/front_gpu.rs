//! The front half's fused launch on a device: the built kernel ([`FrontKernel`]) and one step's
//! device buffers and task table ([`FrontLaunch`]): one cooperative launch of one CTA a SM, the
//! epoch node before it, as the standalone stages launch. A kernel built with the list reader
//! ([`FrontOptions::readers`]) runs graphs from [`FrontGraph::with_readers`] and keeps what the
//! readers saw ([`FrontLaunch::read_copies`]); one built with task records writes each launch's
//! timeline ([`FrontLaunch::trace`]).

use super::front::{front_source_with, reader_stage, FrontBuild, FrontError, FrontGraph, MAX_ROWS};
use super::{CtaShape, FitError, FusedKernel};
use crate::step::LaunchSlot;
use device::{Args, Buffer, Device, DeviceError, Kernel, Launch, Module, Stream};
use indexer::gpu::{inv_freq, Grid, KernelConfig, PlanBuffers, StageArgs, StageBuffers};
use indexer::layout::CacheLayout;
use indexer::reference::IndexerDims;
use mailbox::gpu::{DeviceTable, EpochNode, LaunchTable, Variant};
use mailbox::layout::Tags;
use mailbox::trace::{self, Trace, TraceError};
use mailbox::{Stage, Stall, DIAG_WORDS};
use model::ModelConfig;
use select::gpu::{SelArgs, Shape as SelectShape, FLAG_NAMES};
use select::layout::TopK;
use select::reference::RowPages;
use std::marker::PhantomData;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum FrontGpuError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Fit(#[from] FitError),
    #[error(transparent)]
    Mailbox(#[from] mailbox::gpu::GpuError),
    #[error(transparent)]
    Indexer(#[from] indexer::IndexerError),
    #[error(transparent)]
    Front(#[from] FrontError),
    #[error("{0}")]
    Shape(String),
    #[error("the fused launch stalled: {0}")]
    Stalled(Stall),
    #[error("select row {row}: {what}")]
    Flagged { row: usize, what: &'static str },
    #[error(transparent)]
    Trace(#[from] TraceError),
}

pub type Result<T, E = FrontGpuError> = std::result::Result<T, E>;

/// The kernel's name in messages.
const NAME: &str = "the front half's fused kernel";

/// A sabotage a test builds in to show that its check catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrontFault {
    /// Select tasks read the scores without waiting on the runs' completion boxes
    /// (`SEL_FAULT_SKIP_WAIT`): they read what the previous launch left.
    SelectSkipsWait,
    /// The list readers copy the lists without waiting on the rows' list boxes
    /// (`LIST_READER_FAULT`): they read what the previous launch left.
    ReaderSkipsWait,
}

/// How a front kernel is built, besides the model config.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrontOptions {
    pub variant: Variant,
    pub fault: Option<FrontFault>,
    /// With the list reader's stage after select's: runs graphs from
    /// [`FrontGraph::with_readers`].
    pub readers: bool,
    /// Task records (`MBX_TRACE`): every launch writes its timeline.
    pub trace: bool,
}

/// The list reader's buffers, in the byte layout of `struct list_reader_args`
/// (`kernels/list_reader.h`): the kernel argument after select's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ReaderArgs {
    pub lists: u64,
    pub copy: u64,
    pub k: u32,
    pub pad: u32,
}

/// The built fused kernel of the front half, and its epoch node.
pub struct FrontKernel {
    // Declared before the module: a kernel must not outlive its module.
    kernel: Kernel,
    epoch: EpochNode,
    _module: Module,
    shape: CtaShape,
    ctas: u32,
    config: KernelConfig,
    top: TopK,
    variant: Variant,
    readers: bool,
    trace: bool,
}

impl FrontKernel {
    /// Builds the kernel for `cfg`'s indexer (the device's production scorer,
    /// [`KernelConfig::production`]: FP8 queries on wgmma at GLM-5's shape on sm_90a, bf16 queries
    /// on the mma path at other shapes and targets) and k, and checks that one CTA of the fused
    /// shape is resident on every SM at once.
    pub fn build(
        dev: &Device,
        cfg: &ModelConfig,
        variant: Variant,
        fault: Option<FrontFault>,
    ) -> Result<Self> {
        Self::build_with(
            dev,
            cfg,
            FrontOptions {
                variant,
                fault,
                readers: fault == Some(FrontFault::ReaderSkipsWait),
                trace: false,
            },
        )
    }

    /// [`Self::build`] with the list reader or task records.
    pub fn build_with(dev: &Device, cfg: &ModelConfig, options: FrontOptions) -> Result<Self> {
        let FrontOptions {
            variant,
            fault,
            readers,
            trace,
        } = options;
        let readers = readers || fault == Some(FrontFault::ReaderSkipsWait);
        let shape = CtaShape::of_device(dev, NAME)?;
        let config = KernelConfig::production(cfg, &dev.info().arch)?;
        let top = TopK::of(cfg)
            .and_then(TopK::for_kernels)
            .map_err(|_| FrontError::BadTopK(cfg.index_topk))?;
        let more = if readers {
            vec![reader_stage()]
        } else {
            vec![]
        };
        let mut source = front_source_with(shape, config.stage_kernel(), top, variant, &more)?;
        match fault {
            Some(FrontFault::SelectSkipsWait) => source = source.define("SEL_FAULT", 1),
            Some(FrontFault::ReaderSkipsWait) => source = source.define("LIST_READER_FAULT", 1),
            None => {}
        }
        if trace {
            source = trace::traced(source).define("SEL_TRACE", 1);
        }
        let select_lds = SelectShape::production(top)
            .map_err(|e| FrontError::Select(e.to_string()))?
            .lds_bytes();
        let need = config.score_lds_bytes().max(select_lds);
        let ctas = dev.info().multiprocessors;
        let FusedKernel {
            kernel,
            module,
            shape,
        } = FusedKernel::build(dev, NAME, &source, shape, need, ctas)?;
        Ok(FrontKernel {
            kernel,
            epoch: EpochNode::build(dev, variant)?,
            _module: module,
            shape,
            ctas,
            config,
            top,
            variant,
            readers,
            trace,
        })
    }

    /// What a step's graph is planned for on this kernel, over a cache of `cache_pages` pages.
    pub fn build_info(&self, cache_pages: u32) -> FrontBuild {
        FrontBuild {
            ctas: self.ctas,
            cache_pages,
            max_rows: MAX_ROWS,
        }
    }

    pub fn top(&self) -> TopK {
        self.top
    }

    pub fn dims(&self) -> IndexerDims {
        self.config.dims
    }

    /// The indexer's build: its scorer, and the reference options of the numbers it computes
    /// ([`KernelConfig::options`]).
    pub fn indexer(&self) -> KernelConfig {
        self.config
    }
}

/// A step's per-row inputs and the index-key cache (read and written by the launch).
pub struct FrontInputs<'a> {
    /// `[rows][head_dim]` bf16 bits: W_k x̂.
    pub key_proj: &'a Buffer<u16>,
    /// `[rows][heads * head_dim]` bf16 bits: W_qb c^Q.
    pub query_proj: &'a Buffer<u16>,
    /// `[rows][heads]`: W_w x̂.
    pub gates: &'a Buffer<f32>,
    pub norm_weight: &'a Buffer<f32>,
    pub norm_bias: &'a Buffer<f32>,
    pub cache: &'a Buffer<u8>,
}

/// One step's launch: its graph, task table and buffers. Holds the addresses of `'a`'s inputs.
pub struct FrontLaunch<'a> {
    pub graph: FrontGraph,
    /// The indexer's plan, with the page table that the indexer and select both read.
    plan: PlanBuffers,
    table: DeviceTable,
    pub scores: Buffer<f32>,
    pub out: Buffer<i32>,
    flags: Buffer<u32>,
    _inv_freq: Buffer<f64>,
    scratch: Arc<Buffer<u64>>,
    epoch: Arc<Buffer<u32>>,
    diag: Buffer<u32>,
    tags: Tags,
    launch_index: u32,
    idx: StageArgs,
    sel: SelArgs,
    /// What the list readers saw, `[rows][k]` (a kernel with the reader's stage).
    copies: Option<Buffer<i32>>,
    reader: ReaderArgs,
    records: Option<Buffer<u64>>,
    select_marks: Option<Buffer<u64>>,
    _inputs: PhantomData<&'a ()>,
}

impl<'a> FrontLaunch<'a> {
    /// Uploads `graph`'s tables and makes the step's buffers, after checking the inputs' sizes:
    /// the only launch of its step, with an epoch word and scratch of its own.
    pub fn new(
        dev: &Device,
        kernel: &FrontKernel,
        graph: FrontGraph,
        inputs: &FrontInputs<'a>,
    ) -> Result<Self> {
        let slot = LaunchSlot {
            epoch: Arc::new(dev.alloc_zeroed(1)?),
            scratch: Arc::new(dev.alloc_zeroed(graph.layout.boxes().max(1) as usize)?),
            tags: Tags::new(1).map_err(|e| FrontGpuError::Shape(e.to_string()))?,
            launch_index: 0,
        };
        Self::in_step(dev, kernel, graph, inputs, &slot)
    }

    /// The same as launch `slot.launch_index` of a step of several, tagging its boxes in the
    /// step's scratch by the step's epoch.
    pub fn in_step(
        dev: &Device,
        kernel: &FrontKernel,
        graph: FrontGraph,
        inputs: &FrontInputs<'a>,
        slot: &LaunchSlot,
    ) -> Result<Self> {
        if slot.scratch.len() < graph.layout.boxes() as usize {
            return Err(FrontGpuError::Shape(format!(
                "the launch's boxes take {} words of scratch; the step has {}",
                graph.layout.boxes(),
                slot.scratch.len()
            )));
        }
        let dims = kernel.config.dims;
        let cache = CacheLayout::new(dims.head_dim as u32)?;
        let cache_pages = (inputs.cache.len() as u64 / cache.page_bytes()) as u32;
        if let Some(&page) = graph.pages.flat().iter().find(|&&p| p >= cache_pages) {
            return Err(FrontGpuError::Shape(format!(
                "the page table names page {page}; the cache holds {cache_pages}"
            )));
        }
        if graph.top != kernel.top {
            return Err(FrontGpuError::Shape(format!(
                "the graph selects {} a row; the kernel was built for {}",
                graph.top.k(),
                kernel.top.k()
            )));
        }
        let has_readers = graph
            .placement
            .placement()
            .tasks()
            .any(|(_, t)| t.stage_bits() == Stage::Synthetic as u32);
        if has_readers && !kernel.readers {
            return Err(FrontGpuError::Shape(
                "the graph has list readers; the kernel was built without their stage".into(),
            ));
        }
        let rows = graph.lens.len();
        let stride = graph.plan.stride as usize;
        let grid = Grid {
            ctas: kernel.ctas,
            boxes: graph.boxes.indexer,
            scratch_boxes: graph.layout.boxes(),
        };
        let plan = PlanBuffers::upload(dev, &graph.plan, &graph.pages, &grid)?;
        let table = DeviceTable::upload(dev, &graph.placement)?;
        let scores = dev.alloc_zeroed(rows * stride)?;
        let out = dev.alloc_zeroed(rows * graph.top.k() as usize)?;
        let flags = dev.alloc_zeroed(rows * FLAG_NAMES.len())?;
        // Select maps its rows' positions to cache slots through the indexer's page table (the
        // plan's rows, requests and page list): check that each row's request has its keys' pages.
        let requests = graph.row_requests();
        RowPages {
            table: &graph.pages,
            requests: &requests,
        }
        .check(&graph.lens)
        .map_err(|e| FrontGpuError::Shape(e.to_string()))?;
        let inv_freq = dev.upload(&inv_freq(&dims))?;
        let (scratch, epoch, tags) = (slot.scratch.clone(), slot.epoch.clone(), slot.tags);
        let diag = dev.alloc_zeroed(DIAG_WORDS)?;
        let idx = StageBuffers {
            key_proj: inputs.key_proj,
            norm_weight: inputs.norm_weight,
            norm_bias: inputs.norm_bias,
            query_proj: inputs.query_proj,
            gates: inputs.gates,
            inv_freq: &inv_freq,
            plan: &plan,
            cache_read: inputs.cache,
            cache_write: inputs.cache,
            scores: &scores,
            scratch: &scratch,
            epoch: &epoch,
            diag: &diag,
            trace: None,
            tags,
            launch_index: slot.launch_index,
            boxes: graph.boxes.indexer,
        }
        .args(&dims)?;
        let (records, select_marks) = if kernel.trace {
            let marks = dev.alloc_zeroed(2 * select::gpu::TRACE_MARKS)?;
            (Some(table.trace_buffer(dev)?), Some(marks))
        } else {
            (None, None)
        };
        let sel = SelArgs {
            scores: scores.device_ptr(),
            page_list: plan.pages.device_ptr(),
            page_rows: plan.rows.device_ptr(),
            page_requests: plan.requests.device_ptr(),
            out: out.device_ptr(),
            flags: flags.device_ptr(),
            trace: select_marks.as_ref().map_or(0, |m| m.device_ptr()),
            stride: stride as u32,
            hist_offset: graph.boxes.select.hist.offset(),
            cand_offset: graph.boxes.select.cand.offset(),
            cand_stride: graph.boxes.select.cand.stride(),
            in_stride: graph.boxes.indexer.run.stride(),
            gang_stride: graph.boxes.select.gang.stride(),
        };
        let copies = if kernel.readers {
            Some(dev.alloc_zeroed(rows * graph.top.k() as usize)?)
        } else {
            None
        };
        let reader = ReaderArgs {
            lists: out.device_ptr(),
            copy: copies.as_ref().map_or(0, |c| c.device_ptr()),
            k: graph.top.k(),
            pad: 0,
        };
        Ok(FrontLaunch {
            graph,
            plan,
            table,
            scores,
            out,
            flags,
            _inv_freq: inv_freq,
            scratch,
            epoch,
            diag,
            tags,
            launch_index: slot.launch_index,
            idx,
            sel,
            copies,
            reader,
            records,
            select_marks,
            _inputs: PhantomData,
        })
    }

    /// Moves the rows to `positions` (one a row, in the plan's order) for the launches that follow,
    /// as the step's position slice moves them between replays: the graph stays as planned, and
    /// the indexer masks each row's keys past its position with -inf, which select never picks.
    /// Each row at most at the position it was planned at (its scores and pages cover no more),
    /// and a request's rows at consecutive positions, as the kernels read them.
    pub fn set_positions(&self, positions: &[u32]) -> Result<()> {
        let rows = &self.graph.plan.rows;
        if positions.len() != rows.len() {
            return Err(FrontGpuError::Shape(format!(
                "{} positions for a launch of {} rows",
                positions.len(),
                rows.len()
            )));
        }
        for (r, (row, &position)) in rows.iter().zip(positions).enumerate() {
            if position > row.position {
                return Err(FrontGpuError::Shape(format!(
                    "row {r} at position {position}: it was planned at {}, and its scores and \
                     pages reach no further",
                    row.position
                )));
            }
            if r > 0 && rows[r - 1].request == row.request && positions[r - 1] + 1 != position {
                return Err(FrontGpuError::Shape(format!(
                    "rows {} and {r} of request {} are at positions {} and {position}, not \
                     consecutive ones",
                    r - 1,
                    row.request,
                    positions[r - 1]
                )));
            }
        }
        self.plan.positions.write(positions)?;
        Ok(())
    }

    /// The epoch node, then the one fused launch (a graph capture records both).
    pub fn enqueue(&self, kernel: &FrontKernel, stream: &Stream) -> Result<()> {
        kernel
            .epoch
            .enqueue(stream, &self.epoch, &self.scratch, self.tags)?;
        self.enqueue_launch(kernel, stream)
    }

    /// The fused launch alone: in a step of several, the step's epoch node runs once before all.
    pub fn enqueue_launch(&self, kernel: &FrontKernel, stream: &Stream) -> Result<()> {
        let mut table = LaunchTable::new(
            &self.table,
            &self.scratch,
            &self.epoch,
            &self.diag,
            self.tags,
            self.launch_index,
        )?;
        if let Some(records) = &self.records {
            table = table.with_trace(&self.table, records)?;
        }
        let launch = Launch::new(self.table.ctas, kernel.shape.threads)
            .shared(kernel.shape.shared_bytes)
            .cooperative();
        let mut args = Args::new().value(&table).value(&self.idx).value(&self.sel);
        if kernel.readers {
            args = args.value(&self.reader);
        }
        stream.launch(&kernel.kernel, launch, &args)?;
        Ok(())
    }

    /// The launch's mailbox scratch: the boxes of [`FrontGraph::boxes`], where the key and query
    /// tasks publish each row's key and query.
    pub fn scratch(&self) -> &Buffer<u64> {
        &self.scratch
    }

    /// What the list readers copied, `[rows][k]`; `None` from a kernel without readers.
    pub fn read_copies(&self) -> Result<Option<Vec<i32>>> {
        Ok(self.copies.as_ref().map(|c| c.download()).transpose()?)
    }

    /// The marks of the last launch's traced select task (row 0's, its first slice's): each
    /// (`SEL_PH_*` phase, its SM's cycle count) as stamped, the first (`start`) when its wait on
    /// the scores ended; empty from a kernel built without task records.
    pub fn select_marks(&self) -> Result<Vec<(u32, u64)>> {
        let Some(marks) = &self.select_marks else {
            return Ok(Vec::new());
        };
        Ok(marks
            .download()?
            .chunks(2)
            .take_while(|m| m[1] != 0)
            .map(|m| (m[0] as u32, m[1]))
            .collect())
    }

    /// The last launch's task records as a timeline; `None` from a kernel built without them.
    pub fn trace(&self) -> Result<Option<Trace>> {
        let Some(records) = &self.records else {
            return Ok(None);
        };
        let words = records.download()?;
        Ok(Some(trace::decode(
            &self.graph.placement.placement().table(),
            &words,
        )?))
    }

    /// The lists `[rows][k]` (cache slots, then -1), or the first stall or flag a task reported.
    pub fn read(&self, kernel: &FrontKernel) -> Result<Vec<i32>> {
        let diag = self.diag.download()?;
        let limit = kernel.variant.debug.map_or(0, |d| u64::from(d.poll_limit));
        if let Some((stall, _)) = Stall::from_diag(&diag, limit) {
            return Err(FrontGpuError::Stalled(stall));
        }
        let flags = self.flags.download()?;
        if let Some(i) = flags.iter().position(|&f| f != 0) {
            return Err(FrontGpuError::Flagged {
                row: i / FLAG_NAMES.len(),
                what: FLAG_NAMES[i % FLAG_NAMES.len()],
            });
        }
        Ok(self.out.download()?)
    }

    /// Zeroes the lists and the error words (between checks that must not see old results).
    pub fn clear(&self) -> Result<()> {
        self.out.zero()?;
        self.flags.zero()?;
        self.diag.zero()?;
        Ok(())
    }
}
