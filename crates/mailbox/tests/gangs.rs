//! Gangs: tasks of one rank that wait on each other. Random DAGs with gangs, placed by the rule,
//! pass the check and finish in the emulator with the sequential oracle's result; the two ways to
//! break the rule around a gang are rejected by the check naming tasks and CTAs, and when run
//! anyway (the negative controls) they hang and the bounded waits name the stuck tasks and boxes.

use mailbox::emulator::{evaluate_sequential, run, run_unchecked, EmuConfig, EmuError, Scratch};
use mailbox::layout::{pack, BoxRange, BOXES_PER_LINE};
use mailbox::placement::{Limits, Placement, PlacementError};
use mailbox::synth::{DagShape, SynthDag, Synthetic, KIND_LEAF, KIND_MIX};
use mailbox::task::Task;
use mailbox::Stall;
use proptest::prelude::*;
use std::time::Duration;

/// Every task writes a row of two boxes at the start of its own line.
fn row(line: u32) -> BoxRange {
    BoxRange::new(line * BOXES_PER_LINE, 2)
}
/// The first box of a row: what gang peers wait on, so the second box is written after the
/// member's own peer waits.
fn share(line: u32) -> BoxRange {
    BoxRange::new(line * BOXES_PER_LINE, 1)
}
fn leaf(order: u32, line: u32) -> Task {
    Task::new(KIND_LEAF, order, row(line), &[], [order, 0, u32::MAX]).unwrap()
}
fn mix(order: u32, line: u32, inputs: &[BoxRange]) -> Task {
    Task::new(KIND_MIX, order, row(line), inputs, [line, 0, u32::MAX]).unwrap()
}

const INPUTS: [u32; 2] = [5, 6];
const TAG: u32 = 3;
const BOXES: u32 = 8 * BOXES_PER_LINE;

fn limits(max_resident: u32) -> Limits {
    Limits {
        max_resident,
        scratch_boxes: BOXES,
    }
}

fn task_fn() -> Synthetic<'static> {
    Synthetic {
        inputs: &INPUTS,
        step: 0,
    }
}

/// Runs a placement with the check bypassed and a short bound on every wait.
fn run_anyway(p: &Placement, resident: Option<u32>) -> Result<Vec<u64>, EmuError> {
    let scratch = Scratch::new(BOXES);
    let config = EmuConfig {
        timeout: Duration::from_millis(300),
        resident,
        ..EmuConfig::default()
    };
    run_unchecked(p, &scratch, TAG, &config, &task_fn())?;
    Ok(scratch.snapshot())
}

fn stall(cta: u32, task: u32, box_index: u32) -> Stall {
    Stall {
        cta,
        task,
        box_index,
        want_tag: TAG,
        seen: pack(0, 0),
        polls: 0,
        thread: None,
    }
}

