//! Model checks of the protocol with loom: the library's own `put`/`wait` functions run on loom's
//! atomics (through `BoxWord`), and loom explores every interleaving and every weak-memory outcome.
//! The `should_panic` tests are the negative controls: the same shapes without the release or the
//! acquire fence, which loom must catch as a data race on the published payload. A check inside a
//! branch (a wait that succeeded, a wait that gave up) counts the executions that reach it, and
//! the test fails unless some do: a branch no interleaving reaches would check nothing.

use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicU64 as LoomU64;
use loom::sync::Arc;
use loom::thread;
use mailbox::layout::pack;
use mailbox::protocol::{
    acquire, publish, put, put_row, wait, wait_all, BoxWord, Patience, PollMode,
};
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many of loom's executions reached a branch, of how many ran. Counted outside loom (plain
/// atomics shared by every execution), so the counts survive the model run.
#[derive(Clone, Default)]
struct Reached {
    hits: std::sync::Arc<AtomicUsize>,
    runs: std::sync::Arc<AtomicUsize>,
}

impl Reached {
    fn run(&self) {
        self.runs.fetch_add(1, Ordering::Relaxed);
    }

    fn hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }

    /// Fails unless some execution reached the branch.
    fn assert_reached(&self, branch: &str) {
        let (hits, runs) = (
            self.hits.load(Ordering::Relaxed),
            self.runs.load(Ordering::Relaxed),
        );
        println!("{branch}: reached in {hits} of {runs} executions");
        assert!(hits > 0, "none of {runs} executions reached {branch}");
    }
}

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
/// box (holding the previous launch's tag at first), acquires, and reads the payload. Loom checks
/// every outcome: the stale pair is never taken as ready, and the wait sees the payload. The wait
/// always succeeds here (measured: in every execution), because the waiter's backoff yields to the
/// producer before its polls run out; `stale_tag_never_releases_a_waiter` covers giving up. The
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
        let value = wait(&*cell, NEW, mode, &POLLS)
            .unwrap_or_else(|e| panic!("the wait gave up, having seen {:#x}", e.seen));
        assert_eq!(value, 7);
        if acquire_after {
            acquire::<Cell>(mode);
        }
        assert_eq!(payload.with(|p| unsafe { *p }), 42);
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
    let ready = Reached::default();
    let ready_in = ready.clone();
    loom::model(move || {
        ready_in.run();
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
            ready_in.hit();
        }
        for w in writers {
            w.join().unwrap();
        }
    });
    ready.assert_reached("a wait_all that saw the whole row");
}

/// Data beside a row: `publish` then `put_row`; `wait_all` then `acquire` sees the data.
#[test]
fn publish_orders_data_before_a_row() {
    let ready = Reached::default();
    let ready_in = ready.clone();
    loom::model(move || {
        ready_in.run();
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
            ready_in.hit();
        }
        producer.join().unwrap();
    });
    ready.assert_reached("a wait_all that saw the row");
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

/// Negative control of the branch counts: a branch that no execution reaches (a wait on a box
/// nobody puts) fails its test.
#[test]
#[should_panic(expected = "none of")]
fn a_branch_no_execution_reaches_fails_its_test() {
    let ready = Reached::default();
    let ready_in = ready.clone();
    loom::model(move || {
        ready_in.run();
        let cell = Cell::new(pack(OLD, 0));
        if wait(&cell, NEW, PollMode::default(), &POLLS).is_ok() {
            ready_in.hit();
        }
    });
    ready.assert_reached("a wait on a box nobody puts");
}
