//! Host side of the standalone select kernels (`kernels/select.hip`): sources and builds, a batch of
//! rows in device memory, enqueueing either kernel (the multi-slice one split into groups of rows
//! whose CTAs are all resident at once), and reading the lists back with the kernels' error flags.

use crate::layout::{
    lds_words, longest_slice, one_cta_room, place_slices, reg_keys_per_thread, select_slices,
    LayoutError, SelectBoxes, TaskOrder, TopK, H200_SHARED_PER_BLOCK, HIST_BOXES, MAX_SLICES,
    ONE_CTA_ROOM, PAGE_TOKENS, PLACE_RUN, REG_BLOCK, REG_RANK_BUCKET, REG_RANK_ROOM,
    REG_STAGE_ROOM, ROOM_PER_K, ROUNDS, SLICE_ALIGN, SLICE_TARGET,
};
use crate::reference::{Pages, Rows, SelectError};
use device::{Args, Buffer, Device, DeviceError, Kernel, KernelSource, Launch, Module, Stream};
use mailbox::gpu::{EpochNode, Variant};
use mailbox::layout::{ScratchLayout, Tags};
use mailbox::{Stall, DIAG_WORDS};

pub const SELECT_HIP: (&str, &str) = ("select.hip", include_str!("../kernels/select.hip"));
/// The headers of `select.hip`, which includes `select.h`; that includes the others in this order,
/// each of which includes the one before it.
pub const SELECT_HEADERS: [(&str, &str); 6] = [
    ("select.h", include_str!("../kernels/select.h")),
    ("select_shape.h", include_str!("../kernels/select_shape.h")),
    (
        "select_rounds.h",
        include_str!("../kernels/select_rounds.h"),
    ),
    ("select_place.h", include_str!("../kernels/select_place.h")),
    ("select_tasks.h", include_str!("../kernels/select_tasks.h")),
    ("select_regs.h", include_str!("../kernels/select_regs.h")),
];

/// Threads per CTA (`SEL_BLOCK`) of the one-CTA and multi-slice kernels.
pub const BLOCK: u32 = 512;

const _: () = assert!(
    ONE_CTA_ROOM <= PLACE_RUN * BLOCK,
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
    #[error("row {row}: {len} keys need {need} pages, the page table has {stride} per row")]
    PagesShort {
        row: usize,
        len: u32,
        need: usize,
        stride: usize,
    },
    #[error(
        "the kernel was built for at most {built} keys per slice (or per row); row {row} needs {need}"
    )]
    Unfit { row: usize, need: u32, built: u32 },
    #[error("only {resident} CTAs of the multi-slice kernel can be resident at once; a row needs up to {MAX_SLICES}")]
    TooFewResident { resident: u32 },
    #[error("row {row}: the kernel reported {what}")]
    Flagged { row: usize, what: &'static str },
    #[error("the multi-slice launch stalled: {0}")]
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

/// Which kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// One CTA per row (`select_one_cta`).
    OneCta,
    /// Up to 64 slices per row, one CTA each (`select_multi_slice`).
    MultiSlice,
    /// One CTA (of [`REG_BLOCK`] threads unless the shape says otherwise) per row of at most
    /// [`crate::layout::REG_MAX_ROW`] keys, held in registers (`select_in_registers`).
    Registers,
}

impl Method {
    /// The fastest kernel measured on the H200 for rows of at most `max_len` keys
    /// (BENCHMARKS.md, commit `fb39b3c`): the registers kernel while it holds the rows (4.40 us
    /// at 8K x 4, where the multi-slice kernel takes 11.59 and the one CTA 9.50), the multi-slice
    /// kernel past that (11.37 us at 32K x 4, where the one CTA takes 20.39).
    pub fn fastest_for(max_len: u32) -> Method {
        if max_len <= crate::layout::REG_MAX_ROW {
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

    fn entry(&self) -> &'static str {
        match self {
            Method::OneCta => "select_one_cta",
            Method::MultiSlice => "select_multi_slice",
            Method::Registers => "select_in_registers",
        }
    }
}

/// What a build is specialised on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub top: TopK,
    /// `SEL_SLICE_KEYS`: keys one CTA keeps in LDS (a multiple of 4).
    pub slice_keys: u32,
    /// `SEL_REG_BLOCK` and `SEL_REG_KEYS`: threads of the registers kernel's CTA, and keys each
    /// holds (a multiple of 4; [`reg_keys_per_thread`]).
    pub reg_block: u32,
    pub reg_keys: u32,
    /// `SEL_FAST_ROUNDS`: the rounds of PERF.md (true, the default) or the first ones, kept so
    /// that one benchmark run can time both.
    pub fast_rounds: bool,
    /// `SEL_TRACE`: the CTA of row 0 that places the list stamps its phases ([`Batch::trace`]).
    pub trace: bool,
}

