//! Host side of the select stage's standalone entry (`kernels/select.hip`): sources and builds,
//! a batch of rows in device memory with its one-stage task list ([`SelectPlan`]), enqueueing
//! the task-list launch, and reading the lists back with the tasks' error flags.

use crate::layout::{
    longest_slice, one_cta_room, reg_keys_per_thread, task_lds_bytes, LayoutError, SelectBoxes,
    SelectKind, SelectPlan, Slicing, TopK, H200_SHARED_PER_BLOCK, MAX_ROW_KEYS, MAX_SLICES,
    ONE_CTA_ROOM, PLACE_RUN, REG_MAX_ROW, REG_PRODUCTION_ROW, REG_RANK_BUCKET, REG_RANK_ROOM,
    REG_STAGE_ROOM, ROOM_PER_K, SLICE_ALIGN, SLICE_ROOM,
};
use crate::reference::{DevicePages, RowPages, Rows, SelectError};
use device::{Args, Buffer, Device, DeviceError, Kernel, KernelSource, Launch, Module, Stream};
use mailbox::gpu::{DeviceTable, EpochNode, LaunchTable, Variant};
use mailbox::layout::{ScratchLayout, Tags};
use mailbox::{Limits, Stall, DIAG_WORDS};
use model::paging::{PageRequest, PageRow, PAGE_TOKENS};
use model::Preset;

pub const SELECT_HIP: (&str, &str) = ("select.hip", include_str!("../kernels/select.hip"));
/// The headers of `select.hip`, which includes `select.h`; that includes the others in this order,
/// each of which includes the one before it.
pub const SELECT_HEADERS: [(&str, &str); 7] = [
    ("select.h", include_str!("../kernels/select.h")),
    ("select_shape.h", include_str!("../kernels/select_shape.h")),
    (
        "select_rounds.h",
        include_str!("../kernels/select_rounds.h"),
    ),
    ("select_place.h", include_str!("../kernels/select_place.h")),
    ("select_tasks.h", include_str!("../kernels/select_tasks.h")),
    ("select_regs.h", include_str!("../kernels/select_regs.h")),
    (
        "select_decode.h",
        include_str!("../kernels/select_decode.h"),
    ),
];

/// Threads of the fused launch's CTA (`MONO_CTA_THREADS`, ARCHITECTURE.md "Tasks, teams and placement": 512 on sm_90a and
/// gfx950), which every select task takes whole.
pub const CTA_THREADS: u32 = 512;

const _: () = assert!(
    ONE_CTA_ROOM <= PLACE_RUN * CTA_THREADS,
    "a thread places at most PLACE_RUN keys"
);
/// Error words per row (`SEL_FLAGS`), in the order of `SEL_FLAG_*`.
pub const FLAG_NAMES: [&str; 4] = [
    "a NaN score among the keys",
    "histograms that lost the k-th key (a kernel bug)",
    "a bounded wait that gave up (MBX_DEBUG)",
    "a slice empty or longer than the kernel's LDS room (a launch sized wrong)",
];

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Mailbox(#[from] mailbox::gpu::GpuError),
    #[error(transparent)]
    Boxes(#[from] mailbox::layout::LayoutError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Input(#[from] SelectError),
    #[error("the row stride {stride} is not a multiple of 4 (rows are read 16 bytes at a time)")]
    Stride { stride: usize },
    #[error(
        "the kernel was built for at most {built} keys per slice (or per row); row {row} needs {need}"
    )]
    Unfit { row: usize, need: u32, built: u32 },
    #[error(transparent)]
    Placement(#[from] mailbox::PlacementError),
    #[error("the batch was planned for the {planned} method, the selector is {built}")]
    OtherMethod {
        planned: &'static str,
        built: &'static str,
    },
    #[error("row {row}: the kernel reported {what}")]
    Flagged { row: usize, what: &'static str },
    #[error("the select launch stalled: {0}")]
    Stalled(Stall),
}

pub type Result<T, E = GpuError> = std::result::Result<T, E>;

/// Marks a traced CTA leaves (`SEL_TRACE_MARKS`), two words each: the phase, its SM's cycle count
/// (`mono_clock_cycles`).
pub const TRACE_MARKS: usize = 32;
/// The phases of a trace (`SEL_PH_*`), by number: each mark is stamped when the phase ends.
pub const PHASES: [&str; 13] = [
    "start",
    "keys loaded",
    "6-bit round",
    "above P placed, P's keys staged",
    "candidates received",
    "wide digit chosen",
    "list written",
    "list scanned",
    "counted",
    "gathered",
    "summed",
    "decided",
    "T ranked",
];

/// Which task kind runs the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// One CTA per row ([`SelectKind::OneCta`]).
    OneCta,
    /// A gang of up to 64 slices per row, one CTA each ([`SelectKind::Slice`]).
    MultiSlice,
    /// One CTA per row of at most [`REG_MAX_ROW`] keys, held in registers
    /// ([`SelectKind::Registers`]).
    Registers,
}

