//! The CPU emulator: valid placements of random DAGs finish and match the sequential oracle bit
//! for bit; placements that break the rule are rejected by the check, and when run anyway (the
//! negative controls) they hang, and the bounded waits name the stuck tasks and boxes.

use mailbox::emulator::{evaluate_sequential, run, run_unchecked, EmuConfig, EmuError, Scratch};
use mailbox::layout::{pack, BoxRange, BOXES_PER_LINE};
use mailbox::placement::{Limits, Placement, PlacementError};
use mailbox::protocol::PollMode;
use mailbox::synth::{DagShape, SynthDag, Synthetic, KIND_LEAF, KIND_MIX};
use mailbox::task::Task;
use mailbox::Stall;
use proptest::prelude::*;
use std::time::Duration;

fn limits(d: &SynthDag, ctas: u32) -> Limits {
    Limits {
        max_resident: ctas,
        scratch_boxes: d.layout.boxes(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every valid placement finishes and leaves the scratch (tags and values) exactly as the
    /// sequential evaluation does; then a second launch with the next tag on the same scratch
    /// and new inputs does too.
    #[test]
    fn valid_placements_match_the_sequential_oracle(
        seed in any::<u64>(),
        tasks in 1u32..60,
        ctas in 1u32..7,
        window in 1u32..24,
        acquire in any::<bool>(),
        round_robin in any::<bool>(),
    ) {
        let shape = DagShape { tasks, leaves: (tasks / 5).max(1), max_inputs: 4, max_row: 20, window };
        let d = SynthDag::random(seed, shape).unwrap();
        let p = if round_robin { d.place_round_robin(ctas) } else { d.place_random(ctas, seed) };
        let valid = p.check(limits(&d, ctas)).unwrap();
        let config = EmuConfig {
            mode: if acquire { PollMode::Acquire } else { PollMode::RelaxedThenFence },
            ..EmuConfig::default()
        };
        let scratch = Scratch::new(d.layout.boxes());
        let mut image = scratch.snapshot();
        for (tag, step) in [(1u32, 0u32), (2, 1)] {
            let inputs = d.random_inputs(seed.wrapping_add(tag as u64));
            let task_fn = Synthetic { inputs: &inputs, step };
            run(&valid, &scratch, tag, &config, &task_fn).unwrap();
            image = evaluate_sequential(valid.placement(), &image, tag, &task_fn).unwrap();
            prop_assert_eq!(scratch.snapshot(), image.clone());
        }
    }

    /// The check is sound on random breakage: whatever it accepts, the emulator finishes correctly.
    #[test]
    fn whatever_the_check_accepts_finishes(
        seed in any::<u64>(), tasks in 2u32..40, ctas in 1u32..5,
        moves in prop::collection::vec((any::<u32>(), any::<u32>(), any::<u32>()), 0..3),
    ) {
        let shape = DagShape { tasks, leaves: 2.min(tasks), max_inputs: 3, max_row: 8, window: 6 };
        let d = SynthDag::random(seed, shape).unwrap();
        let mut p = d.place_random(ctas, seed);
        // Move tasks to random positions of random CTAs.
        for (from, to, at) in moves {
            let lists = p.lists_mut();
            let from = (from % ctas) as usize;
            if lists[from].is_empty() { continue; }
            let n = lists[from].len();
            let t = lists[from].remove(at as usize % n);
            let to = (to % ctas) as usize;
            let at = at as usize % (lists[to].len() + 1);
            lists[to].insert(at, t);
        }
        if let Ok(valid) = p.check(limits(&d, ctas)) {
            let inputs = d.random_inputs(seed);
            let task_fn = Synthetic { inputs: &inputs, step: 3 };
            let scratch = Scratch::new(d.layout.boxes());
            run(&valid, &scratch, 9, &EmuConfig::default(), &task_fn).unwrap();
            let want = evaluate_sequential(valid.placement(), &vec![0; scratch.len()], 9, &task_fn).unwrap();
            prop_assert_eq!(scratch.snapshot(), want);
        }
    }
}

fn row(line: u32) -> BoxRange {
    BoxRange::new(line * BOXES_PER_LINE, 2)
}
fn leaf(order: u32, line: u32) -> Task {
    Task::new(KIND_LEAF, order, row(line), &[], [order, 0, u32::MAX]).unwrap()
}
fn mix(order: u32, line: u32, inputs: &[BoxRange]) -> Task {
    Task::new(KIND_MIX, order, row(line), inputs, [order, 0, u32::MAX]).unwrap()
}

const INPUTS: [u32; 2] = [5, 6];
const TAG: u32 = 3;

fn stuck(p: &Placement, resident: Option<u32>) -> Result<(), EmuError> {
    let scratch = Scratch::new(8 * BOXES_PER_LINE);
    let config = EmuConfig {
        timeout: Duration::from_millis(300),
        resident,
        ..EmuConfig::default()
    };
    run_unchecked(
        p,
        &scratch,
        TAG,
        &config,
        &Synthetic {
            inputs: &INPUTS,
            step: 0,
        },
    )
}

fn limits8(max_resident: u32) -> Limits {
    Limits {
        max_resident,
        scratch_boxes: 8 * BOXES_PER_LINE,
    }
}

fn stall(cta: u32, task: u32, line: u32) -> Stall {
    Stall {
        cta,
        task,
        box_index: line * BOXES_PER_LINE,
        want_tag: TAG,
        seen: pack(0, 0),
        polls: 0,
        thread: None,
    }
}

/// Compares stalls without the poll counts, which depend on timing.
fn without_polls(e: EmuError) -> (Vec<Stall>, Vec<u32>) {
    match e {
        EmuError::Stalled {
            stalls,
            never_started,
        } => (
            stalls
                .into_iter()
                .map(|s| Stall { polls: 0, ..s })
                .collect(),
            never_started,
        ),
        other => panic!("expected a stall, got {other}"),
    }
}

/// Negative control: a CTA list out of order. Task 1 waits on task 0, which its CTA only runs
/// after it. The check rejects it; run anyway, it hangs and the report names the task and box.
#[test]
fn a_list_out_of_order_is_rejected_and_would_hang() {
    let p = Placement::new(vec![vec![mix(1, 1, &[row(0)]), leaf(0, 0)]]);
    assert_eq!(
        p.validate(limits8(1)),
        Err(PlacementError::NotIncreasing {
            cta: 0,
            position: 1,
            before: 1,
            after: 0
        })
    );
    let e = stuck(&p, None).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("CTA 0: task 1 waited on box 0 for tag 3"),
        "{msg}"
    );
    assert_eq!(without_polls(e), (vec![stall(0, 1, 0)], vec![]));
}

/// Negative control: the same breakage across two CTAs makes a cycle. CTA 0 runs task 3 (waits
/// on task 2) before task 0; CTA 1 runs task 1 (waits on task 0) before task 2. Both stall.
#[test]
fn a_cross_cta_cycle_is_rejected_and_would_hang() {
    let p = Placement::new(vec![
        vec![mix(3, 3, &[row(2)]), leaf(0, 0)],
        vec![mix(1, 1, &[row(0)]), leaf(2, 2)],
    ]);
    assert!(matches!(
        p.validate(limits8(2)),
        Err(PlacementError::NotIncreasing { cta: 0, .. })
    ));
    let e = stuck(&p, None).unwrap_err();
    assert_eq!(
        without_polls(e),
        (vec![stall(0, 3, 2), stall(1, 1, 0)], vec![])
    );
}

/// Negative control: a task waiting on a later task of its own CTA (lists in order).
#[test]
fn waiting_on_a_later_task_is_rejected_and_would_hang() {
    let p = Placement::new(vec![vec![mix(0, 0, &[row(1)]), leaf(1, 1)]]);
    assert!(matches!(
        p.validate(limits8(1)),
        Err(PlacementError::WaitsOnLater {
            task: 0,
            producer: 1,
            ..
        })
    ));
    assert_eq!(
        without_polls(stuck(&p, None).unwrap_err()),
        (vec![stall(0, 0, 1)], vec![])
    );
}

/// Negative control for residency: three CTAs, room for two. CTAs 0 and 1 wait on task 0 of
/// CTA 2, which never starts. The check rejects the grid; with every CTA resident it finishes.
#[test]
fn a_grid_larger_than_resident_is_rejected_and_would_hang() {
    let p = Placement::new(vec![
        vec![mix(1, 1, &[row(0)])],
        vec![mix(2, 2, &[row(0)])],
        vec![leaf(0, 0)],
    ]);
    assert_eq!(
        p.validate(limits8(2)),
        Err(PlacementError::GridTooLarge {
            ctas: 3,
            max_resident: 2
        })
    );
    let e = stuck(&p, Some(2)).unwrap_err();
    assert!(e.to_string().contains("CTAs [2] never started"), "{e}");
    assert_eq!(
        without_polls(e),
        (vec![stall(0, 1, 0), stall(1, 2, 0)], vec![2])
    );
    // Positive control: the same placement, all resident, is valid and finishes.
    assert!(p.validate(limits8(3)).is_ok());
    stuck(&p, None).unwrap();
}

/// Negative control for the oracle comparison itself: a second launch that reuses the first one's
/// tag. With one CTA resident at a time (CTA 0 first), task 1 on CTA 0 takes task 0's row from
/// the first launch as ready, and the comparison with the oracle catches it. The same launch with
/// the next tag and every CTA resident matches.
#[test]
fn a_frozen_tag_is_caught_by_the_oracle_comparison() {
    let p = Placement::new(vec![vec![mix(1, 1, &[row(0)])], vec![leaf(0, 0)]]);
    let valid = p.check(limits8(2)).unwrap();
    let first = Synthetic {
        inputs: &[1, 2],
        step: 0,
    };
    let second = Synthetic {
        inputs: &[3, 4],
        step: 1,
    };
    let one_at_a_time = EmuConfig {
        resident: Some(1),
        ..EmuConfig::default()
    };
    for (tag, config, stale) in [
        (TAG, one_at_a_time, true),
        (TAG + 1, EmuConfig::default(), false),
    ] {
        let scratch = Scratch::new(8 * BOXES_PER_LINE);
        run(&valid, &scratch, TAG, &EmuConfig::default(), &first).unwrap();
        let before = scratch.snapshot();
        run(&valid, &scratch, tag, &config, &second).unwrap();
        let want = evaluate_sequential(valid.placement(), &before, tag, &second).unwrap();
        assert_eq!(scratch.snapshot() != want, stale, "tag {tag}");
    }
}
