//! Host side of the standalone entry point (`kernels/indexer.hip`): sources and build-time choices,
//! the device copies of a score plan and its task lists, the stage's arguments, and the launches.

use bytemuck::{Pod, Zeroable};
use device::{Args, Buffer, Device, Kernel, KernelSource, Launch, Module, Stream};
use mailbox::gpu::{DeviceTable, LaunchTable, Variant};
use mailbox::layout::Tags;
use mailbox::Limits as PlacementLimits;
use model::numerics::{rope_inv_freq, RopeStyle};
use model::paging::{PageTable, PAGE_TOKENS};
use model::ModelConfig;

use crate::error::{shape, IndexerError, Result};
use crate::layout::{
    max_runs, stage_placement, GroupDesc, IndexerBoxes, RequestDesc, Row, RunDesc, ScorePlan,
    StageTasks, MAX_GROUP_ROWS, RUNS_PER_SCORE_TASK,
};
use crate::reference::{IndexerDims, IndexerOptions, VectorFormat};

pub const INDEXER_HIP: (&str, &str) = ("indexer.hip", include_str!("../kernels/indexer.hip"));
/// The headers `indexer.hip` includes (besides the prelude, the ops layer and `mailbox.h`).
pub const HEADERS: [(&str, &str); 7] = [
    ("idx_common.h", include_str!("../kernels/idx_common.h")),
    ("idx_key.h", include_str!("../kernels/idx_key.h")),
    ("idx_query.h", include_str!("../kernels/idx_query.h")),
    ("idx_tile.h", include_str!("../kernels/idx_tile.h")),
    ("idx_score.h", include_str!("../kernels/idx_score.h")),
    (
        "idx_score_ring.h",
        include_str!("../kernels/idx_score_ring.h"),
    ),
    ("idx_tasks.h", include_str!("../kernels/idx_tasks.h")),
];
/// Threads of a CTA (`MONO_CTA_THREADS`): the fused launch's shape, one CTA a SM, 128 registers a
/// thread (`__launch_bounds__(512, 1)`). The scorer runs two runs a CTA in it, each on 256 threads
/// as the two CTAs a SM of its own shape did (PERF.md, "The fused shape").
pub const CTA_THREADS: u32 = 512;
/// The one shape the wgmma scorer is written for (heads, head dim): GLM-5's indexer.
const WGMMA_SHAPE: (usize, usize) = (32, 128);
/// Head dims the kernels build for (`IDX_LANE_DIMS` 2 or 4 of kernels/idx_common.h; the mma
/// path's k-groups, `IDX_HEAD_DIM % 64` in kernels/idx_tile.h).
const MMA_HEAD_DIMS: [usize; 2] = [64, 128];
/// Heads the mma path builds for: a group's rows times its head tiles of 16 (NVIDIA) are at most
/// a run team's waves (kernels/idx_score.h).
const MMA_MAX_HEADS: usize = 32;
/// Pages a run's team takes at once, one a warpgroup under wgmma (`IDX_BATCH_PAGES`).
const BATCH_PAGES: u32 = 2;
/// Pages of each warpgroup in the wgmma scorer's LDS ring by default: one scored, two in flight
/// (83.5 KiB of LDS a run). Measured on the H200 against 2 and 4 (crates/indexer/PERF.md): 3 was
/// as fast as the best of them or within 0.5 us in every case but the chains of 4 and 8 rows,
/// where 2 wins by 1-2 us and loses 3-30 us on single rows and separate requests.
pub const RING: u32 = 3;

/// A sabotage a test builds in to show that a check catches it (`MONO_FAULT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Scorers patch only their own group's new keys (the poison check's negative control).
    PatchGroupOnly,
    /// An overlapped launch writes scores without waiting for the kernel before it (the overlap
    /// check's negative control).
    SkipPriorWait,
}

impl Fault {
    /// The `MONO_FAULT_IDX_*` value of `kernels/idx_common.h`.
    fn define(self) -> u32 {
        match self {
            Fault::PatchGroupOnly => 101,
            Fault::SkipPriorWait => 102,
        }
    }
}