impl Shape {
    /// For rows of at most `max_len` keys on an H200: multi-slice slices fit in LDS; the one CTA
    /// keeps a row in LDS up to [`ONE_CTA_ROOM`] keys and streams longer ones; the registers
    /// kernel holds rows up to [`crate::layout::REG_MAX_ROW`] keys (longer ones are an error).
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
        let need = match method {
            Method::MultiSlice => longest_slice(max_len)?,
            Method::OneCta => max_len.min(one_cta_room(shared_per_block, top)),
            Method::Registers => 0,
        };
        // Other methods' builds still compile the registers kernel: the smallest shape.
        let reg_rows = if method == Method::Registers {
            max_len
        } else {
            0
        };
        let reg_keys = reg_keys_per_thread(reg_rows, REG_BLOCK)?;
        Ok(Shape {
            top,
            slice_keys: need.div_ceil(SLICE_ALIGN).max(1) * SLICE_ALIGN,
            reg_block: REG_BLOCK,
            reg_keys,
            fast_rounds: true,
            trace: false,
        })
    }

    /// The registers kernel with CTAs of `block` threads for rows of at most `max_len` keys
    /// (as [`Shape::for_rows`] with `block` threads: the bench times several).
    pub fn registers(top: TopK, max_len: u32, block: u32) -> Result<Shape> {
        Ok(Shape {
            reg_block: block,
            reg_keys: reg_keys_per_thread(max_len, block)?,
            ..Self::for_rows(Method::Registers, top, max_len)?
        })
    }

    /// Threads of a CTA of `method`.
    pub fn block(&self, method: Method) -> u32 {
        match method {
            Method::OneCta | Method::MultiSlice => BLOCK,
            Method::Registers => self.reg_block,
        }
    }

    /// Dynamic shared memory of a CTA of `method` (`SEL_LDS_WORDS * 4`; the registers kernel's
    /// histograms are static).
    pub fn lds_bytes(&self, method: Method) -> u32 {
        match method {
            Method::OneCta | Method::MultiSlice => lds_words(self.slice_keys, self.top) * 4,
            Method::Registers => 0,
        }
    }
}

/// The kernel source with this crate's headers, the shape and the mailbox variant as defines.
pub fn source(shape: Shape, variant: Variant) -> KernelSource {
    let src = with_headers(mailbox::gpu::source(SELECT_HIP))
        .define("SEL_K", shape.top.k())
        .define("SEL_ROOM_PER_K", ROOM_PER_K)
        .define("SEL_BLOCK", BLOCK)
        .define("SEL_REG_BLOCK", shape.reg_block)
        .define("SEL_REG_KEYS", shape.reg_keys)
        .define("SEL_REG_STAGE_ROOM", REG_STAGE_ROOM)
        .define("SEL_REG_RANK_ROOM", REG_RANK_ROOM)
        .define("SEL_REG_BUCKET", REG_RANK_BUCKET)
        .define("SEL_SLICE_KEYS", shape.slice_keys)
        .define("SEL_SLICE_TARGET", SLICE_TARGET)
        .define("SEL_MAX_SLICES", MAX_SLICES)
        .define("SEL_SLICE_ALIGN", SLICE_ALIGN)
        .define("SEL_PAGE_TOKENS", PAGE_TOKENS)
        .define("SEL_FAST_ROUNDS", shape.fast_rounds as u32)
        .define("SEL_TRACE", shape.trace as u32);
    variant.apply(src)
}

/// Every entry-point file of the crate with its default defines, for the kernel build table.
pub fn sources() -> Vec<KernelSource> {
    vec![with_headers(mailbox::gpu::source(SELECT_HIP))]
}

fn with_headers(src: KernelSource) -> KernelSource {
    SELECT_HEADERS
        .iter()
        .fold(src, |src, &(name, text)| src.header(name, text))
}

/// A built select kernel.
pub struct Selector {
    // Declared before the module: a kernel must not outlive its module.
    kernel: Kernel,
    epoch: Option<EpochNode>,
    _module: Module,
    method: Method,
    shape: Shape,
    variant: Variant,
    resident: u32,
    overlap_prior: bool,
}

