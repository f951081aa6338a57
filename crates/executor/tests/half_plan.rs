//! The attention half's plan on a `LaunchGraph`: at the tiny preset and GLM-5 at TP8, TP4 and TP2,
//! for 1 to 16 rows in one or several requests, the launch passes the placement rule (every wait
//! on an earlier rank that some task writes), each matrix's linear tasks cover its tiles once,
//! and a split of a request's later group waits on the group before's cache write ahead of its
//! records; bad steps are refused before anything runs.

use executor::fused::attention::{
    HalfBuild, HalfDims, HalfError, HalfMatrix, HalfPlan, HalfRequest,
};
use executor::fused::{Handoff, LaunchGraph, PlannedLaunch};
use linear::layout::KIND_TILES;
use mailbox::layout::BoxRange;
use mailbox::Placement;
use mla::layout::{MlaKind, SplitChoice, SPLIT_AFTER_WRITE};
use model::{CacheFormat, ModelConfig};
use proptest::prelude::*;

fn dims(preset: &str, tp: usize) -> HalfDims {
    let cfg = ModelConfig::preset(preset).unwrap();
    let cache = if preset == "tiny" {
        CacheFormat::Bf16
    } else {
        CacheFormat::Fp8
    };
    HalfDims::new(&cfg, tp, cache).unwrap()
}

fn build(group_rows: u32) -> HalfBuild {
    HalfBuild {
        topk: 64,
        union: 128,
        choice: SplitChoice {
            group_rows,
            block: 16,
            combine_queries: 1,
        },
    }
}

fn plan(
    d: HalfDims,
    requests: &[HalfRequest],
    build: HalfBuild,
    ctas: u32,
    input_bytes: Option<u64>,
) -> Result<(HalfPlan, PlannedLaunch), HalfError> {
    let rows: u64 = requests.iter().map(|r| u64::from(r.rows)).sum();
    let mut g = LaunchGraph::new(ctas).unwrap();
    let bytes = input_bytes.unwrap_or(rows * d.hidden as u64 * 2);
    let x = g.arena("x", bytes.max(1)).unwrap();
    let input = Handoff {
        data: x,
        ready: BoxRange::default(),
    };
    let plan = HalfPlan::plan(&mut g, d, requests, build, input, "attn")?;
    let launch = g.finish().map_err(|e| HalfError::Graph(e.to_string()))?;
    Ok((plan, launch))
}

fn req(context: u32, rows: u32) -> HalfRequest {
    HalfRequest {
        context,
        rows,
        selected: (context + rows).min(64),
    }
}

/// Each matrix's tasks cover its tiles once, in order.
fn check_tiles(plan: &HalfPlan, placement: &Placement) -> Result<(), String> {
    let d = &plan.dims;
    for m in HalfMatrix::all(d.heads) {
        let index = plan.first_matrix + m.index(d.heads) as u32;
        let mut ranges: Vec<(u32, u32)> = placement
            .tasks()
            .filter(|(_, t)| t.kind == KIND_TILES && t.args[0] == index)
            .map(|(_, t)| (t.args[1], t.args[2]))
            .collect();
        ranges.sort_unstable();
        let mut next = 0;
        for (first, count) in ranges {
            if first != next {
                return Err(format!("{m:?}: tiles {first}.. after {next}"));
            }
            next = first + count;
        }
        if next != m.tiles(d) {
            return Err(format!("{m:?}: {next} of {} tiles", m.tiles(d)));
        }
    }
    Ok(())
}

#[test]
fn steps_place_by_the_rule_and_cover_every_tile() {
    for (preset, tp) in [
        ("tiny", 1),
        ("tiny", 2),
        ("glm-5", 8),
        ("glm-5", 4),
        ("glm-5", 2),
    ] {
        let d = dims(preset, tp);
        for requests in [
            vec![req(100, 1)],
            vec![req(100, 4)],
            vec![req(0, 1), req(40, 3), req(200, 12)],
        ] {
            for group_rows in [1, 4] {
                let (p, launch) = plan(d, &requests, build(group_rows), 132, None).unwrap();
                check_tiles(&p, launch.placement.placement()).unwrap();
            }
        }
    }
}

