//! Properties of the layout math: slices tile each row once within their limits, a launch's plan
//! gives every slice its own task and passes the placement rule, histogram, candidate, list and
//! gang boxes never collide, a published plan puts each row's list box once, and the registers
//! task holds the rows it is built for.

use mailbox::layout::{ScratchLayout, BOXES_PER_LINE};
use mailbox::Limits;
use model::Preset;
use proptest::prelude::*;
use select::gpu::CTA_THREADS;
use select::layout::*;
use std::collections::HashSet;

/// k of GLM-5, from its preset.
fn glm5() -> TopK {
    TopK::preset(Preset::Glm5).unwrap()
}

fn check_tiling(s: &Slices) {
    let mut next = 0;
    for (c, r) in s.ranges().enumerate() {
        assert_eq!(
            r.start, next,
            "slice {c} of {s:?} does not start where the last ended"
        );
        assert!(s.is_empty() || !r.is_empty(), "slice {c} of {s:?} is empty");
        assert!(
            r.len() as u32 <= SLICE_ROOM,
            "slice {c} of {s:?} exceeds the LDS room"
        );
        assert_eq!(r.start % SLICE_ALIGN, 0);
        next = r.end;
    }
    assert_eq!(next, s.len(), "{s:?} does not cover the row");
    assert!((1..=MAX_SLICES).contains(&s.count()));
    assert!(s.range(s.count()).is_empty());
}