impl Method {
    /// The fastest kind measured on the H200 for rows of at most `max_len` keys in the 512-thread
    /// shape (PERF.md, "Now"): the registers task while it holds the rows (5.25 us at 8K x 4,
    /// where the one CTA takes 9.93), the multi-slice one past that.
    pub fn fastest_for(max_len: u32) -> Method {
        if max_len <= REG_MAX_ROW {
            Method::Registers
        } else {
            Method::MultiSlice
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Method::OneCta => "one-cta",
            Method::MultiSlice => "multi-slice",
            Method::Registers => "registers",
        }
    }

    pub fn kind(&self) -> SelectKind {
        match self {
            Method::OneCta => SelectKind::OneCta,
            Method::MultiSlice => SelectKind::Slice,
            Method::Registers => SelectKind::Registers,
        }
    }
}

/// What a build is specialised on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub top: TopK,
    /// `MONO_CTA_THREADS`: the CTA every task takes.
    pub threads: u32,
    /// `SEL_SLICE_KEYS`: keys one CTA keeps in LDS (a multiple of 4).
    pub slice_keys: u32,
    /// `SEL_REG_KEYS`: keys a thread of the registers task holds (a multiple of 4;
    /// [`reg_keys_per_thread`]).
    pub reg_keys: u32,
    /// `SEL_TRACE`: the CTA of row 0 that places the list stamps its phases ([`Batch::trace`]).
    pub trace: bool,
}

impl Shape {
    /// For rows of at most `max_len` keys on an H200: slices of up to [`SLICE_ROOM`] keys (the
    /// plan makes them longer than the target when a launch's rows would not fit its CTAs); the one
    /// CTA keeps a row in LDS up to [`crate::layout::ONE_CTA_ROOM`] keys and streams longer ones;
    /// the registers task holds rows up to [`REG_MAX_ROW`] keys (longer ones are an error).
    pub fn for_rows(method: Method, top: TopK, max_len: u32) -> Result<Shape> {
        Self::for_rows_within(method, top, max_len, H200_SHARED_PER_BLOCK)
    }

    /// As [`Shape::for_rows`] on a device with `shared_per_block` bytes of shared memory per
    /// block (`DeviceInfo::max_shared_per_block`): the one CTA's LDS rows are [`one_cta_room`].
    pub fn for_rows_within(
        method: Method,
        top: TopK,
        max_len: u32,
        shared_per_block: u32,
    ) -> Result<Shape> {
        let top = top.for_kernels()?;
        let need = match method {
            Method::MultiSlice => longest_slice(max_len)?.max(max_len.min(SLICE_ROOM)),
            Method::OneCta => max_len.min(one_cta_room(shared_per_block, top)),
            Method::Registers => 0,
        };
        // Other methods' builds still compile the registers task: the smallest shape.
        let reg_rows = if method == Method::Registers {
            max_len
        } else {
            0
        };
        Ok(Shape {
            top,
            threads: CTA_THREADS,
            slice_keys: need.div_ceil(SLICE_ALIGN).max(1) * SLICE_ALIGN,
            reg_keys: reg_keys_per_thread(reg_rows, CTA_THREADS)?,
            trace: false,
        })
    }

    /// The production build: every kind, slices and one-CTA rows of up to [`SLICE_ROOM`] keys,
    /// registers rows of up to [`REG_PRODUCTION_ROW`] keys (the kernel table's row).
    pub fn production(top: TopK) -> Result<Shape> {
        Ok(Shape {
            reg_keys: reg_keys_per_thread(REG_PRODUCTION_ROW, CTA_THREADS)?,
            ..Self::for_rows(Method::MultiSlice, top, MAX_ROW_KEYS)?
        })
    }