/// Build-time choices of the kernels: the shape and the variant switches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelConfig {
    pub dims: IndexerDims,
    pub rope: RopeStyle,
    pub hadamard: bool,
    /// How queries are published, which picks the scorer: [`VectorFormat::Bf16`] for the mma path
    /// (keys widened to f16 in LDS, mma.sync on NVIDIA, MFMA on AMD), [`VectorFormat::Fp8`] (E4M3
    /// with a power-of-two scale per head) for wgmma (`IDX_WGMMA`, kernels/idx_score_ring.h):
    /// NVIDIA sm_90a, 32 heads of 128 (GLM-5's indexer).
    pub query: VectorFormat,
    /// Pages of each warpgroup in the wgmma scorer's LDS ring (`IDX_RING`, at least 2): the one
    /// being scored and those in flight.
    pub ring: u32,
    /// A fault built in on purpose (tests only).
    pub fault: Option<Fault>,
    /// The wgmma scorer stamps its phases into [`StageBuffers::trace`] (`IDX_TRACE`; read with
    /// [`crate::trace`]). Off outside benchmarks: the stamps cost time and move code.
    pub trace: bool,
    pub mailbox: Variant,
}

impl KernelConfig {
    /// The kernels compute [`IndexerOptions::kernels`]-style numbers (q bf16, k FP8; the mma
    /// path) or [`IndexerOptions::deepseek`]-style ones (q and k FP8; wgmma). Other formats are
    /// the reference's alone.
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
        if opts.hadamard && !dims.head_dim.is_power_of_two() {
            return Err(shape(
                "indexer kernels",
                format!(
                    "the Hadamard rotation (`IndexerOptions::hadamard`) needs a power-of-two \
                     head dim; asked for {}",
                    dims.head_dim
                ),
            ));
        }
        Ok(KernelConfig {
            dims,
            rope: opts.rope,
            hadamard: opts.hadamard,
            query: opts.query,
            ring: RING,
            fault: None,
            trace: false,
            mailbox: Variant::default(),
        })
    }

    /// The production scorer of `cfg`'s indexer on `target` (a compile target: `sm_90a`,
    /// `gfx950`, or `host`, the host backend's): at GLM-5's shape (32 heads x 128) on sm_90a, FP8
    /// queries on wgmma ([`IndexerOptions::deepseek`]); at any other shape or target, bf16 queries
    /// on the mma path ([`IndexerOptions::kernels`]: mma.sync, MFMA, or the host's mma stand-in).
    /// An error names a shape neither builds for ([`KernelConfig::check`]).
    pub fn production(cfg: &ModelConfig, target: &str) -> Result<Self> {
        let dims = IndexerDims::new(cfg)?;
        let wgmma = target == "sm_90a" && (dims.heads, dims.head_dim) == WGMMA_SHAPE;
        let opts = if wgmma {
            IndexerOptions::deepseek(cfg)
        } else {
            IndexerOptions::kernels(cfg)
        };
        let config = KernelConfig::new(dims, &opts)?;
        config.check()?;
        Ok(config)
    }

    /// Whether this configuration scores on wgmma (FP8 queries).
    pub fn wgmma(&self) -> bool {
        self.query == VectorFormat::Fp8
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

    /// The scorers' shape limits (the wgmma scorer's ring and shape, the head dims and head counts
    /// every scorer builds for), as an error before any compile.
    pub fn check(&self) -> Result<()> {
        let d = &self.dims;
        let most = TASK_PAGES / BATCH_PAGES;
        if self.wgmma() && !(2..=most).contains(&self.ring) {
            return Err(shape(
                "wgmma scoring",
                format!(
                    "its LDS ring holds 2 to {most} pages a warpgroup (the first fill's page ids \
                     come with the task); asked for {}",
                    self.ring
                ),
            ));
        }
        if self.wgmma() && (d.heads, d.head_dim) != WGMMA_SHAPE {
            return Err(shape(
                "wgmma scoring",
                format!(
                    "it takes FP8 queries of 32 heads x 128; asked for {} heads x {}",
                    d.heads, d.head_dim
                ),
            ));
        }
        if !MMA_HEAD_DIMS.contains(&d.head_dim) {
            return Err(shape(
                "indexer kernels",
                format!(
                    "a head is 64 or 128 dims (a wave holds it at 2 or 4 a lane, the mma path's \
                     k-groups read whole 16-byte chunks); asked for {}",
                    d.head_dim
                ),
            ));
        }
        if d.heads > MMA_MAX_HEADS {
            return Err(shape(
                "indexer kernels",
                format!(
                    "at most {MMA_MAX_HEADS} heads (on mma.sync each of a group's {MAX_GROUP_ROWS} \
                     rows takes a wave per 16 heads, of a run team's 8); asked for {}",
                    d.heads
                ),
            ));
        }
        Ok(())
    }

    /// Dynamic shared memory of a CTA (`IDX_LDS_BYTES`): a run team's LDS, whole KiB, for each of
    /// the CTA's run teams. wgmma: its query tiles, weights and LDS ring (`IDX_RUN_LDS_BYTES` of
    /// kernels/idx_score_ring.h); the mma path: `idx_score_smem` at its largest (NVIDIA's head
    /// groups). The kernels check it against their need.
    pub fn score_lds_bytes(&self) -> u32 {
        let (heads, head_dim) = (self.dims.heads as u32, self.dims.head_dim as u32);
        let kib = |bytes: u32| bytes.div_ceil(1024) * 1024;
        let batch_tokens = BATCH_PAGES * PAGE_TOKENS;
        let team = if self.wgmma() {
            let query_tiles = MAX_GROUP_ROWS * heads * head_dim * 2;
            let weights = kib(MAX_GROUP_ROWS * heads * 4);
            let slot = BATCH_PAGES * PAGE_TOKENS * (head_dim + 4);
            1024 + query_tiles + weights + self.ring * slot
        } else {
            let keys_words = batch_tokens * head_dim * 2 / 4;
            let query_words = heads * head_dim / 2 + heads;
            let words = (keys_words + batch_tokens).max(MAX_GROUP_ROWS * query_words);
            let partial = 2 * heads.div_ceil(16) * MAX_GROUP_ROWS * batch_tokens;
            kib(4 * (words.div_ceil(4) * 4 + partial))
        };
        RUNS_PER_SCORE_TASK * team
    }

    pub fn source(&self) -> KernelSource {
        let d = &self.dims;
        let src = self
            .mailbox
            .apply(indexer_source())
            .define("IDX_HEADS", d.heads)
            .define("IDX_HEAD_DIM", d.head_dim)
            .define("IDX_ROPE_DIM", d.rope_dim)
            .define(
                "IDX_ROPE_INTERLEAVED",
                u32::from(self.rope == RopeStyle::Interleaved),
            )
            .define("IDX_HADAMARD", u32::from(self.hadamard))
            .define("IDX_GROUP_ROWS", MAX_GROUP_ROWS)
            .define("IDX_WGMMA", u32::from(self.wgmma()))
            .define("IDX_RING", self.ring)
            .define("IDX_TASK_PAGES", TASK_PAGES)
            .define("IDX_PAGE_TOKENS", PAGE_TOKENS)
            .define("IDX_LDS_BYTES", self.score_lds_bytes())
            .define("IDX_TRACE", u32::from(self.trace))
            .define("MONO_CTA_THREADS", CTA_THREADS);
        match self.fault {
            None => src,
            Some(f) => src.define("MONO_FAULT", f.define()),
        }
    }
}