impl Selector {
    pub fn build(dev: &Device, method: Method, shape: Shape, variant: Variant) -> Result<Self> {
        let module = dev.build(&source(shape, variant))?;
        let kernel = module.kernel(method.entry())?;
        let resident = kernel.max_coresident_grid(shape.block(method), shape.lds_bytes(method))?;
        let epoch = match method {
            Method::MultiSlice => Some(EpochNode::build(dev, variant)?),
            Method::OneCta | Method::Registers => None,
        };
        Ok(Selector {
            kernel,
            epoch,
            _module: module,
            method,
            shape,
            variant,
            resident,
            overlap_prior: method != Method::MultiSlice,
        })
    }

    /// Whether launches may start while the kernel before them on the stream still runs (they
    /// wait for it before touching memory: CUDA's programmatic dependent launch; the multi-slice
    /// kernel's launches stay cooperative). On by default for the one-CTA and registers methods;
    /// off for the multi-slice one, whose long rows measured slower overlapped (PERF.md).
    /// Off, every launch waits at the stream as usual.
    pub fn set_overlapping(&mut self, on: bool) {
        self.overlap_prior = on;
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

    /// CTAs of this kernel that can be resident at once.
    pub fn resident(&self) -> u32 {
        self.resident
    }

    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }
}

/// Rows of the multi-slice launch that run together, and their placement.
struct Group {
    first_row: u32,
    rows: u32,
    runs: bool,
    tasks: u32,
}

/// A batch of rows in device memory, with everything a select of them needs.
pub struct Batch {
    top: TopK,
    stride: u32,
    lens: Vec<u32>,
    pages_stride: u32,
    scores: Buffer<f32>,
    lens_buf: Buffer<u32>,
    pages: Option<Buffer<i32>>,
    out: Buffer<i32>,
    flags: Buffer<u32>,
    scratch: Buffer<u64>,
    epoch: Buffer<u32>,
    diag: Buffer<u32>,
    trace: Buffer<u64>,
    boxes: SelectBoxes,
}

impl Batch {
    /// Checks the rows (and page table) and uploads them.
    pub fn upload(dev: &Device, rows: &Rows, pages: Option<&Pages>, top: TopK) -> Result<Batch> {
        rows.check()?;
        if rows.count() == 0 {
            return Err(GpuError::Layout(LayoutError::NoRows));
        }
        if rows.stride % 4 != 0 {
            return Err(GpuError::Stride {
                stride: rows.stride,
            });
        }
        for (row, &len) in rows.lens.iter().enumerate() {
            select_slices(len)?;
            if let Some(p) = pages {
                check_pages(p, row, len)?;
            }
        }
        let n = rows.count();
        let mut builder = ScratchLayout::builder();
        let boxes = SelectBoxes::add(&mut builder, "sel", n as u32, top)?;
        let layout = builder.build();
        Ok(Batch {
            top,
            stride: rows.stride as u32,
            lens: rows.lens.to_vec(),
            pages_stride: pages.map_or(0, |p| p.stride as u32),
            scores: dev.upload(&rows.scores[..n * rows.stride])?,
            lens_buf: dev.upload(rows.lens)?,
            pages: pages
                .map(|p| dev.upload(&p.table[..n * p.stride]))
                .transpose()?,
            out: dev.alloc_zeroed(n * top.k() as usize)?,
            flags: dev.alloc_zeroed(n * FLAG_NAMES.len())?,
            scratch: dev.alloc_zeroed(layout.boxes() as usize)?,
            epoch: dev.alloc_zeroed(1)?,
            diag: dev.alloc_zeroed(DIAG_WORDS)?,
            trace: dev.alloc_zeroed(2 * TRACE_MARKS)?,
            boxes,
        })
    }

    pub fn rows(&self) -> u32 {
        self.lens.len() as u32
    }

    /// Groups of consecutive rows whose CTAs fit the resident grid together.
    fn groups(&self, resident: u32) -> Result<Vec<Group>> {
        if resident < MAX_SLICES {
            return Err(GpuError::TooFewResident { resident });
        }
        let counts: Vec<u32> = self
            .lens
            .iter()
            .map(|&l| select_slices(l).map(|s| s.count()))
            .collect::<Result<_, _>>()?;
        let mut groups = Vec::new();
        let mut first = 0usize;
        while first < counts.len() {
            // The longest run of rows from `first` that fits (one row always does).
            let mut end = first + 1;
            while end < counts.len() && place_slices(&counts[first..=end])?.tasks() <= resident {
                end += 1;
            }
            let p = place_slices(&counts[first..end])?;
            groups.push(Group {
                first_row: first as u32,
                rows: (end - first) as u32,
                runs: p.order() == TaskOrder::Runs,
                tasks: p.tasks(),
            });
            first = end;
        }
        Ok(groups)
    }