proptest! {
    #[test]
    fn production_slices_tile_every_row(len in 0..=MAX_ROW_KEYS) {
        let s = select_slices(len).unwrap();
        check_tiling(&s);
        prop_assert_eq!(s.count(), len.div_ceil(SLICE_TARGET).clamp(1, MAX_SLICES));
        // Slices reach the target unless the row is one slice, and pass it only at 64 slices.
        if s.count() > 1 {
            prop_assert!(s.chunk() > SLICE_TARGET / 2);
        }
        if s.count() < MAX_SLICES {
            prop_assert!(s.chunk() <= SLICE_TARGET);
        }
    }

    #[test]
    fn longest_slice_bounds_every_shorter_row(max_len in 0..=MAX_ROW_KEYS, frac in 0.0..=1.0f64) {
        let longest = longest_slice(max_len).unwrap();
        let len = (max_len as f64 * frac) as u32;
        prop_assert!(select_slices(len).unwrap().chunk() <= longest);
        // And it is no longer than needed: some row up to max_len has a slice that long.
        let witness = [max_len, max_len.min(SLICE_TARGET)];
        prop_assert!(witness.iter().any(|&l| select_slices(l).unwrap().chunk() == longest));
    }

    #[test]
    fn the_registers_kernel_holds_the_rows_it_is_built_for(max_len in 0..=REG_MAX_ROW, frac in 0.0..=1.0f64) {
        for block in [64, 128, 256, 512, 1024] {
            let Ok(per) = reg_keys_per_thread(max_len, block) else {
                // Refused only when a thread would need more than it can hold.
                prop_assert!(max_len.div_ceil(block) > REG_MAX_PER_THREAD);
                continue;
            };
            prop_assert!(per % 4 == 0 && per <= REG_MAX_PER_THREAD);
            prop_assert!(per * block >= max_len && per * block >= (max_len as f64 * frac) as u32);
            // The fewest that hold it.
            prop_assert!(per == 4 || (per - 4) * block < max_len);
        }
        // The fused CTA holds such rows.
        prop_assert!(reg_keys_per_thread(max_len, CTA_THREADS).is_ok());
    }

    #[test]
    fn the_fastest_method_builds_for_every_row(len in 0..=MAX_ROW_KEYS) {
        let method = select::gpu::Method::fastest_for(len);
        prop_assert!(select::gpu::Shape::for_rows(method, glm5(), len).is_ok());
    }

    #[test]
    fn any_accepted_slicing_tiles_the_row(len in 0..100_000u32, count in 0..=70u32) {
        match Slices::new(len, count) {
            Ok(s) => check_tiling(&s),
            Err(LayoutError::BadSliceCount { .. }) => {
                // Refused only for a reason: a count out of range, an empty slice or one past the room.
                let chunk = len.div_ceil(count.max(1)).div_ceil(SLICE_ALIGN) * SLICE_ALIGN;
                prop_assert!(count == 0 || count > MAX_SLICES || (len == 0 && count != 1)
                    || chunk > SLICE_ROOM || (count - 1) * chunk >= len);
            }
            Err(e) => prop_assert!(false, "{}", e),
        }
    }

    #[test]
    fn a_plan_gives_every_slice_a_task_and_passes_the_placement_rule(
        lens in prop::collection::vec(0..=MAX_ROW_KEYS, 1..9),
        ctas in 1..=160u32,
        kind in prop::sample::select(vec![SelectKind::OneCta, SelectKind::Registers, SelectKind::Slice]),
        first_order in 0..1000u32,
    ) {
        let top = glm5();
        let slicing = Slicing::production(SLICE_ROOM);
        let Ok(plan) = SelectPlan::new(&lens, kind, top, ctas, slicing, first_order) else {
            // Refused only when a row's slices cannot all run at once.
            prop_assert!(kind == SelectKind::Slice);
            prop_assert!(lens.iter().any(|&l| l.div_ceil(SLICE_ROOM) > ctas));
            return Ok(());
        };
        prop_assert!(plan.ctas() <= ctas);
        plan.placement()
            .validate(Limits { max_resident: ctas, scratch_boxes: 1 })
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let tasks = plan.tasks();
        for t in tasks {
            prop_assert_eq!(t.task.order, first_order + t.row);
            prop_assert_eq!(t.task.kind, kind.kind());
            prop_assert_eq!(t.task.n_inputs, 0);
            prop_assert_eq!([t.task.args[0], t.task.args[1]], [t.row, lens[t.row as usize]]);
        }
        for (row, &len) in lens.iter().enumerate() {
            let gang: Vec<_> = tasks.iter().filter(|t| t.row == row as u32).collect();
            if kind != SelectKind::Slice {
                prop_assert_eq!(gang.len(), 1);
                continue;
            }
            // The slices tile the row within the LDS room, one a CTA: a gang.
            let count = gang.len() as u32;
            let s = Slices::new(len, count).unwrap();
            check_tiling(&s);
            prop_assert!(s.chunk() <= SLICE_ROOM && count <= ctas);
            prop_assert!(len > top.k() || count == 1);
            let mut seen = HashSet::new();
            for (c, t) in gang.iter().enumerate() {
                prop_assert_eq!(t.slice, c as u32);
                prop_assert_eq!(t.task.args[2], c as u32 | count << 16);
                prop_assert!(seen.insert(t.cta), "two slices of row {} on CTA {}", row, t.cta);
            }
            // Rows of the target's slicing keep it while the launch's rows all fit its CTAs.
            let want = select_slices(len).unwrap().count();
            if want * lens.len() as u32 <= ctas {
                prop_assert_eq!(count, want);
            }
        }
    }

    #[test]
    fn a_published_plan_puts_each_rows_list_box_once(
        lens in prop::collection::vec(0..=MAX_ROW_KEYS, 1..9),
        kind in prop::sample::select(vec![SelectKind::OneCta, SelectKind::Registers, SelectKind::Slice]),
    ) {
        let (top, ctas) = (glm5(), 132);
        let rows = lens.len() as u32;
        let Ok(mut plan) = SelectPlan::new(&lens, kind, top, ctas, Slicing::production(SLICE_ROOM), 0) else {
            return Ok(());
        };
        // Regions laid out for fewer rows are refused, naming a task they miss.
        let mut short = ScratchLayout::builder();
        let few = SelectBoxes::add(&mut short, "sel", rows - 1, top);
        if let Ok(few) = few {
            let refused = plan.clone().publish(&few);
            let missed = matches!(refused, Err(LayoutError::NotInLayout { row, .. }) if row == rows - 1);
            prop_assert!(missed, "publishing into regions for {} rows: {:?}", rows - 1, refused);
        }
        let mut b = ScratchLayout::builder();
        let boxes = SelectBoxes::add(&mut b, "sel", rows, top).unwrap();
        let layout = b.build();
        plan.publish(&boxes).unwrap();
        plan.placement()
            .validate(Limits { max_resident: ctas, scratch_boxes: layout.boxes() })
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut outs = HashSet::new();
        for t in plan.tasks() {
            prop_assert!(outs.insert(t.task.out.first), "two tasks put box {}", t.task.out.first);
            // The slot, its padding included: the box, then the rest of its line.
            let first = if t.slice == 0 {
                boxes.list_ready(t.row).unwrap().first
            } else {
                boxes.gang_box(t.row, t.slice).unwrap()
            };
            prop_assert_eq!((t.task.out.first, t.task.out.len), (first, BOXES_PER_LINE));
            // Slice 0 of several waits on the other slices' gang boxes, last.
            let count = t.task.args[2] >> 16;
            if t.slice == 0 && count > 1 {
                let gang = *t.task.inputs().last().unwrap();
                prop_assert_eq!(gang.first, boxes.gang_box(t.row, 1).unwrap());
                prop_assert_eq!(gang.len, (count - 1) * boxes.gang.stride());
            } else {
                prop_assert_eq!(t.task.n_inputs, 0);
            }
        }
        for row in 0..rows {
            let list = boxes.list_ready(row).unwrap().first;
            prop_assert_eq!(plan.tasks().iter().filter(|t| t.task.out.first == list).count(), 1);
        }
    }

    #[test]
    fn boxes_of_different_writers_never_collide(rows in 1..9u32, k in 1..=MAX_K) {
        let mut b = ScratchLayout::builder();
        let top = TopK::new(k).unwrap();
        let boxes = SelectBoxes::add(&mut b, "sel", rows, top).unwrap();
        let layout = b.build();
        let mut seen = HashSet::new();
        for row in 0..rows {
            for round in 0..ROUNDS {
                for slice in 0..MAX_SLICES {
                    let first = boxes.hist_box(row, round, slice).unwrap();
                    // A slot's boxes, and the next slice's follow it directly (one wait covers a round).
                    prop_assert!(seen.insert(first));
                    prop_assert!(first + HIST_BOXES <= layout.boxes());
                    if slice > 0 {
                        prop_assert_eq!(boxes.hist_box(row, round, slice - 1).unwrap() + HIST_BOXES, first);
                    }
                }
            }
            // (key, position) pairs of the whole room, consecutive.
            let c0 = boxes.cand_box(row, 0).unwrap();
            let last = boxes.cand_box(row, 2 * top.room() - 1).unwrap();
            prop_assert_eq!(last, c0 + 2 * top.room() - 1);
            prop_assert_eq!(boxes.cand_box(row, 2 * top.room()), None);
            prop_assert!(seen.insert(c0));
        }
        // The list and gang boxes: one writer each, a line each, inside the scratch.
        let mut lines = HashSet::new();
        for row in 0..rows {
            let list = boxes.list_ready(row).unwrap();
            prop_assert_eq!(list.len, 1);
            let gang = (0..MAX_SLICES).map(|s| boxes.gang_box(row, s).unwrap());
            for b in std::iter::once(list.first).chain(gang) {
                prop_assert!(seen.insert(b) && lines.insert(b / BOXES_PER_LINE));
                prop_assert!(b < layout.boxes());
            }
            prop_assert_eq!(boxes.gang_box(row, MAX_SLICES), None);
        }
        prop_assert_eq!(boxes.list_ready(rows), None);
        prop_assert_eq!(boxes.gang_box(rows, 0), None);
        prop_assert_eq!(boxes.hist_box(rows, 0, 0), None);
        prop_assert_eq!(boxes.hist_box(0, ROUNDS, 0), None);
    }

    #[test]
    fn one_cta_rows_fit_the_shared_memory_and_are_the_longest_that_do(
        shared in 0..=300_000u32,
        k in 1..=MAX_K,
    ) {
        let top = TopK::new(k).unwrap();
        let room = one_cta_room(shared, top);
        prop_assert_eq!(room % ONE_CTA_ROOM_STEP, 0);
        prop_assert!(room <= ONE_CTA_ROOM);
        let bytes = |keys: u32| lds_words(keys, top) * 4 + STATIC_SHARED_ALLOWANCE;
        if room > 0 {
            prop_assert!(bytes(room) <= shared, "{} keys need {} B of {}", room, bytes(room), shared);
        }
        if room < ONE_CTA_ROOM {
            prop_assert!(bytes(room + ONE_CTA_ROOM_STEP) > shared);
        }
    }
}

