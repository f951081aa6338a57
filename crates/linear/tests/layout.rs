//! The linear stage's placement: every tile of every matrix in exactly one task, placements that
//! pass the mailbox's rules, waits on exactly the producer's boxes, and bad shapes as errors.

use linear::layout::{
    lds_bytes, place, place_weighted, split_tiles, LaunchPlan, MatrixPlan, KIND_TILES,
};
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
        keeps_the_rules(&plans, &plan, ctas)?;
    }
}

/// Every tile once, in tasks of its matrix; boxes and waits as the mailbox and the matrices ask.
fn keeps_the_rules(
    plans: &[MatrixPlan],
    plan: &LaunchPlan,
    ctas: u32,
) -> Result<(), TestCaseError> {
    let valid = plan.placement.clone().check(Limits {
        max_resident: ctas,
        scratch_boxes: plan.boxes,
    });
    prop_assert!(valid.is_ok(), "{:?}", valid.err());
    for (m, tasks) in plan.tasks.iter().enumerate() {
        let mut next = 0;
        for (_, range, out) in tasks {
            prop_assert_eq!(range.first, next);
            next += range.count;
            prop_assert_eq!(out.len, BOXES_PER_LINE);
        }
        prop_assert_eq!(next, plans[m].tiles);
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
    Ok(())
}

proptest! {
    #[test]
    fn weighted_placements_keep_the_rules_and_balance_bytes(
        shapes in prop::collection::vec((1u32..400, 1u64..100_000), 1..20),
        waits in prop::collection::vec(any::<bool>(), 20),
        ctas in 1u32..140,
    ) {
        let plans: Vec<MatrixPlan> = shapes
            .iter()
            .enumerate()
            .map(|(m, &(t, _))| MatrixPlan { tiles: t, after: (m > 0 && waits[m]).then(|| m - 1) })
            .collect();
        let bytes: Vec<u64> = shapes.iter().map(|s| s.1).collect();
        let plan = place_weighted(&plans, &bytes, ctas).unwrap();
        keeps_the_rules(&plans, &plan, ctas)?;
        // Step by step (consecutive matrices of one level), each CTA's end counted in bytes: it
        // begins once its own tasks and those of the CTAs it waits on are done, and no CTA ends
        // later than the latest beginning plus the step's mean plus one tile (and a byte of
        // rounding).
        let mut level = Vec::new();
        for p in &plans {
            level.push(p.after.map_or(0, |a| level[a] + 1));
        }
        let widest = bytes.iter().copied().max().unwrap();
        let mut end = vec![0u64; ctas as usize];
        let mut first = 0;
        while first < plans.len() {
            let last = (first..plans.len()).find(|&m| level[m] != level[first]).unwrap_or(plans.len());
            let ready = (first..last)
                .filter_map(|m| plans[m].after)
                .flat_map(|a| plan.tasks[a].iter().map(|t| end[t.0 as usize]))
                .max()
                .unwrap_or(0);
            let begin: Vec<u64> = end.iter().map(|&e| e.max(ready)).collect();
            let mut step = 0u64;
            end.clone_from(&begin);
            for (tasks, &b) in plan.tasks[first..last].iter().zip(&bytes[first..last]) {
                for (cta, range, _) in tasks {
                    end[*cta as usize] += u64::from(range.count) * b;
                    step += u64::from(range.count) * b;
                }
            }
            let latest = begin.iter().copied().max().unwrap();
            let fullest = end.iter().copied().max().unwrap();
            prop_assert!(
                (fullest - latest) * u64::from(ctas) <= step + (widest + 1) * u64::from(ctas),
                "matrices {first}..{last}: {fullest} after {latest}, {step} bytes over {ctas}"
            );
            first = last;
        }
    }
}

#[test]
fn a_chains_links_are_each_split_evenly() {
    // q_a, o_proj, an expert's gate/up and its down as a rank's shapes make them, each waiting on
    // the one before it: no CTA may take more than one tile over its even share of a link, also
    // a CTA that had no task in the link before (it cannot start the next one sooner).
    let shapes = [
        (128u32, 96u64 << 10),
        (384, 32 << 10),
        (32, 96 << 10),
        (384, 4 << 10),
    ];
    let plans: Vec<MatrixPlan> = (0..shapes.len())
        .map(|m| MatrixPlan {
            tiles: shapes[m].0,
            after: m.checked_sub(1),
        })
        .collect();
    let bytes: Vec<u64> = shapes.iter().map(|s| s.1).collect();
    let ctas = 132u32;
    let plan = place_weighted(&plans, &bytes, ctas).unwrap();
    for (m, tasks) in plan.tasks.iter().enumerate() {
        let most = tasks.iter().map(|t| t.1.count).max().unwrap();
        let even = shapes[m].0.div_ceil(ctas);
        assert!(
            most <= even + 1,
            "matrix {m}: {most} tiles on one CTA, {even} even"
        );
    }
}

#[test]
fn nine_experts_take_few_tasks_a_cta() {
    // Nine gate/ups of 32 tiles of 96 KB, then nine downs of 384 tiles of 4 KB, each after its gate/up.
    let mut plans = vec![
        MatrixPlan {
            tiles: 32,
            after: None
        };
        9
    ];
    plans.extend((0..9).map(|e| MatrixPlan {
        tiles: 384,
        after: Some(e),
    }));
    let bytes: Vec<u64> = (0..18)
        .map(|m| if m < 9 { 96 << 10 } else { 4 << 10 })
        .collect();
    let plan = place_weighted(&plans, &bytes, 132).unwrap();
    let most = plan
        .placement
        .lists()
        .iter()
        .map(|l| l.len())
        .max()
        .unwrap();
    assert!(most <= 4, "{most} tasks on one CTA");
    assert!(place_weighted(&plans, &bytes[1..], 132).is_err());
}

#[test]
fn bad_shapes_are_errors() {
    assert!(lds_bytes(512, 6144, 0).is_err());
    assert!(lds_bytes(512, 6144, 17).is_err());
    assert!(lds_bytes(96, 128, 1).is_err());
    // 16 rows at k = 6144 in the fused shape: one 16 KB slot of partial sums and 197 KB of x.
    assert_eq!(
        lds_bytes(512, 6144, 16).unwrap(),
        16 * 16 * 16 * 4 + 16 * 6152 * 2
    );
    // Up to 8 rows: four 8 KB slots (four rounds before one epilogue) and 8 rows of x.
    assert_eq!(
        lds_bytes(512, 6144, 4).unwrap(),
        4 * 16 * 16 * 8 * 4 + 8 * 6152 * 2
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