/// The stalls without the poll counts, which depend on timing.
fn stalls(e: EmuError) -> (Vec<Stall>, Vec<u32>) {
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

/// The gang of rank 1: three members all-gathering the first box of each other's rows after
/// reading the leaf of rank 0; rank 2 reads all three rows whole.
fn gang_a() -> Task {
    mix(1, 1, &[row(0), share(2), share(3)])
}
fn gang_b() -> Task {
    mix(1, 2, &[row(0), share(1), share(3)])
}
fn gang_c() -> Task {
    mix(1, 3, &[share(1), share(2)])
}
fn after_gang() -> Task {
    mix(2, 4, &[row(1), row(2), row(3)])
}

fn gang_on_three_ctas() -> Placement {
    Placement::new(vec![
        vec![leaf(0, 0), gang_a()],
        vec![gang_b(), after_gang()],
        vec![gang_c()],
    ])
}

#[test]
fn a_gang_on_distinct_ctas_passes_and_finishes_as_the_oracle_does() {
    let valid = gang_on_three_ctas().check(limits(3)).unwrap();
    let scratch = Scratch::new(BOXES);
    run(&valid, &scratch, TAG, &EmuConfig::default(), &task_fn()).unwrap();
    let want =
        evaluate_sequential(valid.placement(), &vec![0; BOXES as usize], TAG, &task_fn()).unwrap();
    assert_eq!(scratch.snapshot(), want);
    // Both boxes of every row were written: a member's first before its peer waits, its second
    // after them.
    for line in 1..=4 {
        let b = (line * BOXES_PER_LINE) as usize;
        assert!(want[b] >> 32 == TAG as u64 && want[b + 1] >> 32 == TAG as u64);
    }
}

/// A gang needs every member running at once: with one CTA resident at a time, the first member
/// waits for peers that never start.
#[test]
fn a_gang_hangs_when_its_members_are_not_all_resident() {
    let p = gang_on_three_ctas();
    assert_eq!(
        p.validate(limits(1)),
        Err(PlacementError::GridTooLarge {
            ctas: 3,
            max_resident: 1
        })
    );
    let e = run_anyway(&p, Some(1)).unwrap_err();
    assert_eq!(
        stalls(e),
        (vec![stall(0, 1, 2 * BOXES_PER_LINE)], vec![1, 2])
    );
}

/// Negative control (a): two members of the gang on one CTA. The check names the gang and the
/// CTA; run anyway, the first member waits on the second's share behind it, and so do the third
/// member and the task after the gang, each report naming its task and the box.
#[test]
fn two_members_on_one_cta_are_rejected_and_would_hang() {
    let p = Placement::new(vec![
        vec![leaf(0, 0), gang_a(), gang_b()],
        vec![after_gang()],
        vec![gang_c()],
    ]);
    let e = p.validate(limits(3)).unwrap_err();
    assert_eq!(
        e,
        PlacementError::GangOnOneCta {
            order: 1,
            cta: 0,
            first_position: 1,
            second_position: 2
        }
    );
    assert!(
        e.to_string()
            .starts_with("CTA 0 runs two members of gang 1 (positions 1 and 2)"),
        "{e}"
    );
    let e = run_anyway(&p, None).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("CTA 0: task 1 waited on box 32 for tag 3"),
        "{msg}"
    );
    assert_eq!(
        stalls(e),
        (
            vec![
                stall(0, 1, 2 * BOXES_PER_LINE),
                // Rank 2 waits on gang_a's second box, which gang_a writes after its peer waits.
                stall(1, 2, BOXES_PER_LINE + 1),
                stall(2, 1, 2 * BOXES_PER_LINE),
            ],
            vec![]
        )
    );
}

/// Negative control (b): a member placed after a task that waits on a later rank. CTA 0 runs
/// task 1, which waits on task 3, before member `a` of gang 2; task 3 comes after member `b` on
/// CTA 1, and `b` waits on `a`'s share. The check rejects the wait on the later rank; run anyway,
/// the cycle hangs and the reports name both tasks and boxes.
#[test]
fn a_member_after_a_wait_on_a_later_rank_is_rejected_and_would_hang() {
    let build = |t1_waits_on: BoxRange| {
        Placement::new(vec![
            vec![
                leaf(0, 0),
                mix(1, 1, &[t1_waits_on]),
                mix(2, 2, &[row(0), share(3)]),
            ],
            vec![mix(2, 3, &[row(0), share(2)]), mix(3, 5, &[row(3)])],
        ])
    };
    let p = build(row(5));
    let e = p.validate(limits(2)).unwrap_err();
    assert_eq!(
        e,
        PlacementError::WaitsOnLater {
            task: 1,
            cta: 0,
            box_index: 5 * BOXES_PER_LINE,
            producer: 3,
            producer_cta: 1
        }
    );
    assert!(
        e.to_string()
            .contains("task 1 on CTA 0 waits on box 80, written by task 3 on CTA 1"),
        "{e}"
    );
    let e = run_anyway(&p, None).unwrap_err();
    assert!(
        e.to_string().contains("CTA 1: task 2 waited on box 32"),
        "{e}"
    );
    assert_eq!(
        stalls(e),
        (
            vec![
                stall(0, 1, 5 * BOXES_PER_LINE),
                stall(1, 2, 2 * BOXES_PER_LINE)
            ],
            vec![]
        )
    );
    // Positive control: the same placement with task 1 waiting on rank 0 passes and finishes.
    let p = build(row(0));
    p.validate(limits(2)).unwrap();
    let image = run_anyway(&p, None).unwrap();
    let want = evaluate_sequential(&p, &vec![0; BOXES as usize], TAG, &task_fn()).unwrap();
    assert_eq!(image, want);
}

/// A member may wait on its peers but not on its own row.
#[test]
fn a_task_waiting_on_its_own_row_is_rejected() {
    let p = Placement::new(vec![
        vec![leaf(0, 0), mix(1, 1, &[row(0), share(1)])],
        vec![mix(1, 2, &[share(1)])],
    ]);
    assert_eq!(
        p.validate(limits(2)),
        Err(PlacementError::WaitsOnItself {
            task: 1,
            cta: 0,
            box_index: BOXES_PER_LINE
        })
    );
}

