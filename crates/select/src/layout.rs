//! Shape and placement math of the select stage, the one copy that the reference, the kernel
//! launch and the executor all read: k and the candidate room, the digit schedule, the slicing of
//! a row, the task list of a launch ([`SelectPlan`]), and the scratch regions. The device headers
//! (`kernels/select.h` and those it includes) mirror the formulas marked "(device)".

use mailbox::layout::{BoxRange, LayoutBuilder, LayoutError as BoxLayoutError, Region};
use mailbox::{Placement, Stage, Task};
use model::{ModelConfig, Preset};
use std::ops::Range;

/// The largest k a launch may be built for: the first slice's candidate arrays (a position and a
/// key per candidate, [`ROOM_PER_K`] * k candidates) stay within [`SLICE_ROOM`] words of LDS.
pub const MAX_K: u32 = SLICE_ROOM / (2 * ROOM_PER_K);
/// The candidate room is `ROOM_PER_K * k` keys (4096 for k = 2048). It is part of the contract:
/// the descent stops at 12 (or 24) bits when the keys sharing T's prefix fit in it, and where it
/// stops decides the order of the list.
pub const ROOM_PER_K: u32 = 2;

/// The digits of the descent, from the top: (shift, width). Prefix lengths after each round are
/// 6, 12, 18, 24, 30 and 32 bits. (device)
pub const DIGITS: [(u32, u32); 6] = [(26, 6), (20, 6), (14, 6), (8, 6), (2, 6), (0, 2)];
/// Rounds of the descent, so histogram slots per row and slice.
pub const ROUNDS: u32 = DIGITS.len() as u32;
/// Bins of a digit histogram.
pub const BINS: u32 = 64;
/// A histogram travels as 32 tagged pairs, two 16-bit counts each (bin 2j low, 2j + 1 high).
pub const HIST_BOXES: u32 = BINS / 2;
/// Prefix lengths at which the descent may stop and hand the rest to the row's first slice.
pub const STOPS: [u32; 2] = [12, 24];

/// Wide digits, counted with shared-memory atomics. The one-CTA kernel counts the top
/// `FIRST_BITS` of every key (into `FIRST_COPIES` copies of each bin on the device, so lanes whose
/// keys share a bin do not queue on one word), then two `WIDE_BITS` digits over the keys sharing
/// the prefix: 8 + 12 + 12 = 32 bits. The top `GROUP_BITS` of each 12-bit digit end at a stop
/// (12, 24), so the pass also counts the keys sharing T's prefix there. (device)
pub const FIRST_BITS: u32 = 8;
pub const FIRST_COPIES: u32 = 16;
pub const WIDE_BITS: u32 = 12;
pub const WIDE_BINS: u32 = 1 << WIDE_BITS;
pub const GROUP_BITS: u32 = 4;
const _: () = assert!(FIRST_BITS + GROUP_BITS == STOPS[0]);
const _: () = assert!(FIRST_BITS + WIDE_BITS + GROUP_BITS == STOPS[1]);
const _: () = assert!(FIRST_BITS + 2 * WIDE_BITS == 32);
const _: () = assert!((1 << FIRST_BITS) * FIRST_COPIES == WIDE_BINS);
/// The widths of the wide passes that finish T from a prefix of `len` bits: two 10-bit digits
/// from 12 bits, one 8-bit digit from 24. (device `sel_wide_finish`)
pub fn wide_finish(len: u32) -> &'static [u32] {
    match len {
        12 => &[10, 10],
        24 => &[8],
        _ => &[],
    }
}
/// The widest pass over candidates: its bins live in the multi-slice kernel's static shared memory.
pub const TAIL_BINS: u32 = 1 << 10;
/// The placement pass gives a thread a run of at most this many consecutive keys (one bit each
/// in a u64 mask), so a CTA places at most `PLACE_RUN * block` keys. (device)
pub const PLACE_RUN: u32 = 64;

