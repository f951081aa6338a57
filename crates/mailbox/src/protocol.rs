//! The tagged-pair protocol on CPU atomics, step for step what `kernels/mailbox.h` does on the
//! device: a producer stores (tag, value) in one relaxed store; a consumer polls until the tag is
//! its launch's and takes the value from the same word. Data beside the boxes is the one case that
//! needs ordering: [`publish`] before the puts, [`acquire`] after the waits.
//!
//! It is generic over [`BoxWord`] so that loom can model-check the very same functions.

use crate::layout::{pack, tag_of, value_of};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// A 64-bit atomic box: std's `AtomicU64`, or a loom one in the model-checking tests.
pub trait BoxWord: Sync {
    fn load(&self, order: Ordering) -> u64;
    fn store(&self, word: u64, order: Ordering);
    /// A fence of the same memory model as the word.
    fn fence(order: Ordering);
    /// Called between polls; `polls` counts the polls so far.
    fn backoff(polls: u64);
}

impl BoxWord for AtomicU64 {
    fn load(&self, order: Ordering) -> u64 {
        AtomicU64::load(self, order)
    }
    fn store(&self, word: u64, order: Ordering) {
        AtomicU64::store(self, word, order)
    }
    fn fence(order: Ordering) {
        std::sync::atomic::fence(order)
    }
    fn backoff(polls: u64) {
        // Spin briefly for latency, then yield: the emulator runs more CTA threads than cores.
        if polls < 64 {
            std::hint::spin_loop()
        } else {
            std::thread::yield_now()
        }
    }
}

/// How a consumer polls; the device header selects the same two with `MBX_POLL_ACQUIRE`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PollMode {
    /// Relaxed loads; [`acquire`] is then one acquire fence (only needed for side data).
    #[default]
    RelaxedThenFence,
    /// Acquire loads; [`acquire`] is then nothing.
    Acquire,
}

impl PollMode {
    fn load_order(self) -> Ordering {
        match self {
            PollMode::RelaxedThenFence => Ordering::Relaxed,
            PollMode::Acquire => Ordering::Acquire,
        }
    }

    fn after_polls<W: BoxWord>(self) {
        if self == PollMode::RelaxedThenFence {
            W::fence(Ordering::Acquire);
        }
    }
}

/// How long a waiter keeps polling before it gives up and reports. With a poll count and a
/// deadline both, it gives up only once both are past: a waiter that a loaded machine keeps off
/// the CPU polls seldom, so it keeps waiting for a producer that is merely slow to be scheduled,
/// where a deadline alone would give up on it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Patience<'a> {
    /// Give up after this many failed polls in one wait (the device's `MBX_POLL_LIMIT`).
    pub max_polls: Option<u64>,
    /// Give up at this instant (checked every 64 polls).
    pub deadline: Option<Instant>,
    /// Give up when this flag is raised, because another waiter already gave up.
    pub abort: Option<&'a AtomicBool>,
}

/// A wait that gave up: the box (by index within the waited slice) and the last word it held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotReady {
    pub index: usize,
    pub seen: u64,
    pub polls: u64,
}

impl Patience<'_> {
    /// Unbounded: only for waits the placement rule guarantees to end.
    pub const FOREVER: Patience<'static> = Patience {
        max_polls: None,
        deadline: None,
        abort: None,
    };

    fn expired(&self, polls: u64) -> bool {
        if self.abort.is_some_and(|a| a.load(Ordering::Relaxed)) {
            return true;
        }
        if self.max_polls.is_none() && self.deadline.is_none() {
            return false;
        }
        self.max_polls.is_none_or(|m| polls >= m)
            && self
                .deadline
                .is_none_or(|d| polls & 63 == 0 && Instant::now() >= d)
    }
}

/// One store of (tag, value). The pair carries its value, so the store is relaxed; to publish
/// other data beside it, call [`publish`] first (and the consumer [`acquire`] after its wait).
pub fn put<W: BoxWord>(cell: &W, tag: u32, value: u32) {
    cell.store(pack(tag, value), Ordering::Relaxed);
}

/// A row of values as tagged pairs (`min(row.len(), values.len())` of them). The row carries its
/// own data and the consumer polls the data itself, so the stores are relaxed: no flag, no drain.
/// To publish other data beside a row, call [`publish`] first.
pub fn put_row<W: BoxWord>(row: &[W], tag: u32, values: &[u32]) {
    for (cell, &v) in row.iter().zip(values) {
        cell.store(pack(tag, v), Ordering::Relaxed);
    }
}

/// A release fence: orders this thread's earlier writes before its later relaxed box stores
/// (`mbx_publish` on the device).
pub fn publish<W: BoxWord>() {
    W::fence(Ordering::Release);
}

/// After a wait, before reading data a producer published beside its boxes: an acquire fence
/// after relaxed polls, nothing after acquire polls (`mbx_acquire` on the device). Reading only the
/// boxes' own values needs no fence: each value arrives in the same word as its tag.
pub fn acquire<W: BoxWord>(mode: PollMode) {
    mode.after_polls::<W>();
}

/// One poll: `Ok(value)` when the box holds `tag`, else `Err(word)`. A box with any other tag, the previous launch's included, is not ready.
pub fn poll<W: BoxWord>(cell: &W, tag: u32, mode: PollMode) -> Result<u32, u64> {
    let word = cell.load(mode.load_order());
    if tag_of(word) == tag {
        Ok(value_of(word))
    } else {
        Err(word)
    }
}

/// Waits until the box holds `tag`; returns its value.
pub fn wait<W: BoxWord>(
    cell: &W,
    tag: u32,
    mode: PollMode,
    patience: &Patience,
) -> Result<u32, NotReady> {
    let mut out = [0u32];
    wait_all(std::slice::from_ref(cell), tag, mode, patience, &mut out)?;
    Ok(out[0])
}

/// Waits until every box of `row` holds `tag`. Values land in `out` (`min` of the two lengths). Boxes are polled in turn; a box found ready stays ready (its one writer
/// writes it once per launch), so this ends when polling them all at once, as a wave does, would.
pub fn wait_all<W: BoxWord>(
    row: &[W],
    tag: u32,
    mode: PollMode,
    patience: &Patience,
    out: &mut [u32],
) -> Result<(), NotReady> {
    let n = row.len().min(out.len());
    let mut ready = 0;
    let mut polls: u64 = 0;
    while ready < n {
        match poll(&row[ready], tag, mode) {
            Ok(v) => {
                out[ready] = v;
                ready += 1;
                continue;
            }
            Err(seen) => {
                polls += 1;
                if patience.expired(polls) {
                    return Err(NotReady {
                        index: ready,
                        seen,
                        polls,
                    });
                }
                W::backoff(polls);
            }
        }
    }
    Ok(())
}
