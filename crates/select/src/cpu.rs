//! The select kernels in CPU form, step for step what `kernels/select.h` does on the device.
//!
//! Multi-slice: one thread per slice of every row, all at once (as the CTAs of a launch). Per
//! round, each slice publishes the 64-bin digit histogram of its keys under the prefix found so far
//! (32 tagged pairs of 16-bit counts; rounds go in pairs, counted together in the first of the
//! two, `descent::pair_histogram`) and waits for every other slice's, through the mailbox
//! crate's CPU protocol on a shared scratch. From the sum each finds the digit holding the k-th
//! key, how many keys above it lie in the slices before its own, and whether the descent stops.
//! Then each places its keys above the prefix P; at 32 bits the ties take their places directly,
//! otherwise the keys sharing P are staged ((key, position) pairs, in position order) for the
//! row's first slice, which finds the rest of T with wide digits (two 10-bit passes from 12 bits,
//! one 8-bit pass from 24) and places them.
//!
//! One CTA, a row of at most [`ONE_CTA_ROOM`] keys (kept in LDS): wide digits over the whole row
//! (8 bits, then 12 + 12 over the keys sharing the prefix), then one placement pass in position
//! order. A longer row:
//! the multi-slice steps with a single slice and nothing exchanged.
//!
//! Registers, a row of at most [`REG_MAX_ROW`] keys: a 12-bit digit over the whole row; then, over
//! the keys sharing T's 12-bit prefix when they fit the stage (staged in position order), an 8-bit
//! digit and ranks among the few keys sharing T's 20-bit prefix (or a last 12-bit digit), else
//! digits of 12 and 8 bits over the whole row; then one placement pass in position order.

use crate::descent::{
    digit, pack_hist, pair_histogram, row_sums, unpack_hist, wide_histogram, Cut, Descent, Kind,
    LostKeys,
};
use crate::layout::{
    reg_staged_room, LayoutError, SelectBoxes, Slices, TopK, FIRST_BITS, HIST_BOXES, ONE_CTA_ROOM,
    REG_MAX_ROW, REG_RANK_ROOM, WIDE_BITS,
};
use crate::reference::{radix_key, Pages, Rows, SelectError};
use mailbox::protocol::{put_row, wait_all, NotReady, Patience, PollMode};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// An entry no slice has written (the output is filled with it first).
const UNWRITTEN: i32 = i32::MIN;
/// How long one wait may take before the launch is declared stuck.
const PATIENCE: Duration = Duration::from_secs(20);

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CpuError {
    #[error(transparent)]
    Input(#[from] SelectError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("{rows} rows need {rows} slicings, got {slicings}")]
    Slicings { rows: usize, slicings: usize },
    #[error("row {row}: its slicing covers {covers} keys, the row has {len}")]
    SlicingLength { row: usize, covers: u32, len: u32 },
    #[error("row {row} holds a NaN score")]
    Nan { row: usize },
    #[error("row {row} slice {slice}: a wait gave up on box {box_index} (it held {seen:#018x})")]
    Stalled {
        row: usize,
        slice: u32,
        box_index: u32,
        seen: u64,
    },
    #[error("row {row} slice {slice}: {source}")]
    Lost {
        row: usize,
        slice: u32,
        source: LostKeys,
    },
    #[error("row {row} slice {slice}: boxes {first}..{end} are not in the select regions")]
    PastRegion {
        row: usize,
        slice: u32,
        first: u32,
        end: u64,
    },
    #[error("row {row}: entry {index} is past k or was written twice")]
    Overwritten { row: usize, index: u32 },
    #[error("row {row}: entry {index} was never written")]
    Unwritten { row: usize, index: u32 },
    #[error("a slice thread panicked")]
    Panicked,
}

/// The output `[rows, k]`, each entry written once.
struct Out {
    entries: Vec<AtomicI32>,
    k: u32,
}

impl Out {
    fn new(rows: usize, k: u32) -> Self {
        Out {
            entries: (0..rows * k as usize)
                .map(|_| AtomicI32::new(UNWRITTEN))
                .collect(),
            k,
        }
    }

    fn put(&self, row: usize, index: u32, value: i32) -> Result<(), CpuError> {
        let cell = (index < self.k)
            .then(|| &self.entries[row * self.k as usize + index as usize])
            .ok_or(CpuError::Overwritten { row, index })?;
        cell.compare_exchange(UNWRITTEN, value, Ordering::Relaxed, Ordering::Relaxed)
            .map(|_| ())
            .map_err(|_| CpuError::Overwritten { row, index })
    }

    fn finish(self) -> Result<Vec<i32>, CpuError> {
        let k = self.k as usize;
        let out: Vec<i32> = self.entries.into_iter().map(|e| e.into_inner()).collect();
        match out.iter().position(|&e| e == UNWRITTEN) {
            Some(i) => Err(CpuError::Unwritten {
                row: i / k,
                index: (i % k) as u32,
            }),
            None => Ok(out),
        }
    }
}

/// How a slice trades histograms and candidates with the other slices of its row.
trait Exchange {
    /// Publishes this slice's histogram of `round` and returns every slice's, by slice.
    fn all_gather(&self, round: usize, mine: &[u32; 64]) -> Result<Vec<[u32; 64]>, CpuError>;
    /// Stages candidates (key, position) at `first..` of the row's candidate list.
    fn stage(&self, first: u32, pairs: &[(u32, u32)]) -> Result<(), CpuError>;
    /// The row's first `n` candidates (first slice only, after every slice staged).
    fn collect(&self, n: u32) -> Result<Vec<(u32, u32)>, CpuError>;
}

/// What every slice of a launch shares.
struct Shared<'a> {
    rows: &'a Rows<'a>,
    top: TopK,
    pages: Option<&'a Pages<'a>>,
    out: Out,
    nan: Vec<AtomicBool>,
}

