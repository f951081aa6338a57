//! Host side of the standalone kernels (`kernels/indexer.hip`): sources and build-time choices, the
//! device copies of a score plan, the launch arguments, and the two entry points.

use bytemuck::{Pod, Zeroable};
use device::{Args, Buffer, Device, Kernel, KernelSource, Launch, Module, Stream};
use mailbox::gpu::Variant;
use mailbox::layout::Tags;
use model::numerics::{rope_inv_freq, RopeStyle};

use crate::error::{shape, IndexerError, Result};
use crate::layout::{
    GroupDesc, IndexerBoxes, PageTable, RequestDesc, Row, RunDesc, ScorePlan, MAX_GROUP_ROWS,
    PAGE_TOKENS,
};
use crate::reference::{IndexerDims, IndexerOptions, VectorFormat};

pub const INDEXER_HIP: (&str, &str) = ("indexer.hip", include_str!("../kernels/indexer.hip"));
/// The headers `indexer.hip` includes (besides the prelude and `mailbox.h`).
pub const HEADERS: [(&str, &str); 6] = [
    ("idx_common.h", include_str!("../kernels/idx_common.h")),
    ("idx_key.h", include_str!("../kernels/idx_key.h")),
    ("idx_query.h", include_str!("../kernels/idx_query.h")),
    ("idx_tile.h", include_str!("../kernels/idx_tile.h")),
    ("idx_score.h", include_str!("../kernels/idx_score.h")),
    (
        "idx_score_ring.h",
        include_str!("../kernels/idx_score_ring.h"),
    ),
];
/// Threads of every indexer CTA (`IDX_BLOCK`).
pub const BLOCK: u32 = 256;
/// Pages a scoring CTA takes at once, one a warpgroup under wgmma (`IDX_BATCH_PAGES`).
const BATCH_PAGES: u32 = 2;
/// Pages of each warpgroup in the wgmma scorer's LDS ring by default: one scored, two in flight
/// (83.5 KiB of LDS a CTA). Measured on the H200 against 2 and 4 (crates/indexer/PERF.md): 3 was
/// as fast as the best of them or within 0.5 us in every case but the chains of 4 and 8 rows,
/// where 2 wins by 1-2 us and loses 3-30 us on single rows and separate requests.
pub const RING: u32 = 3;

/// Build-time choices of the kernels: the shape and the variant switches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelConfig {
    pub dims: IndexerDims,
    pub rope: RopeStyle,
    pub hadamard: bool,
    /// How queries are published and scored: [`VectorFormat::Bf16`] (keys widened to f16 in LDS,
    /// every target) or [`VectorFormat::Fp8`] (E4M3 with a power-of-two scale per head, scored on
    /// FP8 matrix units: NVIDIA only, `IDX_FP8_QUERY`).
    pub query: VectorFormat,
    /// Score on wgmma (`IDX_WGMMA`, kernels/idx_score_ring.h): NVIDIA sm_90a, FP8 queries, 32
    /// heads of 128 (GLM-5's indexer). Otherwise mma.sync (NVIDIA) or MFMA (AMD).
    pub wgmma: bool,
    /// Pages of each warpgroup in the wgmma scorer's LDS ring (`IDX_RING`, at least 2): the one
    /// being scored and those in flight. Up to 4 leave room for two CTAs a SM.
    pub ring: u32,
    /// Test only: scorers patch only their own group's new keys (the poison check's negative control).
    pub patch_group_only: bool,
    /// Test only: an overlapped scoring launch writes scores without waiting for the kernel before
    /// it (the overlap check's negative control).
    pub skip_prior_wait: bool,
    /// The wgmma scorer stamps its phases into [`StageBuffers::trace`] (`IDX_TRACE`; read with
    /// [`crate::trace`]). Off outside benchmarks: the stamps cost time and move code.
    pub trace: bool,
    pub mailbox: Variant,
}

