//! The linear stage's placement: every tile of every matrix in exactly one task, placements that
//! pass the mailbox's rules, waits on exactly the producer's boxes, and bad shapes as errors.

use linear::layout::{lds_bytes, place, split_tiles, MatrixPlan, KIND_TILES};
use mailbox::layout::BOXES_PER_LINE;
use mailbox::Limits;
use proptest::prelude::*;

proptest! {
    #[test]
    fn splits_cover_every_tile_once(tiles in 1u32..2000, parts in 1u32..200) {
        let ranges = split_tiles(tiles, parts);
        prop_assert!(ranges.len() as u32 <= parts.min(tiles));
        let mut next = 0;
        for r in &ranges {
            prop_assert_eq!(r.first, next);
            prop_assert!(r.count > 0);
            next += r.count;
        }
        prop_assert_eq!(next, tiles);
        let (lo, hi) = ranges.iter().fold((u32::MAX, 0), |(a, b), r| (a.min(r.count), b.max(r.count)));
        prop_assert!(hi - lo <= 1);
    }

    #[test]
    fn placements_keep_the_mailbox_rules(
        tiles in prop::collection::vec(1u32..300, 1..8),
        waits in prop::collection::vec(any::<bool>(), 8),
        ctas in 1u32..140,
    ) {
        let plans: Vec<MatrixPlan> = tiles
            .iter()
            .enumerate()
            .map(|(m, &t)| MatrixPlan { tiles: t, after: (m > 0 && waits[m]).then(|| m - 1) })
            .collect();
        let plan = place(&plans, ctas).unwrap();
        let valid = plan.placement.clone().check(Limits { max_resident: ctas, scratch_boxes: plan.boxes });
        prop_assert!(valid.is_ok(), "{:?}", valid.err());
        for (m, tasks) in plan.tasks.iter().enumerate() {
            let covered: u32 = tasks.iter().map(|t| t.1.count).sum();
            prop_assert_eq!(covered, tiles[m]);
            for (_, _, out) in tasks {
                prop_assert_eq!(out.len, BOXES_PER_LINE);
            }
        }
        for (_, task) in plan.placement.tasks() {
            prop_assert_eq!(task.kind, KIND_TILES);
            let m = task.args[0] as usize;
            match plans[m].after {
                Some(a) => {
                    let producer = &plan.tasks[a];
                    let first = producer[0].2.first;
                    let end = producer.last().unwrap().2.end() as u32;
                    prop_assert_eq!(task.inputs(), &[mailbox::BoxRange::new(first, end - first)]);
                }
                None => prop_assert_eq!(task.n_inputs, 0),
            }
        }
    }
}

#[test]
fn bad_shapes_are_errors() {
    assert!(lds_bytes(512, 6144, 0).is_err());
    assert!(lds_bytes(512, 6144, 17).is_err());
    assert!(lds_bytes(96, 128, 1).is_err());
    // 16 rows at k = 6144 in the fused shape: 16 KB of partial sums and 197 KB of x.
    assert_eq!(
        lds_bytes(512, 6144, 16).unwrap(),
        16 * 16 * 16 * 4 + 16 * 6152 * 2
    );
    assert!(place(
        &[MatrixPlan {
            tiles: 0,
            after: None
        }],
        4
    )
    .is_err());
    assert!(place(
        &[MatrixPlan {
            tiles: 3,
            after: Some(0)
        }],
        4
    )
    .is_err());
    assert!(place(
        &[MatrixPlan {
            tiles: 3,
            after: None
        }],
        0
    )
    .is_err());
}