    /// Dynamic shared memory of a CTA (`SEL_LDS_BYTES`).
    pub fn lds_bytes(&self) -> u32 {
        task_lds_bytes(self.slice_keys, self.top, self.threads)
    }

    /// Keys a row may have for `method`, or the most a slice holds.
    fn holds(&self, method: Method) -> u32 {
        match method {
            Method::Registers => self.reg_keys * self.threads,
            Method::OneCta => MAX_ROW_KEYS,
            Method::MultiSlice => self.slice_keys,
        }
    }
}

/// The kernel source with this crate's headers, the shape and the mailbox variant as defines.
pub fn source(shape: Shape, variant: Variant) -> KernelSource {
    let src = with_headers(mailbox::gpu::source(SELECT_HIP))
        .define("MONO_CTA_THREADS", shape.threads)
        .define("SEL_K", shape.top.k())
        .define("SEL_ROOM_PER_K", ROOM_PER_K)
        .define("SEL_SLICE_KEYS", shape.slice_keys)
        .define("SEL_MAX_SLICES", MAX_SLICES)
        .define("SEL_SLICE_ALIGN", SLICE_ALIGN)
        .define("SEL_PAGE_TOKENS", PAGE_TOKENS)
        .define("SEL_LDS_BYTES", shape.lds_bytes())
        .define("SEL_REG_KEYS", shape.reg_keys)
        .define("SEL_REG_STAGE_ROOM", REG_STAGE_ROOM)
        .define("SEL_REG_RANK_ROOM", REG_RANK_ROOM)
        .define("SEL_REG_BUCKET", format!("{REG_RANK_BUCKET}u"))
        .define("SEL_TRACE", shape.trace as u32);
    variant.apply(src)
}

/// Every entry-point file of the crate in its production build, for the kernel build table.
pub fn sources() -> Vec<KernelSource> {
    let top = TopK::preset(Preset::Glm5).expect("GLM-5's k is within what select builds for");
    let shape = Shape::production(top).expect("the production shape is valid");
    vec![source(shape, Variant::default())]
}

/// What the fused kernel's generator takes from this stage for a build of `shape`: the headers,
/// `sel_args`, `sel_decode` and the shape defines of [`source`] (the launch sets the CTA's thread
/// count and the mailbox's variant).
pub fn stage_kernel(shape: Shape) -> mailbox::StageKernel {
    let defines = source(shape, Variant::default())
        .defines()
        .iter()
        .filter(|(name, _)| name.as_str() != "MONO_CTA_THREADS" && !name.starts_with("MBX_"))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    mailbox::StageKernel {
        stage: mailbox::Stage::Select,
        include: "select.h",
        headers: SELECT_HEADERS.to_vec(),
        args_type: "sel_args",
        decoder: "sel_decode",
        defines,
    }
}

fn with_headers(src: KernelSource) -> KernelSource {
    SELECT_HEADERS
        .iter()
        .fold(src, |src, &(name, text)| src.header(name, text))
}

/// A built select kernel, and the method its launches plan rows for.
pub struct Selector {
    // Declared before the module: a kernel must not outlive its module.
    kernel: Kernel,
    epoch: EpochNode,
    _module: Module,
    method: Method,
    shape: Shape,
    variant: Variant,
    ctas: u32,
    overlap_prior: bool,
}

impl Selector {
    pub fn build(dev: &Device, method: Method, shape: Shape, variant: Variant) -> Result<Self> {
        let module = dev.build(&source(shape, variant))?;
        let kernel = module.kernel("select_tasks")?;
        // The fused shape: one CTA a multiprocessor, at most, all resident at once.
        let resident = kernel.max_coresident_grid(shape.threads, shape.lds_bytes())?;
        let ctas = resident.min(dev.info().multiprocessors);
        Ok(Selector {
            kernel,
            epoch: EpochNode::build(dev, variant)?,
            _module: module,
            method,
            shape,
            variant,
            ctas,
            overlap_prior: method != Method::MultiSlice,
        })
    }

    /// Whether launches may start while the kernel before them on the stream still runs (they
    /// wait for it before touching memory: CUDA's programmatic dependent launch). On by default
    /// for the one-CTA and registers methods; off for the multi-slice one, whose launches are
    /// cooperative (its gangs need every CTA resident) and whose long rows measured slower
    /// overlapped (PERF.md). Off, every launch waits at the stream as usual.
    pub fn set_overlapping(&mut self, on: bool) {
        self.overlap_prior = on && self.method != Method::MultiSlice;
    }