/// Shared memory per block a kernel may use: the H200 (sm_90) and the MI355X (gfx950).
pub const H200_SHARED_PER_BLOCK: u32 = 227 * 1024;
pub const GFX950_SHARED_PER_BLOCK: u32 = 160 * 1024;
/// What a task's state (`sel_smem`, at the start of its LDS: about 9 KiB at 512 threads) may take
/// at most; the rest of the LDS holds the keys. The header checks it (`SEL_LDS_BYTES`).
pub const STATIC_SHARED_ALLOWANCE: u32 = 16 * 1024;

/// The LDS a select task of a CTA of `threads` threads takes (`SEL_LDS_BYTES`): the one CTA's or a
/// slice's state and `keys` keys with their candidates, or the registers task's histograms and
/// list, whichever is larger. (device static_asserts check both)
pub fn task_lds_bytes(keys: u32, top: TopK, threads: u32) -> u32 {
    let one_cta = STATIC_SHARED_ALLOWANCE.max(16 * threads + 4096) + lds_words(keys, top) * 4;
    // Three histograms (12, 12 and 8 bits), the list, and a few words a wave.
    let registers = (2 * WIDE_BINS + 256 + top.k()) * 4 + threads + 256;
    one_cta.max(registers)
}
/// Rows of at most this many keys the one-CTA kernel keeps in LDS and selects with wide digits
/// (longer rows stream from global memory by 6-bit rounds): the H200's
/// [`one_cta_room`] at GLM-5's k = 2048 (on gfx950 it is 28672; [`Shape::for_rows_within`] takes the
/// device's figure).
///
/// [`Shape::for_rows_within`]: crate::gpu::Shape::for_rows_within
pub const ONE_CTA_ROOM: u32 = 32768;
/// Unit of the one-CTA room.
pub const ONE_CTA_ROOM_STEP: u32 = 1024;

/// The longest row the registers task takes: 32 keys a thread of 512 threads (the fused CTA).
pub const REG_MAX_ROW: u32 = 16384;
/// The longest row the production build's registers task takes: 20 keys a thread of 512, so that
/// a decode row at an 8K context (8193 keys and a few more) stays in registers, where the one-CTA
/// kind took more than twice as long in a layer launch (PERF.md).
pub const REG_PRODUCTION_ROW: u32 = 10240;
/// Keys sharing T's 12-bit prefix that the registers kernel stages at most, to find the rest of T
/// from them alone (half of a 12-bit histogram's words, keys and positions).
/// (device `SEL_REG_STAGE_ROOM`)
pub const REG_STAGE_ROOM: u32 = 2048;

/// Staged keys sharing T's 20-bit prefix that find T by their ranks (each compared with all of
/// them) at most; more take the registers kernel's last 12-bit digit. (device `SEL_REG_RANK_ROOM`)
pub const REG_RANK_ROOM: u32 = 64;

/// Staged keys one bin of the registers kernel's 8-bit digit keeps for one wave to rank: when T's
/// bin holds at most this many, T is found from them with no further barrier. (device
/// `SEL_REG_BUCKET`)
pub const REG_RANK_BUCKET: u32 = 16;

/// The most keys sharing T's 12-bit prefix that the registers kernel stages: the stage room, or
/// the candidate room when that is smaller (P is then that prefix). (device `SEL_REG_STAGED`)
pub fn reg_staged_room(top: TopK) -> u32 {
    REG_STAGE_ROOM.min(top.room())
}

/// Keys a thread of the registers kernel holds at most (`SEL_REG_KEYS`: marked in a u32).
pub const REG_MAX_PER_THREAD: u32 = 32;

/// Keys per thread of a registers task on a CTA of `block` threads built for rows of at most
/// `max_len` keys: the fewest (a multiple of 4, at least 4) that hold such a row. `block` is a power
/// of two from 64 to 1024 (a thread owns a whole number of quads of a 4096-bin histogram). (device
/// `SEL_REG_KEYS`)
pub fn reg_keys_per_thread(max_len: u32, block: u32) -> Result<u32, LayoutError> {
    if !block.is_power_of_two() || !(64..=1024).contains(&block) {
        return Err(LayoutError::BadRegBlock { block });
    }
    let per = max_len.div_ceil(block).div_ceil(4).max(1) * 4;
    if max_len > REG_MAX_ROW || per > REG_MAX_PER_THREAD {
        return Err(LayoutError::TooLongForRegisters {
            len: max_len,
            block,
        });
    }
    Ok(per)
}