#[test]
fn one_cta_rooms_of_the_target_gpus() {
    // The LDS holds the keys and either the candidate pairs or the 12-bit histogram.
    assert_eq!(lds_words(0, glm5()), 2 * 4096);
    assert_eq!(lds_words(0, TopK::new(16).unwrap()), WIDE_BINS);
    assert_eq!(one_cta_room(H200_SHARED_PER_BLOCK, glm5()), ONE_CTA_ROOM);
    assert_eq!(one_cta_room(GFX950_SHARED_PER_BLOCK, glm5()), 28672);
    // 160 KiB of dynamic LDS for 32K keys; the H200's 227 KiB takes it with the static part.
    assert_eq!(lds_words(ONE_CTA_ROOM, glm5()) * 4, 160 * 1024);
    assert_eq!(wide_finish(12), &[10, 10]);
    assert_eq!(wide_finish(24), &[8]);
    assert!(wide_finish(32).is_empty());
}

#[test]
fn limits_are_refused_with_a_reason() {
    assert_eq!(
        select_slices(MAX_ROW_KEYS + 1),
        Err(LayoutError::RowTooLong {
            len: MAX_ROW_KEYS + 1
        })
    );
    assert!(matches!(
        Slices::new(10, 4),
        Err(LayoutError::BadSliceCount { .. })
    ));
    assert_eq!(TopK::new(0), Err(LayoutError::BadK { k: 0 }));
    assert_eq!(TopK::new(u32::MAX), Err(LayoutError::BadK { k: u32::MAX }));
    // The contract holds for any k; the kernels build for k up to MAX_K.
    let big = TopK::new(MAX_K + 1).unwrap();
    assert_eq!(
        big.for_kernels(),
        Err(LayoutError::KernelK { k: MAX_K + 1 })
    );
    assert!(select::gpu::Shape::for_rows(select::gpu::Method::OneCta, big, 8192).is_err());
    assert!(TopK::new(MAX_K).unwrap().for_kernels().is_ok());
    assert_eq!(glm5().room(), 4096);
    let slicing = Slicing::production(SLICE_ROOM);
    assert_eq!(
        SelectPlan::new(&[], SelectKind::Slice, glm5(), 8, slicing, 0),
        Err(LayoutError::NoRows)
    );
    assert!(matches!(
        SelectPlan::new(&[MAX_ROW_KEYS], SelectKind::Slice, glm5(), 63, slicing, 0),
        Err(LayoutError::TooFewCtas { row: 0, .. })
    ));
    // 128K rows are 16 slices of 8K while four fit 132 CTAs; 512K rows take 33 slices of about
    // 16K at 4 rows (64 of 8K at 2 rows).
    let counts = |len: u32, rows: usize| {
        let plan =
            SelectPlan::new(&vec![len; rows], SelectKind::Slice, glm5(), 132, slicing, 0).unwrap();
        (plan.tasks().len() / rows, plan.ctas())
    };
    assert_eq!(counts(128 * 1024, 4), (16, 64));
    assert_eq!(counts(512 * 1024, 4), (33, 132));
    assert_eq!(counts(512 * 1024, 2), (64, 128));
}

