//! Layout math: cache offsets, and the coverage and limits of score plans.

use indexer::layout::{
    CacheLayout, IndexerBoxes, Limits, Row, ScorePlan, MAX_GROUP_ROWS, MIN_RUN_PAGES,
};
use mailbox::layout::ScratchLayout;
use model::paging::{pages_through, PageTable, PAGE_TOKENS};
use proptest::prelude::*;
use std::collections::HashSet;

#[test]
fn glm5_page_is_8448_bytes_with_scales_after_keys() {
    let cache = CacheLayout::new(128).unwrap();
    assert_eq!(cache.page_bytes(), 8448);
    assert_eq!(cache.key_offset(0, 1), 128);
    assert_eq!(cache.scale_offset(0, 0), 8192);
    assert_eq!(cache.scale_offset(2, 3), 2 * 8448 + 8192 + 12);
    assert_eq!(CacheLayout::new(64).unwrap().page_bytes(), 64 * 68);
    assert!(CacheLayout::new(100).is_err());
    assert!(CacheLayout::new(0).is_err());
}

#[test]
fn rows_that_break_the_rules_are_rejected() {
    let table = PageTable::new(&[vec![0, 1], vec![2, 3]]).unwrap();
    let plan = |rows: &[Row]| ScorePlan::new(rows, &table, Limits::default());
    let row = |request, position| Row { request, position };
    assert!(plan(&[]).is_err(), "no rows");
    assert!(plan(&[row(2, 0)]).is_err(), "unknown request");
    assert!(plan(&[row(0, 128)]).is_err(), "position past the pages");
    assert!(plan(&[row(0, 10), row(0, 12)]).is_err(), "gap in positions");
    assert!(
        plan(&[row(0, 10), row(1, 3), row(0, 11)]).is_err(),
        "request split"
    );
    assert!(plan(&[row(0, 10), row(0, 11), row(1, 3)]).is_ok());
    let too_many = Limits {
        max_runs: 1,
        ..Limits::default()
    };
    assert!(ScorePlan::new(&[row(0, 1), row(1, 1)], &table, too_many).is_err());
}

#[test]
fn a_chain_of_eight_is_two_groups_of_four_over_the_same_pages() {
    let table = PageTable::new(&[(0..2048).collect()]).unwrap();
    let rows: Vec<Row> = (0..8)
        .map(|i| Row {
            request: 0,
            position: 131_064 + i,
        })
        .collect();
    let plan = ScorePlan::new(&rows, &table, Limits::default()).unwrap();
    assert_eq!(plan.groups.len(), 2);
    assert!(plan.groups.iter().all(|g| g.n_rows == 4));
    assert_eq!(plan.stride, 2048 * PAGE_TOKENS);
    // Each group reads every page once: twice the request's pages in all.
    let cache = CacheLayout::new(128).unwrap();
    assert_eq!(plan.cache_bytes_read(&cache), 2 * 2048 * 8448);
}

/// A random launch: requests with consecutive rows, page tables of distinct physical pages.
fn launch() -> impl Strategy<Value = (Vec<Row>, PageTable)> {
    prop::collection::vec((0u32..6_000, 1u32..10, 0u32..3), 1..24).prop_map(|requests| {
        let mut rows = Vec::new();
        let mut tables = Vec::new();
        let mut next_page = 0;
        for (index, &(first, n_rows, spare_pages)) in requests.iter().enumerate() {
            let pages = pages_through(first + n_rows - 1) + spare_pages;
            tables.push((next_page..next_page + pages).rev().collect::<Vec<u32>>());
            next_page += pages;
            rows.extend((0..n_rows).map(|i| Row {
                request: index as u32,
                position: first + i,
            }));
        }
        (rows, PageTable::new(&tables).unwrap())
    })
}

/// The plan, or None when the launch has more row groups than `max_runs` (checked to be an error).
fn plan_or_too_many_groups(rows: &[Row], table: &PageTable, limits: Limits) -> Option<ScorePlan> {
    let mut groups = 0;
    let mut start = 0;
    for i in 1..=rows.len() {
        if i == rows.len() || rows[i].request != rows[start].request {
            groups += ((i - start) as u32).div_ceil(limits.group_rows);
            start = i;
        }
    }
    let plan = ScorePlan::new(rows, table, limits);
    if groups > limits.max_runs {
        assert!(
            plan.is_err(),
            "{groups} groups fit in {} runs",
            limits.max_runs
        );
        return None;
    }
    Some(plan.unwrap())
}