/// Dynamic LDS words of a select CTA that keeps `keys` keys: the keys, then either the candidate
/// (position, key) arrays or the one CTA's [`WIDE_BINS`]-bin histogram, whichever is larger.
/// (device `SEL_LDS_WORDS`)
pub fn lds_words(keys: u32, top: TopK) -> u32 {
    keys + (2 * top.room().div_ceil(4) * 4).max(WIDE_BINS)
}

/// The longest row (a multiple of [`ONE_CTA_ROOM_STEP`], at most [`ONE_CTA_ROOM`]) that one CTA
/// keeps in LDS within `shared_per_block` bytes, the static allowance included; 0 if none fits.
pub fn one_cta_room(shared_per_block: u32, top: TopK) -> u32 {
    let budget = shared_per_block.saturating_sub(STATIC_SHARED_ALLOWANCE) / 4;
    let extra = lds_words(0, top);
    let most = budget.saturating_sub(extra) / ONE_CTA_ROOM_STEP * ONE_CTA_ROOM_STEP;
    most.min(ONE_CTA_ROOM)
}

/// Keys a slice aims at: a row of `len` keys takes `ceil(len / SLICE_TARGET)` slices, at most
/// [`MAX_SLICES`]. A gathered round costs more the more slices it gathers (32 boxes from each)
/// and little per key (PERF.md), so slices are made long: a 128K row is 16 slices of
/// 8K, and only rows past `MAX_SLICES * SLICE_TARGET` (512K) keys take longer ones. A launch whose
/// rows would need more slices than it has CTAs takes longer ones too ([`SelectPlan`]).
pub const SLICE_TARGET: u32 = 8192;
/// Slices of one row. (device)
pub const MAX_SLICES: u32 = 64;
/// Keys one slice keeps in LDS: 64 KiB of radix keys; also below 2^16, so its counts fit 16 bits.
pub const SLICE_ROOM: u32 = 16384;
/// Slices start on multiples of this many keys, so a slice is read with 16-byte loads. (device)
pub const SLICE_ALIGN: u32 = 4;
/// The longest row: 64 slices of [`SLICE_ROOM`] keys (2^20).
pub const MAX_ROW_KEYS: u32 = MAX_SLICES * SLICE_ROOM;
const _: () = assert!(SLICE_ROOM < 1 << 16, "slice counts travel as 16-bit values");
const _: () = assert!(SLICE_ROOM % SLICE_ALIGN == 0);
// Why every row up to MAX_ROW_KEYS slices within SLICE_ROOM: up to MAX_SLICES * SLICE_TARGET
// keys, ceil(len / count) <= SLICE_TARGET, a multiple of SLICE_ALIGN, so the rounding keeps it
// there; past that, count = MAX_SLICES and ceil(len / MAX_SLICES) <= SLICE_ROOM, also a multiple.
const _: () = assert!(SLICE_TARGET <= SLICE_ROOM && SLICE_TARGET % SLICE_ALIGN == 0);

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("k = {k}: k is at least 1, and its candidate room ({ROOM_PER_K} k) fits 32 bits")]
    BadK { k: u32 },
    #[error("`index_topk` = {k} of the config: k is at least 1, and its candidate room ({ROOM_PER_K} k) fits 32 bits")]
    BadIndexTopK { k: usize },
    #[error(
        "k = {k}: the kernels build for k up to {MAX_K} (the first slice's candidates stay in LDS)"
    )]
    KernelK { k: u32 },
    #[error(
        "a row of {len} keys is longer than {MAX_ROW_KEYS} ({MAX_SLICES} slices of {SLICE_ROOM})"
    )]
    RowTooLong { len: u32 },
    #[error("a row of {len} keys cannot be cut into {count} slices (1..={MAX_SLICES}, none empty, each at most {SLICE_ROOM} keys, starting on multiples of {SLICE_ALIGN})")]
    BadSliceCount { len: u32, count: u32 },
    #[error("a row of {len} keys does not fit the registers kernel of {block} threads (at most {REG_MAX_ROW} keys, {REG_MAX_PER_THREAD} a thread)")]
    TooLongForRegisters { len: u32, block: u32 },
    #[error("the registers kernel takes 64, 128, 256, 512 or 1024 threads, not {block}")]
    BadRegBlock { block: u32 },
    #[error("a select launch needs at least one row")]
    NoRows,
    #[error("a select launch needs at least one CTA")]
    NoCtas,
    #[error("row {row}: {len} keys need {count} slices of at most {keys} keys, more than the {ctas} CTAs of the launch (a gang's slices run at once)")]
    TooFewCtas {
        row: usize,
        len: u32,
        count: u32,
        keys: u32,
        ctas: u32,
    },
    #[error("row {row}'s first slice waits on too many input ranges to add its gang's")]
    TooManyInputs { row: u32 },
    #[error("row {row} slice {slice} has no box in the select regions (laid out for fewer rows)")]
    NotInLayout { row: u32, slice: u32 },
    #[error(transparent)]
    Scratch(#[from] BoxLayoutError),
}