impl Shared<'_> {
    fn entry(&self, row: usize, pos: u32) -> Result<i32, CpuError> {
        Ok(match self.pages {
            Some(pages) => pages.slot(row, pos)?,
            None => pos as i32,
        })
    }

    /// The radix key of `pos`; a NaN raises the row's flag and still yields its key.
    fn key(&self, row: usize, pos: u32) -> u32 {
        let s = self.rows.scores[row * self.rows.stride + pos as usize];
        if s.is_nan() {
            self.nan[row].store(true, Ordering::Relaxed);
        }
        radix_key(s)
    }

    /// One slice (positions `range`, slice `me` of the row): the whole task of one CTA.
    fn slice<X: Exchange>(
        &self,
        x: &X,
        row: usize,
        range: std::ops::Range<u32>,
        me: u32,
    ) -> Result<(), CpuError> {
        let (k, len) = (self.top.k(), self.rows.lens[row]);
        let first = range.start;
        let keys: Vec<(u32, u32)> = range.map(|pos| (pos, self.key(row, pos))).collect();
        if len <= k {
            // Every key is selected and entry i is position i.
            self.place(row, first, keys.iter().map(|kp| kp.0), false)?;
            if me == 0 {
                for index in len..k {
                    self.out.put(row, index, -1)?;
                }
            }
            return Ok(());
        }
        let mut d = Descent::start(k, len);
        let lost = |source| CpuError::Lost {
            row,
            slice: me,
            source,
        };
        // Two rounds an iteration: the stops end a pair (descent::pair_histogram).
        while !d.stopped(self.top.room()) {
            let pairs = pair_histogram(keys.iter().map(|kp| kp.1), d.prefix, d.round);
            let all = x.all_gather(d.round, &row_sums(&pairs))?;
            d.step(&all, me as usize).map_err(lost)?;
            let chosen = digit(d.prefix.bits, d.round - 1) as usize;
            let all = x.all_gather(d.round, &pairs[chosen])?;
            d.step(&all, me as usize).map_err(lost)?;
        }
        let above = keys.iter().filter(|kp| d.prefix.key_above(kp.1));
        self.place(row, d.above_before, above.map(|kp| kp.0), false)?;
        if let Some(t) = d.threshold() {
            let ties = keys.iter().filter(|kp| kp.1 == t);
            return self.place(row, d.above + d.sharing_before, ties.map(|kp| kp.0), true);
        }
        let staged: Vec<(u32, u32)> = keys
            .iter()
            .filter(|kp| d.prefix.matches(kp.1))
            .map(|&(pos, key)| (key, pos))
            .collect();
        x.stage(d.sharing_before, &staged)?;
        if me == 0 {
            self.resolve(x, row, d)?;
        }
        Ok(())
    }

    /// The first slice: finds the rest of T with wide digits over the candidates and places them.
    /// (With at most a wave of candidates the device ranks them directly, `sel_tail_wave`: the
    /// same T and the same list.)
    fn resolve<X: Exchange>(&self, x: &X, row: usize, stop: Descent) -> Result<(), CpuError> {
        let cands = x.collect(stop.sharing)?;
        let keys: Vec<u32> = cands.iter().map(|c| c.0).collect();
        let mut d = stop;
        d.wide_finish(&keys).map_err(|source| CpuError::Lost {
            row,
            slice: 0,
            source,
        })?;
        self.place_cut(
            row,
            &Cut::new(&stop, &d),
            cands.iter().map(|&(key, pos)| (pos, key)),
        )
    }

    /// A row on one CTA: its length, its (position, key) pairs and its keys.
    fn whole_row(&self, row: usize) -> (u32, Vec<(u32, u32)>, Vec<u32>) {
        let len = self.rows.lens[row];
        let pairs: Vec<(u32, u32)> = (0..len).map(|pos| (pos, self.key(row, pos))).collect();
        let keys = pairs.iter().map(|kp| kp.1).collect();
        (len, pairs, keys)
    }

    /// The one CTA over a row kept in LDS: 8 bits over every key, then 12 and 12 over the keys
    /// sharing the prefix; P is T's 12-bit prefix when the keys sharing it fit the room, else its
    /// 24-bit prefix when those fit, else T; then one pass in position order places the list.
    fn one_cta_lds(&self, row: usize) -> Result<(), CpuError> {
        let (len, pairs, keys) = self.whole_row(row);
        let lost = |source| CpuError::Lost {
            row,
            slice: 0,
            source,
        };
        let room = self.top.room();
        let hist = |d: &Descent, width| wide_histogram(keys.iter().copied(), d.prefix, width);
        let mut d = Descent::start(self.top.k(), len);
        d.wide_step(&hist(&d, FIRST_BITS), FIRST_BITS)
            .map_err(lost)?;
        let p12 = d.wide_step_grouped(&hist(&d, WIDE_BITS)).map_err(lost)?;
        let p24 = d.wide_step_grouped(&hist(&d, WIDE_BITS)).map_err(lost)?;
        let cut = if p12.sharing <= room {
            Cut::at_group(&p12, &d)
        } else if p24.sharing <= room {
            Cut::at_group(&p24, &d)
        } else {
            Cut::new(&d, &d)
        };
        self.place_cut(row, &cut, pairs.into_iter())
    }

    /// The registers kernel over a row of more than k keys (`sel_regs_task`): a 12-bit digit over
    /// every key of the row. When at most [`reg_staged_room`] keys share T's 12-bit prefix, that
    /// is P: those keys are staged in position order, an 8-bit digit over them gives T's 20-bit
    /// prefix, and T is found by ranks among the keys sharing it when there are at most
    /// [`REG_RANK_ROOM`], else by a 12-bit digit (`sel_regs_staged`). Otherwise digits of 12 and 8
    /// bits over every key give T, and P is T's 12-bit prefix when the keys sharing it fit the
    /// room, else its 24-bit one when those fit, else T. One pass in position order places the
    /// list.
    fn in_registers(&self, row: usize) -> Result<(), CpuError> {
        let (len, pairs, keys) = self.whole_row(row);
        let lost = |source| CpuError::Lost {
            row,
            slice: 0,
            source,
        };
        let mut d = Descent::start(self.top.k(), len);
        d.wide_step(
            &wide_histogram(keys.iter().copied(), d.prefix, WIDE_BITS),
            WIDE_BITS,
        )
        .map_err(lost)?;
        let p12 = d;
        let staged = p12.sharing <= reg_staged_room(self.top);
        let counted: Vec<u32> = if staged {
            keys.into_iter()
                .filter(|&k| p12.prefix.matches(k))
                .collect()
        } else {
            keys
        };
        // The staged keys take an 8-bit digit, then ranks where few share T's 20-bit prefix, else
        // the last 12 bits; every key takes 12 and 8 bits, which give T's 24-bit prefix for P.
        let widths = if staged {
            [8, WIDE_BITS]
        } else {
            [WIDE_BITS, 8]
        };
        let mut at = vec![p12];
        for (i, width) in widths.into_iter().enumerate() {
            if staged && i == 1 && d.sharing <= REG_RANK_ROOM {
                d.rank_finish(&counted).map_err(lost)?;
                break;
            }
            let hist = wide_histogram(counted.iter().copied(), d.prefix, width);
            d.wide_step(&hist, width).map_err(lost)?;
            at.push(d);
        }
        let room = self.top.room();
        let p = at[..2].iter().find(|p| p.sharing <= room).unwrap_or(&d);
        debug_assert!(
            !staged || p.prefix.len == 12,
            "a staged row stops at 12 bits"
        );
        self.place_cut(row, &Cut::new(p, &d), pairs.into_iter())
    }

    /// Places the (position, key) pairs the cut takes, in the order given (position order):
    /// above P from entry 0, sharing P above T from `above_p`, ties from `above_t` until k.
    fn place_cut(
        &self,
        row: usize,
        cut: &Cut,
        pairs: impl Iterator<Item = (u32, u32)>,
    ) -> Result<(), CpuError> {
        let (mut above_p, mut above_t, mut tie) = (0, cut.above_p, cut.above_t);
        for (pos, key) in pairs {
            let index = match cut.kind(key) {
                Kind::AboveP => &mut above_p,
                Kind::AboveT => &mut above_t,
                Kind::Tie => &mut tie,
                Kind::Out => continue,
            };
            let at = *index;
            *index += 1;
            if cut.kind(key) == Kind::Tie && at >= self.top.k() {
                continue;
            }
            self.out.put(row, at, self.entry(row, pos)?)?;
        }
        Ok(())
    }

    /// Writes `positions` to entries `first..` of the row; with `until_k` those past k are
    /// dropped (the ties beyond the k-th), otherwise an entry past k is an error.
    fn place(
        &self,
        row: usize,
        first: u32,
        positions: impl Iterator<Item = u32>,
        until_k: bool,
    ) -> Result<(), CpuError> {
        for (index, pos) in (first..).zip(positions) {
            if until_k && index >= self.top.k() {
                break;
            }
            self.out.put(row, index, self.entry(row, pos)?)?;
        }
        Ok(())
    }

    fn finish(self) -> Result<Vec<i32>, CpuError> {
        if let Some(row) = self.nan.iter().position(|f| f.load(Ordering::Relaxed)) {
            return Err(CpuError::Nan { row });
        }
        self.out.finish()
    }
}