impl KernelConfig {
    /// The kernels compute [`IndexerOptions::kernels`]-style numbers (q bf16, k FP8) or
    /// [`IndexerOptions::deepseek`]-style ones (q and k FP8). Other formats are the reference's alone.
    pub fn new(dims: IndexerDims, opts: &IndexerOptions) -> Result<Self> {
        if opts.query == VectorFormat::F32 || opts.key != VectorFormat::Fp8 {
            return Err(shape(
                "indexer kernels",
                format!(
                    "they publish q as bf16 or FP8 and cache k as FP8; asked for q {:?}, k {:?}",
                    opts.query, opts.key
                ),
            ));
        }
        Ok(KernelConfig {
            dims,
            rope: opts.rope,
            hadamard: opts.hadamard,
            query: opts.query,
            wgmma: false,
            ring: RING,
            patch_group_only: false,
            skip_prior_wait: false,
            trace: false,
            mailbox: Variant::default(),
        })
    }

    /// The reference options that describe what these kernels compute.
    pub fn options(&self) -> IndexerOptions {
        IndexerOptions {
            rope: self.rope,
            hadamard: self.hadamard,
            query: self.query,
            key: VectorFormat::Fp8,
            bf16_projections: true,
        }
    }

    /// The wgmma scorer's shape limits, as an error before any compile.
    pub fn check(&self) -> Result<()> {
        let d = &self.dims;
        let most = TASK_PAGES / BATCH_PAGES;
        if self.wgmma && !(2..=most).contains(&self.ring) {
            return Err(shape(
                "wgmma scoring",
                format!(
                    "its LDS ring holds 2 to {most} pages a warpgroup (the first fill's page ids \
                     come with the task); asked for {}",
                    self.ring
                ),
            ));
        }
        if self.wgmma && (self.query != VectorFormat::Fp8 || d.heads != 32 || d.head_dim != 128) {
            return Err(shape(
                "wgmma scoring",
                format!(
                    "it takes FP8 queries of 32 heads x 128; asked for {:?} queries of {} heads x {}",
                    self.query, d.heads, d.head_dim
                ),
            ));
        }
        Ok(())
    }

    /// Dynamic shared memory of a scoring CTA: the wgmma scorer's query tiles and LDS ring
    /// (`IDX_RING_LDS_BYTES` of kernels/idx_score_ring.h, which checks it against this); none for
    /// the other methods.
    pub fn score_lds_bytes(&self) -> u32 {
        if !self.wgmma {
            return 0;
        }
        let (heads, head_dim) = (self.dims.heads as u32, self.dims.head_dim as u32);
        let kib = |bytes: u32| bytes.div_ceil(1024) * 1024;
        let query_tiles = MAX_GROUP_ROWS * heads * head_dim * 2;
        let weights = kib(MAX_GROUP_ROWS * heads * 4);
        let slot = BATCH_PAGES * PAGE_TOKENS * (head_dim + 4);
        1024 + query_tiles + weights + self.ring * slot
    }

    pub fn source(&self) -> KernelSource {
        let d = &self.dims;
        self.mailbox
            .apply(indexer_source())
            .define("IDX_HEADS", d.heads)
            .define("IDX_HEAD_DIM", d.head_dim)
            .define("IDX_ROPE_DIM", d.rope_dim)
            .define(
                "IDX_ROPE_INTERLEAVED",
                u32::from(self.rope == RopeStyle::Interleaved),
            )
            .define("IDX_HADAMARD", u32::from(self.hadamard))
            .define("IDX_FP8_QUERY", u32::from(self.query == VectorFormat::Fp8))
            .define("IDX_BLOCK", BLOCK)
            .define("IDX_BATCH_PAGES", BATCH_PAGES)
            .define("IDX_GROUP_ROWS", MAX_GROUP_ROWS)
            .define("IDX_WGMMA", u32::from(self.wgmma))
            .define("IDX_RING", self.ring)
            .define("IDX_TASK_PAGES", TASK_PAGES)
            .define("IDX_SCORE_LDS_BYTES", self.score_lds_bytes())
            .define("IDX_PATCH_GROUP_ONLY", u32::from(self.patch_group_only))
            .define("IDX_SKIP_PRIOR_WAIT", u32::from(self.skip_prior_wait))
            .define("IDX_TRACE", u32::from(self.trace))
    }
}