fn dag(seed: u64, tasks: u32, max_gang: u32) -> SynthDag {
    let shape = DagShape {
        tasks,
        leaves: (tasks / 6).max(1),
        max_inputs: 3,
        max_row: 12,
        window: 10,
    };
    SynthDag::random_gangs(seed, shape, max_gang).unwrap()
}

fn dag_limits(d: &SynthDag, ctas: u32) -> Limits {
    Limits {
        max_resident: ctas,
        scratch_boxes: d.layout.boxes(),
    }
}

/// Tasks that wait on a task of their own rank.
fn peer_waits(d: &SynthDag) -> usize {
    let writer = |b: u64| d.tasks.iter().find(|t| t.out.boxes().any(|o| o == b));
    d.tasks
        .iter()
        .filter(|t| {
            t.inputs()
                .iter()
                .flat_map(|r| r.boxes())
                .any(|b| writer(b).is_some_and(|w| w.order == t.order && w != *t))
        })
        .count()
}

/// The generator makes real gangs (members waiting on peers), so the properties below test them.
#[test]
fn random_dags_have_gangs_whose_members_wait_on_each_other() {
    let total: usize = (0..8).map(|seed| peer_waits(&dag(seed, 40, 4))).sum();
    assert!(total > 8 * 10, "{total} peer waits in 8 DAGs of 40 tasks");
    assert_eq!(peer_waits(&dag(0, 40, 1)), 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Every placement by the rule of a random DAG with gangs passes the check, finishes, and
    /// leaves the scratch exactly as the sequential oracle does, for two launches in a row.
    #[test]
    fn placements_of_gangs_pass_and_finish_as_the_oracle_does(
        seed in any::<u64>(),
        tasks in 1u32..48,
        ctas in 1u32..7,
        gang in 1u32..5,
        round_robin in any::<bool>(),
    ) {
        let d = dag(seed, tasks, gang.min(ctas));
        let p = if round_robin { d.place_round_robin(ctas) } else { d.place_random(ctas, seed ^ 5) };
        let valid = p.check(dag_limits(&d, ctas)).unwrap();
        let scratch = Scratch::new(d.layout.boxes());
        let mut image = scratch.snapshot();
        for (tag, step) in [(1u32, 0u32), (2, 1)] {
            let inputs = d.random_inputs(seed.wrapping_add(tag as u64));
            let task_fn = Synthetic { inputs: &inputs, step };
            run(&valid, &scratch, tag, &EmuConfig::default(), &task_fn).unwrap();
            image = evaluate_sequential(valid.placement(), &image, tag, &task_fn).unwrap();
            prop_assert_eq!(scratch.snapshot(), image.clone());
        }
    }

    /// The check is sound with gangs: after random moves of tasks between and within CTAs,
    /// whatever it accepts finishes as the oracle does, and whatever it rejects breaks the rule
    /// where it says (a move changes no wait, so only the lists can be wrong).
    #[test]
    fn whatever_the_check_accepts_with_gangs_finishes(
        seed in any::<u64>(), tasks in 2u32..36, ctas in 1u32..5, gang in 2u32..5,
        moves in prop::collection::vec((any::<u32>(), any::<u32>(), any::<u32>()), 0..3),
    ) {
        let d = dag(seed, tasks, gang.min(ctas));
        let mut p = d.place_random(ctas, seed);
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
        match p.clone().check(dag_limits(&d, ctas)) {
            Ok(valid) => {
                let inputs = d.random_inputs(seed);
                let task_fn = Synthetic { inputs: &inputs, step: 3 };
                let scratch = Scratch::new(d.layout.boxes());
                run(&valid, &scratch, 9, &EmuConfig::default(), &task_fn).unwrap();
                let want = evaluate_sequential(valid.placement(), &vec![0; scratch.len()], 9, &task_fn).unwrap();
                prop_assert_eq!(scratch.snapshot(), want);
            }
            Err(PlacementError::GangOnOneCta { order, cta, first_position, second_position }) => {
                let list = &p.lists()[cta as usize];
                prop_assert_eq!(list[first_position as usize].order, order);
                prop_assert_eq!(list[second_position as usize].order, order);
                prop_assert!(first_position < second_position);
            }
            Err(PlacementError::NotIncreasing { cta, position, before, after }) => {
                let list = &p.lists()[cta as usize];
                prop_assert_eq!(list[position as usize - 1].order, before);
                prop_assert_eq!(list[position as usize].order, after);
                prop_assert!(before > after);
            }
            Err(e) => prop_assert!(false, "unexpected rejection {}", e),
        }
    }
}