/// k, with the candidate room that goes with it. The contract (the references) holds for any k;
/// the kernels build for k up to [`MAX_K`] ([`TopK::for_kernels`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopK {
    k: u32,
}

impl TopK {
    pub fn new(k: u32) -> Result<Self, LayoutError> {
        if k >= 1 && k.checked_mul(ROOM_PER_K).is_some() {
            Ok(TopK { k })
        } else {
            Err(LayoutError::BadK { k })
        }
    }

    /// This k, if the kernels build for it (at most [`MAX_K`]).
    pub fn for_kernels(self) -> Result<Self, LayoutError> {
        if self.k <= MAX_K {
            Ok(self)
        } else {
            Err(LayoutError::KernelK { k: self.k })
        }
    }

    /// k of a model: its config's `index_topk`.
    pub fn of(cfg: &ModelConfig) -> Result<Self, LayoutError> {
        u32::try_from(cfg.index_topk)
            .ok()
            .and_then(|k| TopK::new(k).ok())
            .ok_or(LayoutError::BadIndexTopK { k: cfg.index_topk })
    }

    /// k of a built-in model ([`TopK::of`] its config), for the standalone builds, benches and
    /// checks: 2048 for GLM-5.
    pub fn preset(preset: Preset) -> Result<Self, LayoutError> {
        TopK::of(&preset.config())
    }

    pub fn k(&self) -> u32 {
        self.k
    }

    /// Candidates the first slice resolves at most.
    pub fn room(&self) -> u32 {
        ROOM_PER_K * self.k
    }
}

/// A row cut into slices that tile it once in position order: slice `c` is
/// `c * chunk .. min(len, (c + 1) * chunk)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slices {
    len: u32,
    count: u32,
    chunk: u32,
}

/// Slices of a row of `len` keys: one per `target` keys (rounded up), 1 to [`MAX_SLICES`]. The
/// production rule is [`select_slices`]'s; the host emulation runs smaller targets.
/// (device: `sel_slice_count`)
pub fn slice_count(len: u32, target: u32) -> u32 {
    len.div_ceil(target).clamp(1, MAX_SLICES)
}

/// The production slicing of a row: one slice per [`SLICE_TARGET`] keys (rounded up), at most
/// [`MAX_SLICES`]. A row of at most `SLICE_TARGET` keys is one slice (it gathers its own
/// histograms); a row of no keys has one empty slice (it still writes the row's padding). (device)
pub fn select_slices(len: u32) -> Result<Slices, LayoutError> {
    Slices::new(len, slice_count(len, SLICE_TARGET))
}