/// `indexer.hip` with every header it includes, and no defines (the kernels' defaults are GLM-5's).
fn indexer_source() -> KernelSource {
    HEADERS
        .iter()
        .fold(mailbox::gpu::source(INDEXER_HIP), |src, (name, text)| {
            src.header(*name, *text)
        })
}

/// Every kernel source of the crate with its default (GLM-5) defines, for build checks.
pub fn sources() -> Vec<KernelSource> {
    vec![indexer_source()]
}

/// Pages of a run whose physical ids travel in its [`RunTask`] (`IDX_TASK_PAGES`): the wgmma
/// scorer's first ring fill (RING batches of BATCH_PAGES) needs no page-list load.
pub const TASK_PAGES: u32 = 8;

/// What a scoring CTA reads first (`idx_run_task`): its run with the run's group and request, and
/// the physical ids of its first [`TASK_PAGES`] pages (0 past the run), so it starts its copies
/// after one load instead of a chain of four dependent ones.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct RunTask {
    pub run: RunDesc,
    pub group: GroupDesc,
    pub request: RequestDesc,
    pub first_pages: [u32; TASK_PAGES as usize],
}

impl RunTask {
    pub fn of(plan: &ScorePlan, pages: &PageTable) -> Vec<RunTask> {
        plan.runs
            .iter()
            .map(|&run| {
                let group = plan.groups[run.group as usize];
                let request = plan.requests[group.request as usize];
                let mut first_pages = [0; TASK_PAGES as usize];
                for (i, id) in first_pages
                    .iter_mut()
                    .enumerate()
                    .take(run.n_pages as usize)
                {
                    *id = pages.flat()[(request.page_offset + run.first_page) as usize + i];
                }
                RunTask {
                    run,
                    group,
                    request,
                    first_pages,
                }
            })
            .collect()
    }
}

/// `idx_args` of `kernels/idx_common.h`, field for field: 17 addresses then 10 words, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct LaunchArgs {
    pub key_proj: u64,
    pub norm_weight: u64,
    pub norm_bias: u64,
    pub query_proj: u64,
    pub gates: u64,
    pub inv_freq: u64,
    pub rows: u64,
    pub requests: u64,
    pub tasks: u64,
    pub page_list: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub scores: u64,
    pub scratch: u64,
    pub epoch: u64,
    pub diag: u64,
    pub trace: u64,
    pub launches_per_step: u32,
    pub launch_index: u32,
    pub n_rows: u32,
    pub n_runs: u32,
    pub stride: u32,
    pub key_box_offset: u32,
    pub key_box_stride: u32,
    pub query_box_offset: u32,
    pub query_box_stride: u32,
    pub weight_scale: f32,
}

/// A score plan and its page table in device memory.
pub struct PlanBuffers {
    pub rows: Buffer<Row>,
    pub requests: Buffer<RequestDesc>,
    pub tasks: Buffer<RunTask>,
    pub pages: Buffer<u32>,
    pub n_rows: u32,
    pub n_runs: u32,
    pub stride: u32,
}

impl PlanBuffers {
    pub fn upload(dev: &Device, plan: &ScorePlan, pages: &PageTable) -> Result<Self> {
        // A zero-length buffer cannot be allocated on every backend; a page list is never empty
        // for a valid plan, but keep the guard in one place.
        let flat = if pages.flat().is_empty() {
            vec![0]
        } else {
            pages.flat().to_vec()
        };
        Ok(PlanBuffers {
            rows: dev.upload(&plan.rows)?,
            requests: dev.upload(&plan.requests)?,
            tasks: dev.upload(&RunTask::of(plan, pages))?,
            pages: dev.upload(&flat)?,
            n_rows: plan.rows.len() as u32,
            n_runs: plan.runs.len() as u32,
            stride: plan.stride,
        })
    }
}