/// The coverage check's control: a launch missing one linear task is caught.
#[test]
fn a_missing_linear_task_is_caught() {
    let (p, launch) = plan(dims("glm-5", 8), &[req(100, 1)], build(1), 132, None).unwrap();
    let mut lists = launch.placement.placement().lists().to_vec();
    let list = lists
        .iter_mut()
        .find(|l| l.iter().any(|t| t.kind == KIND_TILES))
        .unwrap();
    let at = list.iter().position(|t| t.kind == KIND_TILES).unwrap();
    list.remove(at);
    assert!(check_tiles(&p, &Placement::new(lists)).is_err());
}

#[test]
fn a_later_group_waits_on_every_earlier_cache_write_ahead_of_its_records() {
    let (p, launch) = plan(dims("tiny", 2), &[req(100, 4)], build(1), 16, None).unwrap();
    let cache_done = p.boxes.attend.cache_done;
    let mut splits = 0;
    for (_, t) in launch.placement.placement().tasks() {
        if t.kind != MlaKind::Split.kind() {
            continue;
        }
        splits += 1;
        let row = t.args[0];
        let flagged = t.args[1] & SPLIT_AFTER_WRITE != 0;
        assert_eq!(flagged, row > 0, "split of row {row}");
        if flagged {
            // The lines of the cache writes of rows 0 .. row, one range.
            let first = cache_done.slot(0).unwrap().first;
            assert_eq!(
                t.inputs()[1],
                BoxRange::new(first, row * cache_done.stride())
            );
        }
    }
    assert_eq!(splits, 4 * p.attend.groups[0].splits);
    // The cache writes wait on the new tokens alone, not on each other: none is a hand-off after
    // another.
    let writes: Vec<_> = launch
        .placement
        .placement()
        .tasks()
        .filter(|(_, t)| t.kind == MlaKind::CacheWrite.kind())
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(writes.len(), 4);
    for w in &writes {
        assert_eq!(w.inputs().len(), 1, "{w:?}");
        assert!(writes
            .iter()
            .all(|o| !o.out.boxes().any(|b| w.inputs()[0].boxes().contains(&b))));
    }
}