/// The longest slice ([`Slices::chunk`]) of the production slicing of any row of at most
/// `max_len` keys: what a multi-slice kernel for such rows keeps in LDS. Not the chunk of
/// `max_len` itself: a row of [`SLICE_TARGET`] keys is one slice of that many, one key more
/// makes two of half.
pub fn longest_slice(max_len: u32) -> Result<u32, LayoutError> {
    let whole = select_slices(max_len.min(SLICE_TARGET))?.chunk();
    Ok(whole.max(select_slices(max_len)?.chunk()))
}

impl Slices {
    /// `len` keys in `count` slices of equal length (rounded up to [`SLICE_ALIGN`]), the last
    /// one shorter. Fails when a slice would be empty or longer than [`SLICE_ROOM`]. (device)
    pub fn new(len: u32, count: u32) -> Result<Self, LayoutError> {
        if len > MAX_ROW_KEYS {
            return Err(LayoutError::RowTooLong { len });
        }
        let bad = || LayoutError::BadSliceCount { len, count };
        if count == 0 || count > MAX_SLICES || (len == 0 && count != 1) {
            return Err(bad());
        }
        let chunk = len.div_ceil(count).div_ceil(SLICE_ALIGN) * SLICE_ALIGN;
        if chunk > SLICE_ROOM || (len > 0 && (count - 1) * chunk >= len) {
            return Err(bad());
        }
        Ok(Slices { len, count, chunk })
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Keys of every slice but the last.
    pub fn chunk(&self) -> u32 {
        self.chunk
    }

    /// Positions of slice `c` (empty past the last slice).
    pub fn range(&self, c: u32) -> Range<u32> {
        let start = (c.min(self.count) * self.chunk).min(self.len);
        let end = if c < self.count {
            ((c + 1) * self.chunk).min(self.len)
        } else {
            start
        };
        start..end
    }

    pub fn ranges(&self) -> impl Iterator<Item = Range<u32>> + '_ {
        (0..self.count).map(|c| self.range(c))
    }
}

/// The select stage's task kinds (`SEL_KIND_*`, `kernels/select_decode.h`): a task's own kind
/// under [`Stage::Select`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelectKind {
    /// The one CTA over a row: in LDS up to the build's slice keys, streamed past that.
    OneCta = 1,
    /// The one CTA over a row held in registers (at most `SEL_REG_KEYS` keys a thread).
    Registers = 2,
    /// One slice of a row, in a gang with the row's other slices.
    Slice = 3,
}

impl SelectKind {
    /// The kind word of a task descriptor.
    pub fn kind(self) -> u32 {
        Task::kind_of(Stage::Select, self as u32)
    }
}

/// How a plan cuts rows into slices: about `target` keys a slice, at most `keys` (the build's
/// `SEL_SLICE_KEYS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slicing {
    pub target: u32,
    pub keys: u32,
}

impl Slicing {
    /// The production slicing of a build that holds `keys` keys a slice.
    pub fn production(keys: u32) -> Self {
        Slicing {
            target: SLICE_TARGET,
            keys,
        }
    }

    /// The slices of a row of `len` keys in a launch of `rows` rows on `ctas` CTAs: one per
    /// `target` keys; fewer, longer ones (down to `ceil(len / keys)`) when the launch's rows would
    /// not all fit its CTAs at once; one for a row of at most k keys (it lists them alone).
    pub fn slices(&self, len: u32, top: TopK, rows: u32, ctas: u32) -> Option<Slices> {
        if len <= top.k() {
            return Slices::new(len, 1).ok();
        }
        let want = slice_count(len, self.target.max(1));
        let spread = (ctas / rows.max(1)).max(1);
        let fewest = len.div_ceil(self.keys.max(1)).max(1);
        let start = if want > spread {
            fewest.max(spread)
        } else {
            want
        };
        (start..=MAX_SLICES.min(ctas))
            .filter_map(|count| Slices::new(len, count).ok())
            .find(|s| s.chunk() <= self.keys)
    }
}

/// One task of a [`SelectPlan`]: the row, the slice, the CTA, and the descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedTask {
    pub row: u32,
    pub slice: u32,
    pub cta: u32,
    pub task: Task,
}