/// Everything one launch reads and writes.
pub struct StageBuffers<'a> {
    /// `[rows][head_dim]` bf16 bits: W_k x̂.
    pub key_proj: &'a Buffer<u16>,
    pub norm_weight: &'a Buffer<f32>,
    pub norm_bias: &'a Buffer<f32>,
    /// `[rows][heads * head_dim]` bf16 bits: W_qb c^Q.
    pub query_proj: &'a Buffer<u16>,
    /// `[rows][heads]`: W_w x̂.
    pub gates: &'a Buffer<f32>,
    /// From [`inv_freq`].
    pub inv_freq: &'a Buffer<f64>,
    pub plan: &'a PlanBuffers,
    pub cache_read: &'a Buffer<u8>,
    /// The same buffer as `cache_read`, except in the poison check.
    pub cache_write: &'a Buffer<u8>,
    /// `[rows][stride]`.
    pub scores: &'a Buffer<f32>,
    pub scratch: &'a Buffer<u64>,
    pub epoch: &'a Buffer<u32>,
    /// `mailbox::DIAG_WORDS` words, zeroed.
    pub diag: &'a Buffer<u32>,
    /// Where a trace build's scorer writes its marks ([`crate::trace::words`] for the plan's runs);
    /// `None` writes none.
    pub trace: Option<&'a Buffer<u64>>,
    pub tags: Tags,
    pub launch_index: u32,
    pub boxes: IndexerBoxes,
}

/// The rope frequencies the kernels read: the reference's own f64 values.
pub fn inv_freq(dims: &IndexerDims) -> Vec<f64> {
    rope_inv_freq(dims.rope_dim, dims.rope_theta)
}

impl StageBuffers<'_> {
    /// The arguments, after checking every buffer against the plan and the shapes.
    pub fn args(&self, dims: &IndexerDims) -> Result<LaunchArgs> {
        let rows = self.plan.n_rows as usize;
        let need = |what: &str, have: usize, want: usize| -> Result<()> {
            if have < want {
                return Err(shape(
                    "indexer launch",
                    format!("{what} holds {have} values; the launch needs {want}"),
                ));
            }
            Ok(())
        };
        need("key_proj", self.key_proj.len(), rows * dims.head_dim)?;
        need("norm_weight", self.norm_weight.len(), dims.head_dim)?;
        need("norm_bias", self.norm_bias.len(), dims.head_dim)?;
        need(
            "query_proj",
            self.query_proj.len(),
            rows * dims.heads * dims.head_dim,
        )?;
        need("gates", self.gates.len(), rows * dims.heads)?;
        need("inv_freq", self.inv_freq.len(), dims.rope_dim / 2)?;
        need(
            "scores",
            self.scores.len(),
            rows * self.plan.stride as usize,
        )?;
        need("diag", self.diag.len(), mailbox::DIAG_WORDS)?;
        if let Some(trace) = self.trace {
            need("trace", trace.len(), crate::trace::words(self.plan.n_runs))?;
        }
        need("epoch", self.epoch.len(), 1)?;
        if self.cache_read.len() != self.cache_write.len() {
            return Err(shape(
                "indexer launch",
                "the cache read and the cache written differ in size",
            ));
        }
        let (key, query) = (self.boxes.key, self.boxes.query);
        if key.slots() < self.plan.n_rows || query.slots() < self.plan.n_rows {
            return Err(shape(
                "indexer launch",
                format!(
                    "the boxes hold {} rows; the launch has {}",
                    key.slots().min(query.slots()),
                    self.plan.n_rows
                ),
            ));
        }
        let boxes_end = u64::from(key.offset() + key.slots() * key.stride())
            .max(u64::from(query.offset() + query.slots() * query.stride()));
        need("scratch", self.scratch.len(), boxes_end as usize)?;
        Ok(LaunchArgs {
            key_proj: self.key_proj.device_ptr(),
            norm_weight: self.norm_weight.device_ptr(),
            norm_bias: self.norm_bias.device_ptr(),
            query_proj: self.query_proj.device_ptr(),
            gates: self.gates.device_ptr(),
            inv_freq: self.inv_freq.device_ptr(),
            rows: self.plan.rows.device_ptr(),
            requests: self.plan.requests.device_ptr(),
            tasks: self.plan.tasks.device_ptr(),
            page_list: self.plan.pages.device_ptr(),
            cache_read: self.cache_read.device_ptr(),
            cache_write: self.cache_write.device_ptr(),
            scores: self.scores.device_ptr(),
            scratch: self.scratch.device_ptr(),
            epoch: self.epoch.device_ptr(),
            diag: self.diag.device_ptr(),
            trace: self.trace.map_or(0, |t| t.device_ptr()),
            launches_per_step: self.tags.launches_per_step(),
            launch_index: self.launch_index,
            n_rows: self.plan.n_rows,
            n_runs: self.plan.n_runs,
            stride: self.plan.stride,
            key_box_offset: key.offset(),
            key_box_stride: key.stride(),
            query_box_offset: query.offset(),
            query_box_stride: query.stride(),
            weight_scale: dims.weight_scale() as f32,
        })
    }
}

