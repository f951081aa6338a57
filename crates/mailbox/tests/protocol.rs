//! The CPU protocol on std atomics: readiness is the tag, and a frozen tag takes stale values.

use mailbox::layout::pack;
use mailbox::protocol::{poll, put, put_row, wait, wait_all, NotReady, Patience, PollMode};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

fn bounded(polls: u64) -> Patience<'static> {
    Patience {
        max_polls: Some(polls),
        ..Patience::FOREVER
    }
}

#[test]
fn a_box_with_another_tag_is_not_ready() {
    let b = AtomicU64::new(pack(5, 111));
    for mode in [PollMode::RelaxedThenFence, PollMode::Acquire] {
        assert_eq!(poll(&b, 6, mode), Err(pack(5, 111)));
        assert_eq!(poll(&b, 4, mode), Err(pack(5, 111)));
        assert_eq!(
            wait(&b, 6, mode, &bounded(100)),
            Err(NotReady {
                index: 0,
                seen: pack(5, 111),
                polls: 100
            })
        );
        assert_eq!(poll(&b, 5, mode), Ok(111));
    }
}

/// The hazard the device-side epoch exists for. A box keeps the last launch's pair; if the next
/// launch reuses the tag (a graph replayed with its tag frozen), a consumer that polls before the
/// producer wrote takes the old value as ready. With the tag advanced, it waits for the new one.
#[test]
fn a_frozen_tag_takes_the_stale_value_and_an_advanced_one_waits() {
    let b = AtomicU64::new(0);
    put(&b, 7, 1000); // launch 1, tag 7, value 1000
    assert_eq!(wait(&b, 7, PollMode::default(), &bounded(10)), Ok(1000));

    // Launch 2 with the tag frozen at 7: before the producer writes 2000, the consumer is "ready".
    assert_eq!(
        wait(&b, 7, PollMode::default(), &bounded(10)),
        Ok(1000),
        "stale value taken"
    );

    // Launch 2 with tag 8: not ready until the producer writes.
    assert!(wait(&b, 8, PollMode::default(), &bounded(10)).is_err());
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            put(&b, 8, 2000);
        });
        assert_eq!(
            wait(&b, 8, PollMode::default(), &Patience::FOREVER),
            Ok(2000)
        );
    });
}

#[test]
fn wait_all_collects_a_row_written_by_another_thread() {
    let row: Vec<AtomicU64> = (0..64).map(|i| AtomicU64::new(pack(1, i))).collect();
    let values: Vec<u32> = (0..64).map(|i| 0xabc0_0000 + i).collect();
    let mut out = vec![0u32; 64];
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(10));
            put_row(&row, 2, &values);
        });
        wait_all(&row, 2, PollMode::Acquire, &Patience::FOREVER, &mut out).unwrap();
    });
    assert_eq!(out, values);
}

#[test]
fn patience_ends_on_deadline_on_both_bounds_and_on_abort() {
    let b = AtomicU64::new(0);
    let start = Instant::now();
    let by_deadline = Patience {
        deadline: Some(start + Duration::from_millis(50)),
        ..Patience::FOREVER
    };
    let e = wait(&b, 1, PollMode::default(), &by_deadline).unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(50) && e.seen == 0);

    // Both bounds: the wait gives up only once it is past the deadline and has polled that often,
    // so a waiter a loaded machine runs seldom does not give up on a slow producer.
    let start = Instant::now();
    let both = Patience {
        max_polls: Some(20_000),
        deadline: Some(start),
        ..Patience::FOREVER
    };
    assert!(wait(&b, 1, PollMode::default(), &both).unwrap_err().polls >= 20_000);
    let both = Patience {
        max_polls: Some(1),
        deadline: Some(start + Duration::from_millis(50)),
        ..Patience::FOREVER
    };
    wait(&b, 1, PollMode::default(), &both).unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(50));

    let flag = AtomicBool::new(true);
    let by_abort = Patience {
        abort: Some(&flag),
        ..Patience::FOREVER
    };
    assert_eq!(
        wait(&b, 1, PollMode::default(), &by_abort)
            .unwrap_err()
            .polls,
        1
    );
}
