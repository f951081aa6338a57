//! The placement rule check: each rule rejected by name, with the tasks and CTAs involved, and the
//! rejections of randomly broken placements shown to be real violations.

use mailbox::layout::{BoxRange, BOXES_PER_LINE};
use mailbox::placement::{Limits, Placement, PlacementError};
use mailbox::synth::{DagShape, SynthDag, KIND_LEAF, KIND_MIX};
use mailbox::task::{Stage, Task};
use proptest::prelude::*;

fn leaf(order: u32, line: u32) -> Task {
    Task::new(
        KIND_LEAF,
        order,
        BoxRange::new(line * BOXES_PER_LINE, 4),
        &[],
        [0; 3],
    )
    .unwrap()
}

fn mix(order: u32, line: u32, inputs: &[BoxRange]) -> Task {
    Task::new(
        KIND_MIX,
        order,
        BoxRange::new(line * BOXES_PER_LINE, 4),
        inputs,
        [0; 3],
    )
    .unwrap()
}

fn row(line: u32) -> BoxRange {
    BoxRange::new(line * BOXES_PER_LINE, 4)
}

const LIMITS: Limits = Limits {
    max_resident: 4,
    scratch_boxes: 16 * BOXES_PER_LINE,
};

fn check(lists: Vec<Vec<Task>>) -> Result<(), PlacementError> {
    Placement::new(lists).validate(LIMITS)
}

#[test]
fn a_valid_placement_passes() {
    let lists = vec![
        vec![leaf(0, 0), mix(2, 2, &[row(1)])],
        vec![leaf(1, 1), mix(3, 3, &[row(0), row(2)])],
    ];
    assert_eq!(check(lists.clone()), Ok(()));
    let valid = Placement::new(lists).check(LIMITS).unwrap();
    let table = valid.placement().table();
    assert_eq!(table.offsets, vec![0, 2, 4]);
    assert_eq!(
        table.tasks.iter().map(|t| t.order).collect::<Vec<_>>(),
        vec![0, 2, 1, 3]
    );
}

#[test]
fn each_rule_is_rejected_naming_tasks_and_ctas() {
    use PlacementError::*;
    assert_eq!(check(vec![]), Err(EmptyGrid));
    let five = vec![vec![]; 5];
    assert_eq!(
        check(five),
        Err(GridTooLarge {
            ctas: 5,
            max_resident: 4
        })
    );

    let e = check(vec![vec![leaf(0, 0)], vec![leaf(3, 3), leaf(1, 1)]]).unwrap_err();
    assert_eq!(
        e,
        NotIncreasing {
            cta: 1,
            position: 1,
            before: 3,
            after: 1
        }
    );
    assert_eq!(
        e.to_string(),
        "CTA 1 runs task 3 before task 1 (positions 0 and 1); a CTA's list must increase in the global order"
    );

    // Tasks sharing a rank form a gang: fine on two CTAs, not on one.
    assert_eq!(check(vec![vec![leaf(0, 0)], vec![leaf(0, 1)]]), Ok(()));
    let e = check(vec![vec![leaf(0, 0), leaf(0, 1)]]).unwrap_err();
    assert_eq!(
        e,
        GangOnOneCta {
            order: 0,
            cta: 0,
            first_position: 0,
            second_position: 1
        }
    );

    // Task 1 (CTA 0) waits on task 2's row, written later (on CTA 1).
    let e = check(vec![
        vec![leaf(0, 0), mix(1, 1, &[row(2)])],
        vec![leaf(2, 2)],
    ])
    .unwrap_err();
    assert_eq!(
        e,
        WaitsOnLater {
            task: 1,
            cta: 0,
            box_index: 2 * BOXES_PER_LINE,
            producer: 2,
            producer_cta: 1
        }
    );
    assert!(e
        .to_string()
        .contains("task 1 on CTA 0 waits on box 32, written by task 2 on CTA 1"));

    // A task may wait on a gang peer (same rank, another CTA) but not on itself.
    assert_eq!(
        check(vec![vec![mix(0, 0, &[row(1)])], vec![leaf(0, 1)]]),
        Ok(())
    );
    let e = check(vec![vec![mix(0, 0, &[row(0)])]]).unwrap_err();
    assert_eq!(
        e,
        WaitsOnItself {
            task: 0,
            cta: 0,
            box_index: 0
        }
    );

    let e = check(vec![vec![
        leaf(0, 0),
        mix(1, 1, &[BoxRange::new(2 * BOXES_PER_LINE, 1)]),
    ]])
    .unwrap_err();
    assert_eq!(
        e,
        NoProducer {
            task: 1,
            cta: 0,
            box_index: 32
        }
    );

    // Two tasks of one CTA on one box.
    let e = check(vec![vec![leaf(0, 0), leaf(1, 0)]]).unwrap_err();
    assert_eq!(
        e,
        TwoWriters {
            box_index: 0,
            first: 0,
            first_cta: 0,
            second: 1,
            second_cta: 0
        }
    );

    // Different boxes, one line, two CTAs: false sharing.
    let e = check(vec![
        vec![leaf(0, 0)],
        vec![Task::new(KIND_LEAF, 1, BoxRange::new(8, 4), &[], [0; 3]).unwrap()],
    ])
    .unwrap_err();
    assert_eq!(
        e,
        SharedLine {
            line: 0,
            first: 0,
            first_cta: 0,
            second: 1,
            second_cta: 1
        }
    );
    // The same two boxes from one CTA are fine.
    assert_eq!(
        check(vec![vec![
            leaf(0, 0),
            Task::new(KIND_LEAF, 1, BoxRange::new(8, 4), &[], [0; 3]).unwrap()
        ]]),
        Ok(())
    );

    // A linear task waits on a range of whole lines by each line's last box, so such a line needs
    // one writer: two tasks of one CTA writing halves of it are refused for that reader, and the
    // same line is fine for a reader that polls every box, or when one task writes it whole.
    let half =
        |order, first| Task::new(KIND_LEAF, order, BoxRange::new(first, 8), &[], [0; 3]).unwrap();
    let reader =
        |kind| Task::new(kind, 2, row(1), &[BoxRange::new(0, BOXES_PER_LINE)], [0; 3]).unwrap();
    let linear = Task::kind_of(Stage::Linear, 1);
    let e = check(vec![vec![half(0, 0), half(1, 8)], vec![reader(linear)]]).unwrap_err();
    assert_eq!(
        e,
        SplitLine {
            task: 2,
            cta: 1,
            line: 0,
            box_index: 0
        }
    );
    assert_eq!(
        check(vec![vec![half(0, 0), half(1, 8)], vec![reader(KIND_MIX)]]),
        Ok(())
    );
    assert_eq!(
        check(vec![
            vec![Task::new(KIND_LEAF, 0, BoxRange::new(0, BOXES_PER_LINE), &[], [0; 3]).unwrap()],
            vec![reader(linear)]
        ]),
        Ok(())
    );

    let e = check(vec![vec![leaf(0, 16)]]).unwrap_err();
    assert!(
        matches!(
            e,
            OutOfScratch {
                task: 0,
                cta: 0,
                ..
            }
        ),
        "{e}"
    );

    let mut bad = leaf(0, 0);
    bad.n_inputs = 5;
    assert_eq!(
        check(vec![vec![bad]]),
        Err(TooManyInputs {
            task: 0,
            cta: 0,
            inputs: 5
        })
    );
}

