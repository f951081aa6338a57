//! Model checks of the protocol with loom: the library's own `put`/`wait` functions run on loom's
//! atomics (through `BoxWord`), and loom explores every interleaving and every weak-memory outcome.
//! The `should_panic` tests are the negative controls: the same shapes without the release or the
//! acquire fence, which loom must catch as a data race on the published payload.

use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicU64 as LoomU64;
use loom::sync::Arc;
use loom::thread;
use mailbox::layout::pack;
use mailbox::protocol::{
    acquire, publish, put, put_row, wait, wait_all, BoxWord, Patience, PollMode,
};
use std::sync::atomic::Ordering;

struct Cell(LoomU64);

impl Cell {
    fn new(word: u64) -> Self {
        Cell(LoomU64::new(word))
    }
}

impl BoxWord for Cell {
    fn load(&self, order: Ordering) -> u64 {
        self.0.load(order)
    }
    fn store(&self, word: u64, order: Ordering) {
        self.0.store(word, order)
    }
    fn fence(order: Ordering) {
        loom::sync::atomic::fence(order)
    }
    fn backoff(_polls: u64) {
        thread::yield_now()
    }
}

/// Bounded polls keep loom's state space finite; a wait that gives up is a legal outcome.
const POLLS: Patience<'static> = Patience {
    max_polls: Some(3),
    deadline: None,
    abort: None,
};
const OLD: u32 = 6;
const NEW: u32 = 7;

/// A producer writes a payload (plain memory), publishes, and puts the box; a consumer waits on the
/// box (holding the previous launch's tag at first), acquires, and reads the payload. Loom checks every
/// outcome: the stale pair is never taken as ready, and a successful wait sees the payload. The
/// negative controls leave out `publish` or `acquire`.
fn publish_and_wait(mode: PollMode, publish_first: bool, acquire_after: bool) {
    loom::model(move || {
        let payload = Arc::new(UnsafeCell::new(0u32));
        let cell = Arc::new(Cell::new(pack(OLD, 99)));
        let producer = {
            let (payload, cell) = (payload.clone(), cell.clone());
            thread::spawn(move || {
                payload.with_mut(|p| unsafe { *p = 42 });
                if publish_first {
                    publish::<Cell>();
                }
                put(&*cell, NEW, 7);
            })
        };
        match wait(&*cell, NEW, mode, &POLLS) {
            Ok(v) => {
                assert_eq!(v, 7);
                if acquire_after {
                    acquire::<Cell>(mode);
                }
                assert_eq!(payload.with(|p| unsafe { *p }), 42);
            }
            Err(e) => assert_eq!(
                e.seen,
                pack(OLD, 99),
                "gave up on anything but the stale box"
            ),
        }
        producer.join().unwrap();
    });
}

#[test]
fn relaxed_polls_then_fence_see_the_release() {
    publish_and_wait(PollMode::RelaxedThenFence, true, true);
}

#[test]
fn acquire_polls_see_the_release() {
    publish_and_wait(PollMode::Acquire, true, true);
}

/// A box that keeps a stale tag never releases its waiter, whatever the interleaving.
#[test]
fn stale_tag_never_releases_a_waiter() {
    loom::model(|| {
        let cell = Arc::new(Cell::new(pack(OLD, 99)));
        let other = {
            let cell = cell.clone();
            // A writer of other launches' tags (older and newer) races with the waiter.
            thread::spawn(move || {
                put(&*cell, OLD - 1, 1);
                put(&*cell, NEW + 1, 2);
            })
        };
        assert!(wait(&*cell, NEW, PollMode::default(), &POLLS).is_err());
        other.join().unwrap();
    });
}

/// Two producers fill the two halves of a row; one wait_all returns both, each from its own pair.
#[test]
fn wait_all_gets_every_word_of_a_row() {
    loom::model(|| {
        let row = Arc::new([Cell::new(pack(OLD, 0)), Cell::new(pack(OLD, 0))]);
        let writers: Vec<_> = [0usize, 1]
            .into_iter()
            .map(|half| {
                let row = row.clone();
                thread::spawn(move || put_row(&row[half..half + 1], NEW, &[10 + half as u32]))
            })
            .collect();
        let mut out = [0u32; 2];
        if wait_all(&row[..], NEW, PollMode::default(), &POLLS, &mut out).is_ok() {
            assert_eq!(out, [10, 11]);
        }
        for w in writers {
            w.join().unwrap();
        }
    });
}

/// Data beside a row: `publish` then `put_row`; `wait_all` then `acquire` sees the data.
#[test]
fn publish_orders_data_before_a_row() {
    loom::model(|| {
        let payload = Arc::new(UnsafeCell::new(0u32));
        let row = Arc::new([Cell::new(pack(OLD, 0))]);
        let producer = {
            let (payload, row) = (payload.clone(), row.clone());
            thread::spawn(move || {
                payload.with_mut(|p| unsafe { *p = 42 });
                publish::<Cell>();
                put_row(&row[..], NEW, &[3]);
            })
        };
        let mut out = [0u32];
        if wait_all(&row[..], NEW, PollMode::default(), &POLLS, &mut out).is_ok() {
            acquire::<Cell>(PollMode::default());
            assert_eq!((out[0], payload.with(|p| unsafe { *p })), (3, 42));
        }
        producer.join().unwrap();
    });
}

/// Negative control: a consumer that reads the side data without `acquire` after relaxed polls.
/// The tag can be seen while the payload write is not yet ordered before the read; loom reports it.
#[test]
#[should_panic(expected = "Causality violation")]
fn without_the_acquire_fence_loom_finds_the_race() {
    publish_and_wait(PollMode::RelaxedThenFence, true, false);
}

/// Negative control: a producer that puts the pair without `publish` before it.
#[test]
#[should_panic(expected = "Causality violation")]
fn without_publish_loom_finds_the_race() {
    publish_and_wait(PollMode::RelaxedThenFence, false, true);
}