impl KernelConfig {
    /// What the fused kernel's generator takes from this stage: the headers, `idx_args`,
    /// `idx_decode` and the shape defines of [`KernelConfig::source`] (the launch sets the CTA's
    /// thread count and the mailbox's variant).
    pub fn stage_kernel(&self) -> mailbox::StageKernel {
        let defines = self
            .source()
            .defines()
            .iter()
            .filter(|(name, _)| name.as_str() != "MONO_CTA_THREADS" && !name.starts_with("MBX_"))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        mailbox::StageKernel {
            stage: mailbox::Stage::Indexer,
            include: "idx_tasks.h",
            headers: HEADERS.to_vec(),
            args_type: "idx_args",
            decoder: "idx_decode",
            defines,
        }
    }
}

/// The production configuration's stage for the fused kernel: GLM-5's shape, each target's
/// scorer (`IDX_WGMMA` set to `MONO_NVIDIA`, as [`sources`]).
pub fn stage_kernel() -> mailbox::StageKernel {
    let cfg = ModelConfig::preset("glm-5").expect("the GLM-5 preset exists");
    stage_kernel_for(&cfg).expect("GLM-5's indexer builds")
}

/// The stage for the fused kernel at `cfg`'s indexer shape, one source for every target, each
/// running its production scorer ([`KernelConfig::production`] of that target says which, and
/// the numbers it computes): at GLM-5's shape `IDX_WGMMA` is `MONO_NVIDIA` (wgmma with FP8
/// queries on sm_90a, the mma path with bf16 queries on gfx950 and the host backend); at any
/// other shape the mma path on every target.
pub fn stage_kernel_for(cfg: &ModelConfig) -> Result<mailbox::StageKernel> {
    let config = KernelConfig::production(cfg, "sm_90a")?;
    let mut stage = config.stage_kernel();
    if config.wgmma() {
        stage
            .defines
            .insert("IDX_WGMMA".into(), "MONO_NVIDIA".into());
    }
    Ok(stage)
}