fn dag(seed: u64, tasks: u32) -> SynthDag {
    let shape = DagShape {
        tasks,
        leaves: (tasks / 4).max(1),
        max_inputs: 4,
        max_row: 24,
        window: 8,
    };
    SynthDag::random(seed, shape).unwrap()
}

fn limits(d: &SynthDag, ctas: u32) -> Limits {
    Limits {
        max_resident: ctas,
        scratch_boxes: d.layout.boxes(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Every placement of a DAG that keeps each CTA's list in global order passes.
    #[test]
    fn placements_in_order_pass(seed in any::<u64>(), tasks in 1u32..80, ctas in 1u32..9) {
        let d = dag(seed, tasks);
        prop_assert_eq!(d.place_random(ctas, seed ^ 1).validate(limits(&d, ctas)), Ok(()));
        prop_assert_eq!(d.place_round_robin(ctas).validate(limits(&d, ctas)), Ok(()));
    }

    /// Shuffled lists pass exactly when every list is still increasing, and a rejection names two
    /// tasks that really run out of order on the CTA it names.
    #[test]
    fn shuffled_lists_are_rejected_exactly_when_out_of_order(
        seed in any::<u64>(), tasks in 2u32..60, ctas in 1u32..6, swaps in prop::collection::vec((any::<u32>(), any::<u32>(), any::<u32>()), 1..4),
    ) {
        let d = dag(seed, tasks);
        let mut p = d.place_random(ctas, seed ^ 2);
        for (c, i, j) in swaps {
            let list = &mut p.lists_mut()[(c % ctas) as usize];
            if !list.is_empty() {
                let n = list.len() as u32;
                list.swap((i % n) as usize, (j % n) as usize);
            }
        }
        let in_order = p.lists().iter().all(|l| l.windows(2).all(|w| w[0].order < w[1].order));
        match p.validate(limits(&d, ctas)) {
            Ok(()) => prop_assert!(in_order),
            Err(PlacementError::NotIncreasing { cta, position, before, after }) => {
                let list = &p.lists()[cta as usize];
                prop_assert_eq!(list[position as usize - 1].order, before);
                prop_assert_eq!(list[position as usize].order, after);
                prop_assert!(before > after);
            }
            Err(e) => prop_assert!(false, "unexpected rejection {}", e),
        }
    }

    /// A task rewired to wait on a later task is rejected, naming the two tasks and their CTAs.
    #[test]
    fn waiting_on_a_later_task_is_rejected(seed in any::<u64>(), tasks in 3u32..60, ctas in 1u32..6, pick in any::<u32>()) {
        let d = dag(seed, tasks);
        let mut p = d.place_random(ctas, seed ^ 3);
        let consumer = pick % (tasks - 1);
        let producer = consumer + 1 + pick % (tasks - consumer - 1);
        let producer_row = d.tasks[producer as usize].out;
        let (mut c_cta, mut p_cta) = (u32::MAX, u32::MAX);
        for (cta, list) in p.lists_mut().iter_mut().enumerate() {
            for t in list.iter_mut() {
                if t.order == consumer {
                    t.n_inputs = 1;
                    t.inputs[0] = BoxRange::new(producer_row.first, 1);
                    c_cta = cta as u32;
                }
                if t.order == producer {
                    p_cta = cta as u32;
                }
            }
        }
        let e = p.validate(limits(&d, ctas)).unwrap_err();
        prop_assert_eq!(e, PlacementError::WaitsOnLater {
            task: consumer, cta: c_cta, box_index: producer_row.first, producer, producer_cta: p_cta,
        });
    }
}