    pub fn overlapping(&self) -> bool {
        self.overlap_prior
    }

    pub fn method(&self) -> Method {
        self.method
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// CTAs a launch may use: resident at once, one a multiprocessor at most.
    pub fn ctas(&self) -> u32 {
        self.ctas
    }

    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }
}

/// What the select tasks read and write besides their descriptors, in the byte layout of `struct
/// sel_args` (`kernels/select_decode.h`): passed by value as the kernel's second argument.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SelArgs {
    pub scores: u64,
    /// The page table the indexer reads (`kernels/ops/paging.h`): every request's pages
    /// (`u32`), or 0 for lists of positions; each row's [`PageRow`]; each request's
    /// [`PageRequest`].
    pub page_list: u64,
    pub page_rows: u64,
    pub page_requests: u64,
    pub out: u64,
    pub flags: u64,
    pub trace: u64,
    pub stride: u32,
    pub hist_offset: u32,
    pub cand_offset: u32,
    pub cand_stride: u32,
    /// Input ranges are slots of this many boxes whose first box is the written one (a fused
    /// launch's run completion boxes, a line each); 0 or 1: every box of a range is written.
    pub in_stride: u32,
    /// Boxes of a [`SelectBoxes::gang`] slot: slice 0's gang range is slots of this many boxes,
    /// the first written.
    pub gang_stride: u32,
}

const _: () = assert!(std::mem::size_of::<SelArgs>() == 80);

/// The page table's three buffers (`kernels/ops/paging.h`), for a batch uploaded on its own.
struct PageBuffers {
    list: Buffer<u32>,
    rows: Buffer<PageRow>,
    requests: Buffer<PageRequest>,
}

impl PageBuffers {
    fn upload(dev: &Device, form: &DevicePages) -> Result<Self> {
        Ok(PageBuffers {
            list: dev.upload(&form.list)?,
            rows: dev.upload(&form.rows)?,
            requests: dev.upload(&form.requests)?,
        })
    }
}

/// A batch of rows in device memory, with its task list and everything a select of them needs.
pub struct Batch {
    method: Method,
    lens: Vec<u32>,
    // Read through `args` only; kept for as long as the batch.
    _scores: Buffer<f32>,
    _pages: Option<PageBuffers>,
    out: Buffer<i32>,
    flags: Buffer<u32>,
    scratch: Buffer<u64>,
    epoch: Buffer<u32>,
    diag: Buffer<u32>,
    trace: Buffer<u64>,
    table: DeviceTable,
    args: SelArgs,
}

impl Batch {
    /// Checks the rows (and page table) against what `sel` holds, plans its tasks and uploads them.
    pub fn upload(
        dev: &Device,
        sel: &Selector,
        rows: &Rows,
        pages: Option<&RowPages>,
    ) -> Result<Batch> {
        rows.check()?;
        if rows.count() == 0 {
            return Err(GpuError::Layout(LayoutError::NoRows));
        }
        if rows.stride % 4 != 0 {
            return Err(GpuError::Stride {
                stride: rows.stride,
            });
        }
        let top = sel.shape.top;
        let holds = sel.shape.holds(sel.method);
        for (row, &len) in rows.lens.iter().enumerate() {
            if len > MAX_ROW_KEYS {
                return Err(LayoutError::RowTooLong { len }.into());
            }
            if sel.method == Method::Registers && len > holds {
                return Err(GpuError::Unfit {
                    row,
                    need: len,
                    built: holds,
                });
            }
        }
        let n = rows.count();
        let mut plan = SelectPlan::new(
            rows.lens,
            sel.method.kind(),
            top,
            sel.ctas,
            Slicing::production(sel.shape.slice_keys),
            0,
        )?;
        let mut builder = ScratchLayout::builder();
        let boxes = SelectBoxes::add(&mut builder, "sel", n as u32, top)?;
        plan.publish(&boxes)?;
        let layout = builder.build();
        let placement = plan.placement().check(Limits {
            max_resident: sel.ctas,
            scratch_boxes: layout.boxes(),
        })?;
        let table = DeviceTable::upload(dev, &placement)?;
        let scores = dev.upload(&rows.scores[..n * rows.stride])?;
        let pages_buf = match pages {
            Some(p) => Some(PageBuffers::upload(dev, &p.device_form(rows.lens)?)?),
            None => None,
        };
        let out = dev.alloc_zeroed(n * top.k() as usize)?;
        let flags = dev.alloc_zeroed(n * FLAG_NAMES.len())?;
        let trace = dev.alloc_zeroed(2 * TRACE_MARKS)?;
        let args = SelArgs {
            scores: scores.device_ptr(),
            page_list: pages_buf.as_ref().map_or(0, |p| p.list.device_ptr()),
            page_rows: pages_buf.as_ref().map_or(0, |p| p.rows.device_ptr()),
            page_requests: pages_buf.as_ref().map_or(0, |p| p.requests.device_ptr()),
            out: out.device_ptr(),
            flags: flags.device_ptr(),
            trace: trace.device_ptr(),
            stride: rows.stride as u32,
            hist_offset: boxes.hist.offset(),
            cand_offset: boxes.cand.offset(),
            cand_stride: boxes.cand.stride(),
            in_stride: 0,
            gang_stride: boxes.gang.stride(),
        };
        Ok(Batch {
            method: sel.method,
            lens: rows.lens.to_vec(),
            _scores: scores,
            _pages: pages_buf,
            out,
            flags,
            scratch: dev.alloc_zeroed(layout.boxes() as usize)?,
            epoch: dev.alloc_zeroed(1)?,
            diag: dev.alloc_zeroed(DIAG_WORDS)?,
            trace,
            table,
            args,
        })
    }

