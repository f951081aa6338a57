//! Properties of the scratch layout and the tag schedule.

use mailbox::layout::{Advance, LayoutError, ScratchLayout, Tags, BOXES_PER_LINE};
use proptest::prelude::*;
use std::collections::HashMap;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Regions are line-aligned, disjoint, packed in order and cover the scratch; every box of every
    /// slot is found again by `locate`; padding belongs to no one; and no line holds boxes of two
    /// slots (two writers), region borders included.
    #[test]
    fn regions_disjoint_aligned_and_covering(specs in prop::collection::vec((1u32..40, 1u32..70), 1..8)) {
        let mut b = ScratchLayout::builder();
        for (i, &(slots, words)) in specs.iter().enumerate() {
            if i % 2 == 0 {
                b.region::<u32>(&format!("r{i}"), slots, words).unwrap();
            } else {
                b.region::<f32>(&format!("r{i}"), slots, words).unwrap();
            }
        }
        let layout = b.build();
        prop_assert_eq!(layout.boxes() % BOXES_PER_LINE, 0);
        let mut end = 0u64;
        for (i, r) in layout.regions().iter().enumerate() {
            prop_assert_eq!(r.value_type, if i % 2 == 0 { "u32" } else { "f32" });
            prop_assert_eq!(r.offset as u64, end);
            prop_assert_eq!(r.offset % BOXES_PER_LINE, 0);
            prop_assert_eq!(r.stride % BOXES_PER_LINE, 0);
            prop_assert!(r.stride >= r.words && r.stride < r.words + BOXES_PER_LINE);
            prop_assert_eq!((r.slots, r.words), specs[i]);
            end += r.len();
        }
        prop_assert_eq!(end, layout.boxes() as u64);

        let mut owner_of_line: HashMap<u32, (usize, u32)> = HashMap::new();
        let mut owned = vec![false; layout.boxes() as usize];
        for (ri, r) in layout.regions().iter().enumerate() {
            for slot in 0..r.slots {
                for word in 0..r.words {
                    let index = r.offset + slot * r.stride + word;
                    let (found, s, w) = layout.locate(index).unwrap();
                    prop_assert_eq!((&found.name, s, w), (&r.name, slot, word));
                    let line_owner = *owner_of_line.entry(index / BOXES_PER_LINE).or_insert((ri, slot));
                    prop_assert_eq!(line_owner, (ri, slot), "line {} shared", index / BOXES_PER_LINE);
                    owned[index as usize] = true;
                }
            }
        }
        for (index, owned) in owned.iter().enumerate() {
            if !owned {
                prop_assert!(layout.locate(index as u32).is_none(), "padding box {} located", index);
            }
        }
        prop_assert!(layout.locate(layout.boxes()).is_none());
    }

    /// The typed handle agrees with the layout's record of the region.
    #[test]
    fn typed_handles_agree(slots in 1u32..50, words in 1u32..100, lead in 1u32..30) {
        let mut b = ScratchLayout::builder();
        b.region::<i32>("lead", 1, lead).unwrap();
        let r = b.region::<f32>("scores", slots, words).unwrap();
        let layout = b.build();
        let info = layout.region("scores").unwrap();
        prop_assert_eq!((r.offset(), r.stride(), r.slots(), r.words()), (info.offset, info.stride, info.slots, info.words));
        prop_assert_eq!(r.box_index(slots, 0), None);
        prop_assert_eq!(r.box_index(0, words), None);
        let last = r.slot(slots - 1).unwrap();
        prop_assert_eq!(last.end(), (info.offset + (slots - 1) * info.stride + words) as u64);
        let want = format!("scores slot {} word 0", slots - 1);
        prop_assert!(layout.describe(last.first).contains(&want));
    }

    /// Across consecutive replays of the epoch node, tags are never 0 and grow by exactly one a
    /// launch, except right after a clear, where they restart at 1.
    #[test]
    fn tags_grow_by_one_and_restart_only_after_a_clear(
        launches in 1u32..400,
        back in 0u32..4,
        steps in 1u32..8,
        anywhere in any::<u32>(),
        near_wrap in any::<bool>(),
    ) {
        let t = Tags::new(launches).unwrap();
        let mut epoch = if near_wrap { t.last_epoch().saturating_sub(back) } else { anywhere };
        let mut prev: Option<u32> = None;
        for _ in 0..steps {
            let Advance { epoch: next, clear } = t.advance(epoch);
            prop_assert_eq!(clear, epoch >= t.last_epoch());
            epoch = next;
            for i in 0..launches {
                let tag = t.tag(epoch, i).unwrap();
                prop_assert_ne!(tag, 0);
                match (prev, clear && i == 0) {
                    (_, true) => prop_assert_eq!(tag, 1),
                    (Some(p), false) => prop_assert_eq!(tag, p + 1),
                    (None, false) => {}
                }
                prev = Some(tag);
            }
        }
    }

    /// The last epoch is the last whose tags fit: its last tag is representable, the next epoch's is not.
    #[test]
    fn last_epoch_is_tight(launches in 1u32..=u32::MAX / 2) {
        let t = Tags::new(launches).unwrap();
        let last = t.last_epoch();
        prop_assert!(t.tag(last, launches - 1).is_ok());
        prop_assert!((last as u64 + 2) * launches as u64 > u32::MAX as u64);
        prop_assert_eq!(t.tag(last + 1, 0), Err(LayoutError::EpochPastEnd { epoch: last + 1, last }));
        let past_index = matches!(t.tag(0, launches), Err(LayoutError::LaunchIndex { .. }));
        prop_assert!(past_index);
    }
}

#[test]
fn the_header_has_the_same_line() {
    let header = mailbox::gpu::HEADER.1;
    assert!(header.contains(&format!("#define MBX_BOXES_PER_LINE {BOXES_PER_LINE}u\n")));
}