    fn check_fits(&self, sel: &Selector) -> Result<()> {
        if sel.shape.top != self.top {
            return Err(GpuError::Layout(LayoutError::BadK {
                k: sel.shape.top.k(),
            }));
        }
        if sel.method == Method::MultiSlice {
            for (row, &len) in self.lens.iter().enumerate() {
                let need = select_slices(len)?.chunk();
                if need > sel.shape.slice_keys {
                    return Err(GpuError::Unfit {
                        row,
                        need,
                        built: sel.shape.slice_keys,
                    });
                }
            }
        }
        if sel.method == Method::Registers {
            let built = sel.shape.reg_keys * sel.shape.reg_block;
            if let Some((row, &need)) = self.lens.iter().enumerate().find(|(_, &l)| l > built) {
                return Err(GpuError::Unfit { row, need, built });
            }
        }
        Ok(())
    }

    fn ptr<T: bytemuck::Pod>(buf: &Buffer<T>, offset: u64) -> u64 {
        buf.device_ptr() + offset * std::mem::size_of::<T>() as u64
    }

    /// Enqueues `repeats` selects of the batch on `stream` (the multi-slice kernel: one epoch
    /// advance, then `repeats` launches with tags of their own), for a test (1) or a captured
    /// benchmark loop.
    pub fn enqueue(&self, sel: &Selector, stream: &Stream, repeats: u32) -> Result<()> {
        self.check_fits(sel)?;
        let launch = Launch {
            overlap_prior: sel.overlap_prior,
            ..Launch::new(0, sel.shape.block(sel.method)).shared(sel.shape.lds_bytes(sel.method))
        };
        let pages = self.pages.as_ref();
        let pages_ptr = pages.map_or(0, |p| p.device_ptr());
        let Some(epoch_node) = &sel.epoch else {
            let args = Args::new()
                .buf(&self.scores)
                .u32(self.stride)
                .buf(&self.lens_buf)
                .u32(self.rows())
                .u64(pages_ptr)
                .u32(self.pages_stride)
                .buf(&self.out)
                .buf(&self.flags)
                .buf(&self.trace);
            for _ in 0..repeats {
                stream.launch(
                    &sel.kernel,
                    Launch {
                        grid: self.rows(),
                        ..launch
                    },
                    &args,
                )?;
            }
            return Ok(());
        };
        let tags = Tags::new(repeats.max(1))?;
        epoch_node.enqueue(stream, &self.epoch, &self.scratch, tags)?;
        let groups = self.groups(sel.resident)?;
        for index in 0..repeats {
            for g in &groups {
                let r0 = g.first_row as u64;
                let args = Args::new()
                    .u64(Self::ptr(&self.scores, r0 * self.stride as u64))
                    .u32(self.stride)
                    .u64(Self::ptr(&self.lens_buf, r0))
                    .u32(g.rows)
                    .u32(g.runs as u32)
                    .u64(pages.map_or(0, |p| Self::ptr(p, r0 * self.pages_stride as u64)))
                    .u32(self.pages_stride)
                    .u64(Self::ptr(&self.out, r0 * self.top.k() as u64))
                    .u64(Self::ptr(&self.flags, r0 * FLAG_NAMES.len() as u64))
                    .buf(&self.scratch)
                    .buf(&self.epoch)
                    .u32(tags.launches_per_step())
                    .u32(index)
                    .u32(self.boxes.hist.offset() + g.first_row * ROUNDS * MAX_SLICES * HIST_BOXES)
                    .u32(self.boxes.cand.offset() + g.first_row * self.boxes.cand.stride())
                    .u32(self.boxes.cand.stride())
                    .buf(&self.diag)
                    .buf(&self.trace);
                let l = Launch {
                    grid: g.tasks,
                    ..launch
                }
                .cooperative();
                stream.launch(&sel.kernel, l, &args)?;
            }
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

    /// The lists `[rows, k]`, or the first error a kernel reported.
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

/// The page table of `row` covers its keys, and every slot of them fits in 0..2^31.
fn check_pages(pages: &Pages, row: usize, len: u32) -> Result<()> {
    let need = len.div_ceil(PAGE_TOKENS) as usize;
    if need > pages.stride {
        return Err(GpuError::PagesShort {
            row,
            len,
            need,
            stride: pages.stride,
        });
    }
    for page in 0..need as u32 {
        // The page's last slot is its largest; when it is in range, so is its first.
        pages.slot(row, page * PAGE_TOKENS + PAGE_TOKENS - 1)?;
    }
    Ok(())
}