fn shared<'a>(
    rows: &'a Rows<'a>,
    top: TopK,
    pages: Option<&'a Pages<'a>>,
) -> Result<Shared<'a>, CpuError> {
    rows.check()?;
    Ok(Shared {
        rows,
        top,
        pages,
        out: Out::new(rows.count(), top.k()),
        nan: (0..rows.count()).map(|_| AtomicBool::new(false)).collect(),
    })
}

/// One slice, nothing to trade.
struct Alone {
    staged: Mutex<Vec<(u32, u32)>>,
}

impl Exchange for Alone {
    fn all_gather(&self, _round: usize, mine: &[u32; 64]) -> Result<Vec<[u32; 64]>, CpuError> {
        Ok(vec![*mine])
    }

    fn stage(&self, _first: u32, pairs: &[(u32, u32)]) -> Result<(), CpuError> {
        let mut staged = self.staged.lock().map_err(|_| CpuError::Panicked)?;
        staged.extend_from_slice(pairs);
        Ok(())
    }

    fn collect(&self, _n: u32) -> Result<Vec<(u32, u32)>, CpuError> {
        let mut staged = self.staged.lock().map_err(|_| CpuError::Panicked)?;
        Ok(std::mem::take(&mut *staged))
    }
}

/// The one-CTA select of every row, `[rows, k]` (positions, or slots with `pages`).
pub fn select_one_cta(rows: &Rows, top: TopK, pages: Option<&Pages>) -> Result<Vec<i32>, CpuError> {
    let s = shared(rows, top, pages)?;
    for row in 0..rows.count() {
        let len = rows.lens[row];
        if len > top.k() && len <= ONE_CTA_ROOM {
            s.one_cta_lds(row)?;
            continue;
        }
        let alone = Alone {
            staged: Mutex::new(Vec::new()),
        };
        s.slice(&alone, row, 0..rows.lens[row], 0)?;
    }
    s.finish()
}