    pub fn rows(&self) -> u32 {
        self.lens.len() as u32
    }

    /// CTAs of a launch of the batch.
    pub fn ctas(&self) -> u32 {
        self.table.ctas
    }

    /// Enqueues `repeats` selects of the batch on `stream`: one epoch advance, then `repeats`
    /// launches with tags of their own, for a test (1) or a captured benchmark loop.
    pub fn enqueue(&self, sel: &Selector, stream: &Stream, repeats: u32) -> Result<()> {
        if sel.method != self.method {
            return Err(GpuError::OtherMethod {
                planned: self.method.name(),
                built: sel.method.name(),
            });
        }
        let tags = Tags::new(repeats.max(1))?;
        sel.epoch
            .enqueue(stream, &self.epoch, &self.scratch, tags)?;
        let mut launch =
            Launch::new(self.table.ctas, sel.shape.threads).shared(sel.shape.lds_bytes());
        if sel.method == Method::MultiSlice {
            launch = launch.cooperative();
        }
        launch.overlap_prior = sel.overlap_prior;
        for index in 0..repeats {
            let table = LaunchTable::new(
                &self.table,
                &self.scratch,
                &self.epoch,
                &self.diag,
                tags,
                index,
            )?;
            let args = Args::new().value(&table).value(&self.args);
            stream.launch(&sel.kernel, launch, &args)?;
        }
        Ok(())
    }

    /// Zeroes the output, the error words and the trace (between checks that must not see old
    /// results).
    pub fn clear(&self) -> Result<()> {
        self.out.zero()?;
        self.flags.zero()?;
        self.diag.zero()?;
        self.trace.zero()?;
        Ok(())
    }

    /// The last traced select's marks (a `SEL_TRACE` build): (phase name, SM cycles since the
    /// start), in the order stamped; empty for other builds.
    pub fn trace(&self) -> Result<Vec<(&'static str, u64)>> {
        let words = self.trace.download()?;
        let start = words[1];
        Ok(words
            .chunks(2)
            .take_while(|m| m[1] != 0)
            .map(|m| {
                let name = PHASES
                    .get(m[0] as usize)
                    .copied()
                    .unwrap_or("unknown phase");
                (name, m[1].saturating_sub(start))
            })
            .collect())
    }

    /// The lists `[rows, k]`, or the first error a task reported.
    pub fn read(&self, sel: &Selector) -> Result<Vec<i32>> {
        let diag = self.diag.download()?;
        let limit = sel.variant.debug.map_or(0, |d| d.poll_limit as u64);
        if let Some((stall, _)) = Stall::from_diag(&diag, limit) {
            return Err(GpuError::Stalled(stall));
        }
        let flags = self.flags.download()?;
        let per_row = FLAG_NAMES.len();
        if let Some(i) = flags.iter().position(|&f| f != 0) {
            return Err(GpuError::Flagged {
                row: i / per_row,
                what: FLAG_NAMES[i % per_row],
            });
        }
        Ok(self.out.download()?)
    }
}