/// The built entry points.
pub struct IndexerKernels {
    // Declared before the module: a kernel must not outlive its module.
    launch: Kernel,
    score: Kernel,
    _module: Module,
    dims: IndexerDims,
    lds_bytes: u32,
    overlap_prior: bool,
}

impl IndexerKernels {
    pub fn build(dev: &Device, config: &KernelConfig) -> Result<Self> {
        config.check()?;
        let module = dev.build(&config.source())?;
        Ok(IndexerKernels {
            launch: module.kernel("indexer_launch")?,
            score: module.kernel("indexer_score")?,
            _module: module,
            dims: config.dims,
            lds_bytes: config.score_lds_bytes(),
            overlap_prior: false,
        })
    }

    /// Whether [`IndexerKernels::score`] launches may start while the kernel before them on the
    /// stream still runs (CUDA's programmatic dependent launch; HIP launches as usual). Such a
    /// launch reads its tasks, page lists and cached pages, and waits on the tagged pairs, before
    /// that kernel has finished, and waits for it only before writing scores: so the kernel right
    /// before must not write the plan or the pages this launch reads, other than this launch's
    /// own new keys (the pairs replace those). Off by default.
    pub fn set_overlapping(&mut self, on: bool) {
        self.overlap_prior = on;
    }

    pub fn overlapping(&self) -> bool {
        self.overlap_prior
    }

    /// The most runs a whole-stage launch of `rows` rows may plan: its grid (keys, queries,
    /// runs) must be resident at once.
    pub fn max_runs(&self, rows: u32) -> Result<u32> {
        let resident = self.launch.max_coresident_grid(BLOCK, self.lds_bytes)?;
        resident
            .checked_sub(2 * rows)
            .filter(|&runs| runs > 0)
            .ok_or_else(|| {
                shape(
                    "indexer launch",
                    format!("{rows} rows leave no resident CTA for scoring ({resident} resident)"),
                )
            })
    }

    /// The whole stage in one cooperative launch: keys, queries, then scoring that waits on them.
    pub fn launch(&self, stream: &Stream, buffers: &StageBuffers) -> Result<()> {
        let args = buffers.args(&self.dims)?;
        let grid = 2 * args.n_rows + args.n_runs;
        let launch = Launch::new(grid, BLOCK)
            .shared(self.lds_bytes)
            .cooperative();
        stream
            .launch(&self.launch, launch, &Args::new().value(&args))
            .map_err(IndexerError::from)
    }

    /// Scoring alone. The scratch must already hold this launch's queries and new keys (an
    /// earlier [`IndexerKernels::launch`] with the same tag).
    pub fn score(&self, stream: &Stream, buffers: &StageBuffers) -> Result<()> {
        let args = buffers.args(&self.dims)?;
        let mut launch = Launch::new(args.n_runs, BLOCK).shared(self.lds_bytes);
        if self.overlap_prior {
            launch = launch.overlap_prior();
        }
        stream
            .launch(&self.score, launch, &Args::new().value(&args))
            .map_err(IndexerError::from)
    }
}