/// The registers kernel's select of every row, `[rows, k]`; a row longer than [`REG_MAX_ROW`]
/// is an error, as on the device.
pub fn select_in_registers(
    rows: &Rows,
    top: TopK,
    pages: Option<&Pages>,
) -> Result<Vec<i32>, CpuError> {
    let s = shared(rows, top, pages)?;
    for row in 0..rows.count() {
        let len = rows.lens[row];
        if len > REG_MAX_ROW {
            return Err(LayoutError::TooLongForRegisters {
                len,
                block: crate::layout::REG_BLOCK,
            }
            .into());
        }
        if len > top.k() {
            s.in_registers(row)?;
            continue;
        }
        let alone = Alone {
            staged: Mutex::new(Vec::new()),
        };
        s.slice(&alone, row, 0..len, 0)?;
    }
    s.finish()
}

/// A slice's side of the tagged-pair exchange.
struct Boxes<'a> {
    scratch: &'a [AtomicU64],
    boxes: &'a SelectBoxes,
    tag: u32,
    row: u32,
    me: u32,
    count: u32,
    abort: &'a AtomicBool,
}

impl Boxes<'_> {
    /// `n` boxes from `first`, which `region_end` (one past the region's last box) must contain.
    fn cells(
        &self,
        first: Option<u32>,
        n: u32,
        region_end: Option<u32>,
    ) -> Result<&[AtomicU64], CpuError> {
        let start = first.unwrap_or(u32::MAX) as u64;
        let end = start + n as u64;
        let fits = region_end.is_some_and(|e| end <= e as u64);
        fits.then(|| self.scratch.get(start as usize..end as usize))
            .flatten()
            .ok_or(CpuError::PastRegion {
                row: self.row as usize,
                slice: self.me,
                first: start as u32,
                end,
            })
    }

    fn wait(&self, cells: &[AtomicU64], out: &mut [u32]) -> Result<(), CpuError> {
        let patience = Patience {
            max_polls: None,
            deadline: Some(Instant::now() + PATIENCE),
            abort: Some(self.abort),
        };
        wait_all(cells, self.tag, PollMode::default(), &patience, out).map_err(
            |NotReady { index, seen, .. }| {
                self.abort.store(true, Ordering::Relaxed);
                let base = (cells.as_ptr() as usize - self.scratch.as_ptr() as usize)
                    / std::mem::size_of::<AtomicU64>();
                CpuError::Stalled {
                    row: self.row as usize,
                    slice: self.me,
                    box_index: (base + index) as u32,
                    seen,
                }
            },
        )
    }

    fn cand_end(&self) -> Option<u32> {
        self.boxes
            .cand_box(self.row, self.boxes.cand.words() - 1)
            .map(|b| b + 1)
    }
}