/// The one-stage task list of a select launch: a task per row (one CTA or registers) or per slice
/// (a gang per row), on CTAs in turn, a rank a row. Descriptor arguments (device
/// `select_decode.h`): `[row, len, me | count << 16]`; no inputs (the fused launch adds the
/// completion boxes a task waits on) and no output boxes.
///
/// A row's slices are a gang: one rank, consecutive CTAs (modulo the grid), so every CTA reaches
/// its member after the tasks of earlier rows only, and a row's slices all run at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectPlan {
    ctas: u32,
    tasks: Vec<PlannedTask>,
}

impl SelectPlan {
    /// `kind` for every row of `lens`, on at most `ctas` CTAs, row `r`'s tasks at rank
    /// `first_order + r`; slices cut by `slicing`.
    pub fn new(
        lens: &[u32],
        kind: SelectKind,
        top: TopK,
        ctas: u32,
        slicing: Slicing,
        first_order: u32,
    ) -> Result<Self, LayoutError> {
        if lens.is_empty() {
            return Err(LayoutError::NoRows);
        }
        if ctas == 0 {
            return Err(LayoutError::NoCtas);
        }
        let rows = lens.len() as u32;
        let mut tasks = Vec::new();
        let mut cta = 0u32;
        for (row, &len) in lens.iter().enumerate() {
            if len > MAX_ROW_KEYS {
                return Err(LayoutError::RowTooLong { len });
            }
            let count = match kind {
                SelectKind::Slice => slicing
                    .slices(len, top, rows, ctas)
                    .ok_or(LayoutError::TooFewCtas {
                        row,
                        len,
                        count: len.div_ceil(slicing.keys.max(1)),
                        keys: slicing.keys,
                        ctas,
                    })?
                    .count(),
                SelectKind::OneCta | SelectKind::Registers => 1,
            };
            for slice in 0..count {
                let args = match kind {
                    SelectKind::Slice => [row as u32, len, slice | count << 16],
                    SelectKind::OneCta | SelectKind::Registers => [row as u32, len, 0],
                };
                let order = first_order + row as u32;
                let task = Task::new(kind.kind(), order, BoxRange::default(), &[], args)
                    .expect("no inputs");
                tasks.push(PlannedTask {
                    row: row as u32,
                    slice,
                    cta,
                    task,
                });
                cta = (cta + 1) % ctas;
            }
        }
        Ok(SelectPlan {
            ctas: ctas.min(tasks.len() as u32),
            tasks,
        })
    }

    /// CTAs the plan uses.
    pub fn ctas(&self) -> u32 {
        self.ctas
    }

    pub fn tasks(&self) -> &[PlannedTask] {
        &self.tasks
    }

    /// For wiring inputs (the completion boxes a task waits on) and other stages' orders.
    pub fn tasks_mut(&mut self) -> &mut [PlannedTask] {
        &mut self.tasks
    }

    /// Gives every task the box it puts once its part of its row's list is written
    /// ([`SelectBoxes::list`] for a one-task kind and a row's slice 0; [`SelectBoxes::gang`] for
    /// the other slices), and a row's slice 0 of several the other slices' gang boxes as its last
    /// input range (it waits on them after its own part, before it puts the list box), so that a
    /// reader of the lists waits on one box a row. Call it after the inputs are wired.
    pub fn publish(&mut self, boxes: &SelectBoxes) -> Result<(), LayoutError> {
        let missing = |t: &PlannedTask| LayoutError::NotInLayout {
            row: t.row,
            slice: t.slice,
        };
        for t in &mut self.tasks {
            let count = t.task.args[2] >> 16;
            // A slot, its padding included, is its one writer's; the box is its first.
            let (region, slot) = if t.slice == 0 {
                (&boxes.list, t.row)
            } else {
                (&boxes.gang, t.row * MAX_SLICES + t.slice)
            };
            let first = region.box_index(slot, 0).ok_or_else(|| missing(t))?;
            t.task.out = BoxRange::new(first, region.stride());
            if t.slice == 0 && count > 1 {
                let first = boxes.gang_box(t.row, 1).ok_or_else(|| missing(t))?;
                boxes.gang_box(t.row, count - 1).ok_or_else(|| missing(t))?;
                let mut inputs = t.task.inputs().to_vec();
                inputs.push(BoxRange::new(first, (count - 1) * boxes.gang.stride()));
                t.task = Task::new(t.task.kind, t.task.order, t.task.out, &inputs, t.task.args)
                    .map_err(|_| LayoutError::TooManyInputs { row: t.row })?;
            }
        }
        Ok(())
    }

