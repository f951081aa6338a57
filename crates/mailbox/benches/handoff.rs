//! Hand-off latency of the CPU protocol between two threads (ping-pong through two boxes), one box
//! and a 64-word row, relaxed polls + fence vs acquire polls. A hand-off is half a round trip.
//! `cargo bench -p mailbox --bench handoff`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use mailbox::protocol::{put_row, wait_all, Patience, PollMode};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Two rows of boxes on separate lines: `ping` written by the main thread, `pong` by the echo thread.
#[repr(align(128))]
struct Row([AtomicU64; 64]);

fn row() -> Row {
    Row(std::array::from_fn(|_| AtomicU64::new(0)))
}

/// `iters` round trips; returns the time of all of them.
fn round_trips(words: usize, mode: PollMode, iters: u64) -> Duration {
    let (ping, pong) = (row(), row());
    let stop = AtomicBool::new(false);
    let patience = Patience {
        abort: Some(&stop),
        ..Patience::FOREVER
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut got = vec![0u32; words];
            for tag in 1.. {
                if wait_all(&ping.0[..words], tag, mode, &patience, &mut got).is_err() {
                    return;
                }
                put_row(&pong.0[..words], tag, &got);
            }
        });
        let values: Vec<u32> = (0..words as u32).collect();
        let mut got = vec![0u32; words];
        let start = Instant::now();
        for tag in 1..=iters as u32 {
            put_row(&ping.0[..words], tag, &values);
            wait_all(&pong.0[..words], tag, mode, &Patience::FOREVER, &mut got).ok();
        }
        let elapsed = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        elapsed
    })
}

fn handoff(c: &mut Criterion) {
    let mut g = c.benchmark_group("cpu_round_trip");
    g.measurement_time(Duration::from_secs(3));
    for (name, mode) in [
        ("relaxed_fence", PollMode::RelaxedThenFence),
        ("acquire", PollMode::Acquire),
    ] {
        for words in [1usize, 64] {
            g.bench_with_input(BenchmarkId::new(name, words), &words, |b, &w| {
                b.iter_custom(|iters| round_trips(w, mode, iters))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, handoff);
criterion_main!(benches);