impl Exchange for Boxes<'_> {
    fn all_gather(&self, round: usize, mine: &[u32; 64]) -> Result<Vec<[u32; 64]>, CpuError> {
        let round = round as u32;
        let own = self.boxes.hist_box(self.row, round, self.me);
        let own = self.cells(own, HIST_BOXES, own.map(|b| b + HIST_BOXES))?;
        put_row(own, self.tag, &pack_hist(mine));
        // The slots of one round are consecutive (stride = HIST_BOXES): one wait covers them all.
        let first = self.boxes.hist_box(self.row, round, 0);
        let last = self.boxes.hist_box(self.row, round, self.count - 1);
        let n = self.count * HIST_BOXES;
        let all = self.cells(first, n, last.map(|b| b + HIST_BOXES))?;
        let mut words = vec![0u32; n as usize];
        self.wait(all, &mut words)?;
        Ok(words.chunks(HIST_BOXES as usize).map(unpack_hist).collect())
    }

    fn stage(&self, first: u32, pairs: &[(u32, u32)]) -> Result<(), CpuError> {
        let start = self.boxes.cand_box(self.row, 0).map(|b| b + 2 * first);
        let cells = self.cells(start, 2 * pairs.len() as u32, self.cand_end())?;
        let words: Vec<u32> = pairs.iter().flat_map(|&(key, pos)| [key, pos]).collect();
        put_row(cells, self.tag, &words);
        Ok(())
    }

    fn collect(&self, n: u32) -> Result<Vec<(u32, u32)>, CpuError> {
        let cells = self.cells(self.boxes.cand_box(self.row, 0), 2 * n, self.cand_end())?;
        let mut words = vec![0u32; 2 * n as usize];
        self.wait(cells, &mut words)?;
        Ok(words.chunks(2).map(|w| (w[0], w[1])).collect())
    }
}