    /// Every CTA's list, in order.
    pub fn placement(&self) -> Placement {
        let mut lists = vec![Vec::new(); self.ctas as usize];
        for t in &self.tasks {
            lists[t.cta as usize].push(t.task);
        }
        Placement::new(lists)
    }
}

/// The select stage's boxes in a launch's scratch.
#[derive(Clone, Copy, Debug)]
pub struct SelectBoxes {
    /// One slot per (row, round, slice): that slice's digit histogram of that round.
    pub hist: Region<u32>,
    /// One slot per row: the keys sharing the prefix P, in position order, as (key, position)
    /// pairs in boxes 2i and 2i + 1, staged by every slice for the row's first slice.
    pub cand: Region<u32>,
    /// One box per row, a line each: the row's list is written (put after a release, valued
    /// with the row). What a reader of the list waits on before it reads the entries.
    pub list: Region<u32>,
    /// One box per (row, slice), a line each: that slice's part of the row's list is written
    /// (put after a release). Slice 0 waits on the others' before it puts the list box.
    pub gang: Region<u32>,
}

impl SelectBoxes {
    /// Adds the regions `<name>_hist` and `<name>_cand` for `rows` rows.
    pub fn add(
        builder: &mut LayoutBuilder,
        name: &str,
        rows: u32,
        top: TopK,
    ) -> Result<Self, LayoutError> {
        let slots = rows
            .checked_mul(ROUNDS * MAX_SLICES)
            .ok_or(BoxLayoutError::TooLarge {
                boxes: rows as u64 * (ROUNDS * MAX_SLICES * HIST_BOXES) as u64,
            })?;
        let hist = builder.region::<u32>(&format!("{name}_hist"), slots, HIST_BOXES)?;
        let cand = builder.region::<u32>(&format!("{name}_cand"), rows, 2 * top.room())?;
        let list = builder.region::<u32>(&format!("{name}_list"), rows, 1)?;
        let gang_slots = rows
            .checked_mul(MAX_SLICES)
            .ok_or(BoxLayoutError::TooLarge {
                boxes: rows as u64 * MAX_SLICES as u64,
            })?;
        let gang = builder.region::<u32>(&format!("{name}_gang"), gang_slots, 1)?;
        Ok(SelectBoxes {
            hist,
            cand,
            list,
            gang,
        })
    }

    /// The box a reader of `row`'s list waits on, as an input range.
    pub fn list_ready(&self, row: u32) -> Option<BoxRange> {
        self.list.slot(row)
    }

    /// The box slice `slice` of `row` puts once its part of the list is written. (device)
    pub fn gang_box(&self, row: u32, slice: u32) -> Option<u32> {
        if slice >= MAX_SLICES {
            return None;
        }
        self.gang.box_index(row * MAX_SLICES + slice, 0)
    }

    /// First box of the histogram of (row, round, slice). (device)
    pub fn hist_box(&self, row: u32, round: u32, slice: u32) -> Option<u32> {
        if round >= ROUNDS || slice >= MAX_SLICES {
            return None;
        }
        self.hist
            .box_index((row * ROUNDS + round) * MAX_SLICES + slice, 0)
    }

    /// Box `i` of `row`'s candidates: candidate `i / 2`'s key for even `i`, its position for odd.
    /// (device)
    pub fn cand_box(&self, row: u32, i: u32) -> Option<u32> {
        self.cand.box_index(row, i)
    }
}