#[test]
fn bad_steps_are_refused() {
    let d = dims("tiny", 2);
    let rows = |e| matches!(e, Err(HalfError::Rows { .. }));
    assert!(rows(plan(d, &[], build(4), 8, None).map(|_| ())));
    assert!(rows(
        plan(d, &[req(100, 17)], build(4), 8, None).map(|_| ())
    ));
    let too_many = HalfRequest {
        context: 10,
        rows: 2,
        selected: 13,
    };
    assert!(matches!(
        plan(d, &[too_many], build(4), 8, None),
        Err(HalfError::Selected { .. })
    ));
    assert!(matches!(
        plan(d, &[req(100, 2)], build(4), 8, Some(16)),
        Err(HalfError::Input { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn random_steps_place_by_the_rule(
        shape in prop::collection::vec((0u32..300, 1u32..5), 1..4),
        ctas in 1u32..140,
        group_rows in 1u32..5,
    ) {
        let requests: Vec<HalfRequest> = shape.iter().map(|&(c, r)| req(c, r)).collect();
        let (p, launch) = plan(dims("tiny", 2), &requests, build(group_rows), ctas, None).unwrap();
        prop_assert_eq!(check_tiles(&p, launch.placement.placement()), Ok(()));
        prop_assert_eq!(p.rows, shape.iter().map(|s| s.1).sum::<u32>());
    }
}

/// How many tasks of matrix `m` each CTA runs.
fn per_cta(p: &HalfPlan, placement: &Placement, m: HalfMatrix) -> Vec<usize> {
    let index = p.first_matrix + m.index(p.dims.heads) as u32;
    placement
        .lists()
        .iter()
        .map(|l| {
            l.iter()
                .filter(|t| t.kind == KIND_TILES && t.args[0] == index)
                .count()
        })
        .collect()
}

/// Where q_a and kv_a hold more tiles than the grid has CTAs (GLM-5 TP8 on 132 CTAs: 128 + 36),
/// q_b runs on the CTAs that took one of them, W_UK and W_UV a task a CTA; the negative control
/// is the CTAs that ran two latent tasks, which exist.
#[test]
fn each_link_ends_together_at_glm5_tp8() {
    let d = dims("glm-5", 8);
    let heads = d.heads;
    for rows in [1, 4] {
        let (p, launch) = plan(d, &[req(100, rows)], build(1), 132, None).unwrap();
        let placement = launch.placement.placement();
        let q_a = per_cta(&p, placement, HalfMatrix::QA);
        let kv_a = per_cta(&p, placement, HalfMatrix::KvA);
        let q_b = per_cta(&p, placement, HalfMatrix::QB);
        let latents: Vec<usize> = q_a.iter().zip(&kv_a).map(|(a, b)| a + b).collect();
        assert!(latents.contains(&2), "no CTA runs two latent tasks");
        for (cta, (&l, &b)) in latents.iter().zip(&q_b).enumerate() {
            assert!(b <= 1, "CTA {cta} runs {b} q_b tasks");
            assert!(
                b == 0 || l == 1,
                "CTA {cta} runs q_b after {l} latent tasks"
            );
        }
        for m in [HalfMatrix::Uk, HalfMatrix::Uv] {
            let mut n = vec![0; 132];
            for h in 0..heads {
                for (c, k) in per_cta(&p, placement, m(h)).into_iter().enumerate() {
                    n[c] += k;
                }
            }
            assert!(n.iter().all(|&k| k <= 1), "{:?}: {n:?}", m(0));
        }
    }
}

/// The CTAs that run a split and also a W_UK task (a split there gathers its records only once
/// the CTA's W_UK task is done).
fn splits_behind_uk(p: &HalfPlan, placement: &Placement) -> Vec<usize> {
    let mut uk = vec![0; placement.lists().len()];
    for h in 0..p.dims.heads {
        for (c, k) in per_cta(p, placement, HalfMatrix::Uk(h))
            .into_iter()
            .enumerate()
        {
            uk[c] += k;
        }
    }
    placement
        .lists()
        .iter()
        .enumerate()
        .filter(|(c, l)| uk[*c] > 0 && l.iter().any(|t| t.kind == MlaKind::Split.kind()))
        .map(|(c, _)| c)
        .collect()
}

/// At GLM-5 TP8 on 132 CTAs W_UK takes 64 of them and the splits go to the others, where they
/// gather their records while W_UK runs; the control: a split moved onto a W_UK CTA is seen.
#[test]
fn splits_start_beside_w_uk_at_glm5_tp8() {
    let d = dims("glm-5", 8);
    for rows in [1, 4] {
        let (p, launch) = plan(d, &[req(100, rows)], build(1), 132, None).unwrap();
        let placement = launch.placement.placement();
        assert_eq!(
            splits_behind_uk(&p, placement),
            Vec::<usize>::new(),
            "{rows} rows"
        );

        let mut lists: Vec<Vec<_>> = placement.lists().to_vec();
        let from = lists
            .iter()
            .position(|l| l.iter().any(|t| t.kind == MlaKind::Split.kind()))
            .unwrap();
        let to = per_cta(&p, placement, HalfMatrix::Uk(0))
            .iter()
            .position(|&k| k > 0)
            .unwrap();
        let at = lists[from]
            .iter()
            .position(|t| t.kind == MlaKind::Split.kind())
            .unwrap();
        let split = lists[from].remove(at);
        lists[to].push(split);
        let moved = Placement::new(lists);
        assert_eq!(
            splits_behind_uk(&p, &moved),
            vec![to],
            "control, {rows} rows"
        );
    }
}