/// `indexer.hip` with every header it includes, and no defines.
fn indexer_source() -> KernelSource {
    HEADERS
        .iter()
        .fold(mailbox::gpu::source(INDEXER_HIP), |src, (name, text)| {
            src.header(*name, *text)
        })
}

/// Every kernel source of the crate in its production configuration, for the kernel table: GLM-5's
/// shape, each target's scorer (wgmma on NVIDIA, MFMA on AMD: `IDX_WGMMA` set to `MONO_NVIDIA`).
pub fn sources() -> Vec<KernelSource> {
    let cfg = ModelConfig::preset("glm-5").expect("the GLM-5 preset exists");
    let dims = IndexerDims::new(&cfg).expect("GLM-5's indexer dims");
    let wgmma = KernelConfig::new(dims, &IndexerOptions::deepseek(&cfg)).expect("FP8 q and k");
    vec![wgmma.source().define("IDX_WGMMA", "MONO_NVIDIA")]
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

/// `idx_args` of `kernels/idx_common.h`, field for field: 15 addresses then 8 words, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct StageArgs {
    pub key_proj: u64,
    pub norm_weight: u64,
    pub norm_bias: u64,
    pub query_proj: u64,
    pub gates: u64,
    pub inv_freq: u64,
    pub rows: u64,
    /// `[rows]` u32: each row's position this step. The kernels read the rows' positions from
    /// here alone (rope, the new keys' slots, the -inf past each row), so a launch's task lists
    /// hold for any positions its pages allow.
    pub positions: u64,
    pub requests: u64,
    pub runs: u64,
    pub page_list: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub scores: u64,
    pub trace: u64,
    pub stride: u32,
    pub key_box_offset: u32,
    pub key_box_stride: u32,
    pub query_box_offset: u32,
    pub query_box_stride: u32,
    pub run_box_offset: u32,
    pub run_box_stride: u32,
    pub weight_scale: f32,
}

/// A score plan, its page table and its task lists in device memory.
pub struct PlanBuffers {
    pub rows: Buffer<Row>,
    /// The rows' positions (`StageArgs::positions`), as the plan has them.
    pub positions: Buffer<u32>,
    pub requests: Buffer<RequestDesc>,
    pub runs: Buffer<RunTask>,
    pub pages: Buffer<u32>,
    /// The stage's step: keys, queries, scoring ([`StageTasks::Whole`]).
    pub whole: DeviceTable,
    /// Scoring alone ([`StageTasks::ScoreOnly`]).
    pub score_only: DeviceTable,
    pub n_rows: u32,
    pub n_runs: u32,
    pub stride: u32,
}

