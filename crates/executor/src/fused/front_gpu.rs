//! The front half's fused launch on a device: the built kernel ([`FrontKernel`]) and one step's
//! device buffers and task table ([`FrontLaunch`]): one cooperative launch of one CTA a SM, the
//! epoch node before it, as the standalone stages launch.

use super::front::{front_source, FrontBuild, FrontError, FrontGraph, MAX_ROWS};
use super::{CtaShape, ENTRY};
use crate::step::LaunchSlot;
use device::{Args, Buffer, Device, DeviceError, Kernel, Launch, Module, Stream};
use indexer::gpu::{inv_freq, Grid, KernelConfig, PlanBuffers, StageArgs, StageBuffers};
use indexer::layout::{CacheLayout, PAGE_TOKENS};
use indexer::reference::{IndexerDims, IndexerOptions};
use mailbox::gpu::{DeviceTable, EpochNode, LaunchTable, Variant};
use mailbox::layout::Tags;
use mailbox::{Stall, DIAG_WORDS};
use model::ModelConfig;
use select::gpu::{SelArgs, Shape as SelectShape, FLAG_NAMES};
use select::layout::TopK;
use std::marker::PhantomData;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum FrontGpuError {
    #[error(transparent)]
    Device(#[from] DeviceError),
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
}

pub type Result<T, E = FrontGpuError> = std::result::Result<T, E>;

/// A sabotage a test builds in to show that its check catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrontFault {
    /// Select tasks read the scores without waiting on the runs' completion boxes
    /// (`SEL_FAULT_SKIP_WAIT`): they read what the previous launch left.
    SelectSkipsWait,
}

/// The built fused kernel of the front half, and its epoch node.
pub struct FrontKernel {
    // Declared before the module: a kernel must not outlive its module.
    kernel: Kernel,
    epoch: EpochNode,
    _module: Module,
    shape: CtaShape,
    ctas: u32,
    dims: IndexerDims,
    top: TopK,
    variant: Variant,
}

impl FrontKernel {
    /// Builds the kernel for `cfg`'s indexer (FP8 queries on wgmma) and k, and checks that one CTA
    /// of the fused shape is resident on every SM at once.
    pub fn build(
        dev: &Device,
        cfg: &ModelConfig,
        variant: Variant,
        fault: Option<FrontFault>,
    ) -> Result<Self> {
        let shape = CtaShape::for_device(dev.info()).ok_or_else(|| {
            FrontGpuError::Shape(format!("no fused CTA shape for {}", dev.info().arch))
        })?;
        let dims = IndexerDims::new(cfg)?;
        let config = KernelConfig::new(dims, &IndexerOptions::deepseek(cfg))?;
        config.check()?;
        let top = u32::try_from(cfg.index_topk)
            .ok()
            .and_then(|k| TopK::new(k).ok())
            .ok_or(FrontError::BadTopK(cfg.index_topk))?;
        let mut source = front_source(shape, config.stage_kernel(), top, variant)?;
        if fault == Some(FrontFault::SelectSkipsWait) {
            source = source.define("SEL_FAULT", 1);
        }
        let module = dev.build(&source)?;
        let kernel = module.kernel(ENTRY)?;
        // The CTA's shared memory less what the kernel declares statically (a debug build's
        // report words), and at least what every stage's tasks take.
        let fixed = kernel.resources()?.shared_bytes;
        let shape = CtaShape {
            shared_bytes: shape
                .shared_bytes
                .min(dev.info().max_shared_per_block.saturating_sub(fixed)),
            ..shape
        };
        let select_lds = SelectShape::production(top)
            .map_err(|e| FrontError::Select(e.to_string()))?
            .lds_bytes();
        let need = config.score_lds_bytes().max(select_lds);
        if shape.shared_bytes < need {
            return Err(FrontGpuError::Shape(format!(
                "the stages' tasks take {need} bytes of shared memory; a CTA of this kernel gets {}",
                shape.shared_bytes
            )));
        }
        let ctas = dev.info().multiprocessors;
        let resident = kernel.max_coresident_grid(shape.threads, shape.shared_bytes)?;
        if resident < ctas {
            return Err(FrontGpuError::Shape(format!(
                "{resident} CTAs of {} threads and {} bytes of shared memory are resident at once; the launch needs one on each of {ctas} SMs",
                shape.threads, shape.shared_bytes
            )));
        }
        Ok(FrontKernel {
            kernel,
            epoch: EpochNode::build(dev, variant)?,
            _module: module,
            shape,
            ctas,
            dims,
            top,
            variant,
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
        self.dims
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
    _plan: PlanBuffers,
    table: DeviceTable,
    pub scores: Buffer<f32>,
    pub out: Buffer<i32>,
    flags: Buffer<u32>,
    _pages: Buffer<i32>,
    _inv_freq: Buffer<f64>,
    scratch: Arc<Buffer<u64>>,
    epoch: Arc<Buffer<u32>>,
    diag: Buffer<u32>,
    tags: Tags,
    launch_index: u32,
    idx: StageArgs,
    sel: SelArgs,
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
        let dims = kernel.dims;
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
        let pages_stride = stride / PAGE_TOKENS as usize;
        let mut table_rows = vec![0i32; rows * pages_stride];
        for (i, row) in graph.plan.rows.iter().enumerate() {
            for (p, &id) in graph
                .pages
                .pages(row.request as usize)
                .iter()
                .take(pages_stride)
                .enumerate()
            {
                table_rows[i * pages_stride + p] = id as i32;
            }
        }
        let pages = dev.upload(&table_rows)?;
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
        let sel = SelArgs {
            scores: scores.device_ptr(),
            pages: pages.device_ptr(),
            out: out.device_ptr(),
            flags: flags.device_ptr(),
            trace: 0,
            stride: stride as u32,
            pages_stride: pages_stride as u32,
            hist_offset: graph.boxes.select.hist.offset(),
            cand_offset: graph.boxes.select.cand.offset(),
            cand_stride: graph.boxes.select.cand.stride(),
            in_stride: graph.boxes.indexer.run.stride(),
        };
        Ok(FrontLaunch {
            graph,
            _plan: plan,
            table,
            scores,
            out,
            flags,
            _pages: pages,
            _inv_freq: inv_freq,
            scratch,
            epoch,
            diag,
            tags,
            launch_index: slot.launch_index,
            idx,
            sel,
            _inputs: PhantomData,
        })
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
        let table = LaunchTable::new(
            &self.table,
            &self.scratch,
            &self.epoch,
            &self.diag,
            self.tags,
            self.launch_index,
        )?;
        let launch = Launch::new(self.table.ctas, kernel.shape.threads)
            .shared(kernel.shape.shared_bytes)
            .cooperative();
        let args = Args::new().value(&table).value(&self.idx).value(&self.sel);
        stream.launch(&kernel.kernel, launch, &args)?;
        Ok(())
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