/// What the kernels write for each (row, t): run pages give a score (t <= position) or −inf, and
/// the run that ends at its group's last page writes −inf past it, up to the stride. Returns, per
/// output entry, how often it is written and how often scored.
fn simulate(plan: &ScorePlan) -> (Vec<u8>, Vec<u8>) {
    let stride = plan.stride as usize;
    let mut writes = vec![0u8; plan.rows.len() * stride];
    let mut scored = vec![0u8; plan.rows.len() * stride];
    for run in &plan.runs {
        let group = plan.groups[run.group as usize];
        let run_end = (run.first_page + run.n_pages) * PAGE_TOKENS;
        let group_end = pages_through(group.last_position) * PAGE_TOKENS;
        let end = if run_end == group_end {
            plan.stride
        } else {
            run_end
        };
        for r in group.first_row..group.first_row + group.n_rows {
            let position = plan.rows[r as usize].position;
            for t in run.first_page * PAGE_TOKENS..end {
                let entry = r as usize * stride + t as usize;
                writes[entry] = writes[entry].saturating_add(1);
                if t < run_end && t <= position {
                    scored[entry] = scored[entry].saturating_add(1);
                }
            }
        }
    }
    (writes, scored)
}

proptest! {
    #[test]
    fn every_valid_key_of_every_row_is_scored_exactly_once(
        (rows, table) in launch(),
        max_runs in 8u32..300,
        group_rows in 1u32..=MAX_GROUP_ROWS,
    ) {
        let Some(plan) = plan_or_too_many_groups(&rows, &table, Limits { max_runs, group_rows }) else {
            return Ok(());
        };
        let (writes, scored) = simulate(&plan);
        prop_assert!(writes.iter().all(|&w| w == 1), "an output entry is not written exactly once");
        let stride = plan.stride as usize;
        for (r, row) in rows.iter().enumerate() {
            for (t, &count) in scored[r * stride..][..stride].iter().enumerate() {
                let valid = t as u32 <= row.position;
                prop_assert_eq!(count, u8::from(valid), "row {} key {}", r, t);
            }
        }
    }

    #[test]
    fn groups_and_runs_stay_within_limits(
        (rows, table) in launch(),
        max_runs in 8u32..300,
        group_rows in 1u32..=MAX_GROUP_ROWS,
    ) {
        let Some(plan) = plan_or_too_many_groups(&rows, &table, Limits { max_runs, group_rows }) else {
            return Ok(());
        };
        prop_assert!(plan.runs.len() as u32 <= max_runs);
        for group in &plan.groups {
            prop_assert!(group.n_rows >= 1 && group.n_rows <= group_rows);
            let request = plan.requests[group.request as usize];
            prop_assert!(group.first_row >= request.first_row);
            prop_assert!(group.first_row + group.n_rows <= request.first_row + request.n_rows);
            let first = rows[group.first_row as usize];
            for i in 0..group.n_rows {
                let row = rows[(group.first_row + i) as usize];
                prop_assert_eq!(row.request, first.request);
                prop_assert_eq!(row.position, first.position + i);
            }
            prop_assert_eq!(group.last_position, first.position + group.n_rows - 1);
        }
        for run in &plan.runs {
            let group_pages = pages_through(plan.groups[run.group as usize].last_position);
            prop_assert!(run.n_pages >= MIN_RUN_PAGES.min(group_pages), "run {:?}", run);
            prop_assert!(run.first_page + run.n_pages <= group_pages);
        }
        // Balanced: a group's runs differ by at most a page.
        for (index, _) in plan.groups.iter().enumerate() {
            let lengths: Vec<u32> = plan.runs.iter()
                .filter(|r| r.group as usize == index)
                .map(|r| r.n_pages)
                .collect();
            let (lo, hi) = (lengths.iter().min().unwrap(), lengths.iter().max().unwrap());
            prop_assert!(hi - lo <= 1, "group {} runs {:?}", index, lengths);
        }
    }

    #[test]
    fn slots_of_different_tokens_never_collide((rows, table) in launch()) {
        let cache = CacheLayout::new(128).unwrap();
        let mut seen = HashSet::new();
        for request in 0..table.requests() {
            let tokens = table.pages(request).len() as u32 * PAGE_TOKENS;
            for t in (0..tokens).step_by(7) {
                let (page, slot) = table.locate(request, t).unwrap();
                prop_assert!(seen.insert(cache.key_offset(page, slot)));
                prop_assert!(cache.scale_offset(page, slot) >= cache.key_offset(page, 0) + cache.keys_bytes());
            }
        }
        prop_assert!(!rows.is_empty());
    }
}