/// Every length the layout accepts, not a sample: the slicing tiles it within the room, and
/// `longest_slice` is the longest slice of the rows up to each length. The longest row is 64
/// slices of exactly SLICE_ROOM; rows up to the target are one slice.
#[test]
fn every_accepted_length_slices_within_the_room() {
    let mut longest_so_far = 0;
    for len in 0..=MAX_ROW_KEYS {
        let s = select_slices(len).unwrap();
        check_tiling(&s);
        longest_so_far = longest_so_far.max(s.chunk());
        assert_eq!(
            longest_slice(len).unwrap(),
            longest_so_far,
            "rows up to {len}"
        );
    }
    let longest = select_slices(MAX_ROW_KEYS).unwrap();
    assert_eq!((longest.count(), longest.chunk()), (MAX_SLICES, SLICE_ROOM));
    assert_eq!(MAX_ROW_KEYS, 1 << 20);
    let shape = |len: u32| {
        let s = select_slices(len).unwrap();
        (s.count(), s.chunk())
    };
    assert_eq!(shape(SLICE_TARGET), (1, SLICE_TARGET));
    assert_eq!(shape(SLICE_TARGET + 1), (2, 4100));
    assert_eq!(shape(128 * 1024), (16, SLICE_TARGET));
    assert_eq!(shape(MAX_SLICES * SLICE_TARGET), (MAX_SLICES, SLICE_TARGET));
    assert_eq!(longest_slice(SLICE_TARGET + 1).unwrap(), SLICE_TARGET);
}

#[test]
fn the_fastest_method_changes_where_the_registers_run_out() {
    use select::gpu::Method;
    assert_eq!(Method::fastest_for(REG_MAX_ROW), Method::Registers);
    assert_eq!(Method::fastest_for(REG_MAX_ROW + 1), Method::MultiSlice);
    assert!(reg_keys_per_thread(REG_MAX_ROW + 1, CTA_THREADS).is_err());
    assert!(matches!(
        reg_keys_per_thread(100, 96),
        Err(LayoutError::BadRegBlock { block: 96 })
    ));
}