/// The scratch of a multi-slice launch and the launch's tag.
pub struct Exchanged<'a> {
    pub scratch: &'a mailbox::Scratch,
    pub boxes: &'a SelectBoxes,
    pub tag: u32,
}

/// The multi-slice select of every row, `[rows, k]`, row `r` cut by `slicing[r]` (the kernel
/// uses [`crate::layout::select_slices`]; any tiling gives the same list). One thread per slice.
pub fn select_multi_slice(
    rows: &Rows,
    top: TopK,
    pages: Option<&Pages>,
    slicing: &[Slices],
    via: &Exchanged,
) -> Result<Vec<i32>, CpuError> {
    let s = shared(rows, top, pages)?;
    if slicing.len() != rows.count() {
        return Err(CpuError::Slicings {
            rows: rows.count(),
            slicings: slicing.len(),
        });
    }
    if let Some((row, sl)) = slicing
        .iter()
        .enumerate()
        .find(|(row, sl)| sl.len() != rows.lens[*row])
    {
        return Err(CpuError::SlicingLength {
            row,
            covers: sl.len(),
            len: rows.lens[row],
        });
    }
    let abort = AtomicBool::new(false);
    let results: Vec<Result<(), CpuError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = slicing
            .iter()
            .enumerate()
            .flat_map(|(row, sl)| (0..sl.count()).map(move |c| (row, sl, c)))
            .map(|(row, sl, c)| {
                let (s, abort) = (&s, &abort);
                scope.spawn(move || {
                    let x = Boxes {
                        scratch: via.scratch.boxes(),
                        boxes: via.boxes,
                        tag: via.tag,
                        row: row as u32,
                        me: c,
                        count: sl.count(),
                        abort,
                    };
                    let r = s.slice(&x, row, sl.range(c), c);
                    if r.is_err() {
                        abort.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(CpuError::Panicked)))
            .collect()
    });
    // Report the cause, not the stalls of the slices that gave up because of it.
    let mut errors: Vec<CpuError> = results.into_iter().filter_map(Result::err).collect();
    errors.sort_by_key(|e| matches!(e, CpuError::Stalled { .. }));
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => s.finish(),
    }
}