/// Negative control for the coverage checker: a plan with one run dropped fails it.
#[test]
fn coverage_check_catches_a_missing_run() {
    let table = PageTable::new(&[(0..40).collect()]).unwrap();
    let rows = [Row {
        request: 0,
        position: 2000,
    }];
    let mut plan = ScorePlan::new(&rows, &table, Limits::default()).unwrap();
    assert!(simulate(&plan).0.iter().all(|&w| w == 1));
    plan.runs.remove(0);
    assert!(simulate(&plan).0.iter().any(|&w| w != 1));
}

#[test]
fn boxes_hold_a_key_and_a_query_per_row() {
    let mut builder = ScratchLayout::builder();
    let boxes = IndexerBoxes::add(&mut builder, 8, 20, 32, 128).unwrap();
    assert_eq!(boxes.key.words(), 33);
    assert_eq!(boxes.query.words(), 32 * 64 + 32);
    assert_eq!(boxes.query.slots(), 8);
    assert_eq!((boxes.run.slots(), boxes.run.words()), (20, 1));
    let layout = builder.build();
    assert!(layout.region("idx_key").is_some() && layout.region("idx_query").is_some());
}

/// The stage's task lists pass the placement rule for plans of one or several requests, on grids
/// with room for every task and on grids so small that key and query tasks share CTAs with the
/// scorers; the negative control: a score task ordered before the queries it waits on is rejected.
#[test]
fn stage_task_lists_pass_the_placement_rule() {
    use indexer::layout::{stage_placement, StageTasks, TaskKind};
    use mailbox::{Limits as PlacementLimits, PlacementError};
    let table = PageTable::new(&[(0..300).collect(), (300..340).collect()]).unwrap();
    let row = |request, position| Row { request, position };
    let rows = [
        row(0, 19_000),
        row(0, 19_001),
        row(0, 19_002),
        row(0, 19_003),
        row(0, 19_004),
        row(1, 2_000),
    ];
    let mut builder = ScratchLayout::builder();
    let boxes = IndexerBoxes::add(&mut builder, 8, 64, 32, 128).unwrap();
    let scratch_boxes = builder.build().boxes();
    for ctas in [3, 20, 132] {
        let limits = Limits {
            max_runs: indexer::layout::max_runs(ctas, rows.len() as u32)
                .unwrap_or(4)
                .min(64),
            ..Limits::default()
        };
        let plan = ScorePlan::new(&rows, &table, limits).unwrap();
        let grid = PlacementLimits {
            max_resident: ctas,
            scratch_boxes,
        };
        for which in [StageTasks::Whole, StageTasks::ScoreOnly] {
            let placement = stage_placement(&plan, &boxes, ctas, which).unwrap();
            let scores = placement
                .tasks()
                .filter(|(_, t)| t.kind == TaskKind::Score.kind())
                .count();
            assert_eq!(
                scores,
                plan.runs.len().div_ceil(2),
                "{ctas} CTAs, {which:?}"
            );
            placement
                .validate(grid)
                .unwrap_or_else(|e| panic!("{ctas} CTAs, {which:?}: {e}"));
        }
        let mut early = stage_placement(&plan, &boxes, ctas, StageTasks::Whole).unwrap();
        let first_score = early
            .lists_mut()
            .iter_mut()
            .flatten()
            .find(|t| t.kind == TaskKind::Score.kind())
            .unwrap();
        first_score.order = 1_000_000;
        let queries = TaskKind::Query.kind();
        for t in early
            .lists_mut()
            .iter_mut()
            .flatten()
            .filter(|t| t.kind == queries)
        {
            t.order += 2_000_000;
        }
        for list in early.lists_mut() {
            list.sort_by_key(|t| t.order);
        }
        assert!(matches!(
            early.validate(grid),
            Err(PlacementError::WaitsOnLater { .. })
        ));
    }
}
