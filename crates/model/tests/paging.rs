//! The paged caches' contract: page tables, slots and the score rows' stride.

use model::paging::{pages_through, score_stride, PageTable, MAX_PAGES, PAGE_TOKENS};
use proptest::prelude::*;

#[test]
fn slots_follow_the_page_table() {
    let table = PageTable::new(&[vec![7, 3], vec![5]]).unwrap();
    assert_eq!(table.locate(0, 0), Some((7, 0)));
    assert_eq!(table.locate(0, 64 + 5), Some((3, 5)));
    assert_eq!(table.locate(0, 128), None);
    assert_eq!(table.locate(1, 63), Some((5, 63)));
    assert_eq!(table.locate(2, 0), None, "no such request");
    assert_eq!(table.slot(0, 64 + 5), Some(3 * 64 + 5));
    assert_eq!(table.slot(1, 64), None);
    assert_eq!(table.flat(), &[7, 3, 5]);
    assert_eq!((table.offset(1), table.requests()), (2, 2));
}

#[test]
fn pages_whose_slots_pass_an_i32_are_refused() {
    let last = MAX_PAGES - 1;
    let table = PageTable::new(&[vec![last]]).unwrap();
    assert_eq!(table.slot(0, PAGE_TOKENS - 1), Some(i32::MAX));
    let err = PageTable::new(&[vec![0], vec![1, MAX_PAGES]]).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("request 1") && text.contains("logical page 1"),
        "{text}"
    );
}

#[test]
fn contiguous_tables_give_each_request_its_own_pages() {
    let table = PageTable::contiguous(3, 2).unwrap();
    assert_eq!(table.pages(2), &[4, 5]);
    assert_eq!(table.slot(1, 70), Some((2 + 1) * 64 + 6));
}

proptest! {
    #[test]
    fn the_score_stride_is_the_fewest_whole_pages_holding_the_row(keys in 0u32..1 << 24) {
        let stride = score_stride(keys);
        prop_assert_eq!(stride % PAGE_TOKENS, 0);
        prop_assert!(stride >= keys.max(1));
        prop_assert!(stride - PAGE_TOKENS < keys.max(1));
        if keys > 0 {
            prop_assert_eq!(stride, pages_through(keys - 1) * PAGE_TOKENS);
        }
    }

    #[test]
    fn a_slot_is_its_page_and_place(
        pages in prop::collection::vec(0u32..MAX_PAGES, 1..20),
        position in 0u32..20 * 64,
    ) {
        let table = PageTable::new(std::slice::from_ref(&pages)).unwrap();
        match pages.get((position / PAGE_TOKENS) as usize) {
            Some(&page) => {
                let slot = table.slot(0, position).unwrap();
                prop_assert!(slot >= 0);
                prop_assert_eq!(slot as u32 / PAGE_TOKENS, page);
                prop_assert_eq!(slot as u32 % PAGE_TOKENS, position % PAGE_TOKENS);
            }
            None => prop_assert_eq!(table.slot(0, position), None),
        }
    }
}