/// Where a launch's tasks go: its CTAs and its scratch.
#[derive(Clone, Copy, Debug)]
pub struct Grid {
    pub ctas: u32,
    pub boxes: IndexerBoxes,
    /// Boxes in the launch's scratch.
    pub scratch_boxes: u32,
}

impl PlanBuffers {
    /// Uploads the plan with its two task lists, each checked by the placement rule first.
    pub fn upload(dev: &Device, plan: &ScorePlan, pages: &PageTable, grid: &Grid) -> Result<Self> {
        // A zero-length buffer cannot be allocated on every backend; a page list is never empty
        // for a valid plan, but keep the guard in one place.
        let flat = if pages.flat().is_empty() {
            vec![0]
        } else {
            pages.flat().to_vec()
        };
        let limits = PlacementLimits {
            max_resident: grid.ctas,
            scratch_boxes: grid.scratch_boxes,
        };
        let table = |which| -> Result<DeviceTable> {
            let placement = stage_placement(plan, &grid.boxes, grid.ctas, which)?
                .check(limits)
                .map_err(|e| shape("indexer tasks", e.to_string()))?;
            DeviceTable::upload(dev, &placement).map_err(|e| shape("indexer tasks", e.to_string()))
        };
        Ok(PlanBuffers {
            rows: dev.upload(&plan.rows)?,
            positions: dev.upload(&plan.rows.iter().map(|r| r.position).collect::<Vec<_>>())?,
            requests: dev.upload(&plan.requests)?,
            runs: dev.upload(&RunTask::of(plan, pages))?,
            pages: dev.upload(&flat)?,
            whole: table(StageTasks::Whole)?,
            score_only: table(StageTasks::ScoreOnly)?,
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
    /// The stage's arguments, after checking every buffer against the plan and the shapes.
    pub fn args(&self, dims: &IndexerDims) -> Result<StageArgs> {
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
        let (key, query, run) = (self.boxes.key, self.boxes.query, self.boxes.run);
        if key.slots() < self.plan.n_rows
            || query.slots() < self.plan.n_rows
            || run.slots() < self.plan.n_runs
        {
            return Err(shape(
                "indexer launch",
                format!(
                    "the boxes hold {} rows and {} runs; the launch has {} and {}",
                    key.slots().min(query.slots()),
                    run.slots(),
                    self.plan.n_rows,
                    self.plan.n_runs
                ),
            ));
        }
        let end = |offset: u32, slots: u32, stride: u32| u64::from(offset + slots * stride);
        let boxes_end = end(key.offset(), key.slots(), key.stride())
            .max(end(query.offset(), query.slots(), query.stride()))
            .max(end(run.offset(), run.slots(), run.stride()));
        need("scratch", self.scratch.len(), boxes_end as usize)?;
        Ok(StageArgs {
            key_proj: self.key_proj.device_ptr(),
            norm_weight: self.norm_weight.device_ptr(),
            norm_bias: self.norm_bias.device_ptr(),
            query_proj: self.query_proj.device_ptr(),
            gates: self.gates.device_ptr(),
            inv_freq: self.inv_freq.device_ptr(),
            rows: self.plan.rows.device_ptr(),
            positions: self.plan.positions.device_ptr(),
            requests: self.plan.requests.device_ptr(),
            runs: self.plan.runs.device_ptr(),
            page_list: self.plan.pages.device_ptr(),
            cache_read: self.cache_read.device_ptr(),
            cache_write: self.cache_write.device_ptr(),
            scores: self.scores.device_ptr(),
            trace: self.trace.map_or(0, |t| t.device_ptr()),
            stride: self.plan.stride,
            key_box_offset: key.offset(),
            key_box_stride: key.stride(),
            query_box_offset: query.offset(),
            query_box_stride: query.stride(),
            run_box_offset: run.offset(),
            run_box_stride: run.stride(),
            weight_scale: dims.weight_scale() as f32,
        })
    }

    /// The task-list arguments of `table` under this launch's tag.
    fn table(&self, table: &DeviceTable) -> Result<LaunchTable> {
        LaunchTable::new(
            table,
            self.scratch,
            self.epoch,
            self.diag,
            self.tags,
            self.launch_index,
        )
        .map_err(|e| shape("indexer launch", e.to_string()))
    }
}

/// The built entry point.
pub struct IndexerKernels {
    // Declared before the module: a kernel must not outlive its module.
    tasks: Kernel,
    _module: Module,
    dims: IndexerDims,
    lds_bytes: u32,
    ctas: u32,
    overlap_prior: bool,
}

impl IndexerKernels {
    /// Builds the entry point and checks that one CTA a SM of it is resident at once.
    pub fn build(dev: &Device, config: &KernelConfig) -> Result<Self> {
        config.check()?;
        let module = dev.build(&config.source())?;
        let tasks = module.kernel("indexer_tasks")?;
        let lds_bytes = config.score_lds_bytes();
        let ctas = dev.info().multiprocessors;
        let resident = tasks.max_coresident_grid(CTA_THREADS, lds_bytes)?;
        if resident < ctas {
            return Err(shape(
                "indexer kernels",
                format!("{resident} CTAs of {CTA_THREADS} threads are resident at once; the launch needs one on each of {ctas} multiprocessors"),
            ));
        }
        Ok(IndexerKernels {
            tasks,
            _module: module,
            dims: config.dims,
            lds_bytes,
            ctas,
            overlap_prior: false,
        })
    }

    /// CTAs of a launch: one a multiprocessor.
    pub fn ctas(&self) -> u32 {
        self.ctas
    }

    /// Whether [`IndexerKernels::score`] launches may start while the kernel before them on the
    /// stream still runs (CUDA's programmatic dependent launch; HIP launches as usual). Such a
    /// launch is scheduled early and waits for that kernel before its first task. Off by default.
    pub fn set_overlapping(&mut self, on: bool) {
        self.overlap_prior = on;
    }

    pub fn overlapping(&self) -> bool {
        self.overlap_prior
    }

    /// The most runs a whole-stage launch of `rows` rows may plan.
    pub fn max_runs(&self, rows: u32) -> Result<u32> {
        max_runs(self.ctas, rows).ok_or_else(|| {
            shape(
                "indexer launch",
                format!(
                    "{rows} rows leave no CTA for scoring ({} in a launch)",
                    self.ctas
                ),
            )
        })
    }

    /// The layout of a launch's tasks over `boxes` in a scratch of `scratch_boxes`.
    pub fn grid(&self, boxes: IndexerBoxes, scratch_boxes: u32) -> Grid {
        Grid {
            ctas: self.ctas,
            boxes,
            scratch_boxes,
        }
    }

    fn run(
        &self,
        stream: &Stream,
        buffers: &StageBuffers,
        table: &DeviceTable,
        launch: Launch,
    ) -> Result<()> {
        let args = buffers.args(&self.dims)?;
        let table = buffers.table(table)?;
        stream
            .launch(&self.tasks, launch, &Args::new().value(&table).value(&args))
            .map_err(IndexerError::from)
    }

    /// The whole stage in one cooperative launch: keys, queries, then scoring that waits on them.
    pub fn launch(&self, stream: &Stream, buffers: &StageBuffers) -> Result<()> {
        let table = &buffers.plan.whole;
        let launch = Launch::new(table.ctas, CTA_THREADS)
            .shared(self.lds_bytes)
            .cooperative();
        self.run(stream, buffers, table, launch)
    }

    /// Scoring alone. The scratch must already hold this launch's queries and new keys (an
    /// earlier [`IndexerKernels::launch`] with the same tag).
    pub fn score(&self, stream: &Stream, buffers: &StageBuffers) -> Result<()> {
        let table = &buffers.plan.score_only;
        let mut launch = Launch::new(table.ctas, CTA_THREADS).shared(self.lds_bytes);
        if self.overlap_prior {
            launch = launch.overlap_prior();
        }
        self.run(stream, buffers, table, launch)
    }
}
