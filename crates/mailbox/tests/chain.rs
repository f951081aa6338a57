//! The longest chain of hand-offs of a placed launch, on small placements whose chains are known,
//! and on random chains spread over random CTAs.

use mailbox::layout::{BoxRange, BOXES_PER_LINE};
use mailbox::placement::{Limits, Placement};
use mailbox::synth::KIND_MIX;
use mailbox::task::Task;
use proptest::prelude::*;

/// A task of rank `order` that writes line `line` and waits on the lines `waits`.
fn task(order: u32, line: u32, waits: &[u32]) -> Task {
    let inputs: Vec<BoxRange> = waits.iter().map(|&l| row(l)).collect();
    Task::new(KIND_MIX, order, row(line), &inputs, [0; 3]).unwrap()
}

fn row(line: u32) -> BoxRange {
    BoxRange::new(line * BOXES_PER_LINE, 4)
}

fn hand_offs(lists: Vec<Vec<Task>>) -> u32 {
    let limits = Limits {
        max_resident: lists.len() as u32,
        scratch_boxes: 64 * BOXES_PER_LINE,
    };
    Placement::new(lists).check(limits).unwrap().hand_offs()
}

#[test]
fn tasks_that_wait_on_nothing_hand_nothing_over() {
    assert_eq!(hand_offs(vec![vec![task(0, 0, &[]), task(1, 1, &[])]]), 0);
    assert_eq!(
        hand_offs(vec![vec![task(0, 0, &[])], vec![task(1, 1, &[])]]),
        0
    );
}

#[test]
fn a_chain_over_three_ctas_is_two_hand_offs() {
    let lists = vec![
        vec![task(0, 0, &[])],
        vec![task(1, 1, &[0])],
        vec![task(2, 2, &[1])],
    ];
    assert_eq!(hand_offs(lists), 2);
}

#[test]
fn a_diamond_counts_its_longer_side() {
    // 0 -> 1 -> 3 and 0 -> 2 -> 3, and 4 after 1 alone.
    let lists = vec![
        vec![task(0, 0, &[]), task(3, 3, &[1, 2])],
        vec![task(1, 1, &[0])],
        vec![task(2, 2, &[0]), task(4, 4, &[1])],
    ];
    assert_eq!(hand_offs(lists), 2);
}

#[test]
fn a_task_starts_no_earlier_than_the_one_before_it_on_its_cta() {
    // Task 3 waits on task 0 alone (one hand-off), but follows task 2 on its CTA, two hand-offs
    // deep: it starts after both, and so does task 4, which waits on it.
    let lists = vec![
        vec![task(0, 0, &[])],
        vec![task(1, 1, &[0])],
        vec![task(2, 2, &[1]), task(3, 3, &[0])],
        vec![task(4, 4, &[3])],
    ];
    assert_eq!(hand_offs(lists), 3);
}

#[test]
fn gang_peers_add_one_hand_off() {
    // Two members of rank 1 each wait on task 0 and on the other: the all-gather is one more.
    let lists = vec![
        vec![task(0, 0, &[]), task(1, 1, &[0, 2])],
        vec![task(1, 2, &[0, 1])],
        vec![task(2, 3, &[1, 2])],
    ];
    assert_eq!(hand_offs(lists), 3);
}

proptest! {
    /// A chain of n tasks, each waiting on the one before, is n - 1 hand-offs wherever its tasks
    /// sit; a second chain of m tasks on a CTA of its own leaves the longest, max(n, m) - 1.
    #[test]
    fn a_chain_is_its_length_less_one_on_any_ctas(
        ctas in prop::collection::vec(0usize..4, 1..12),
        side in 0usize..16,
    ) {
        let n = ctas.len();
        let mut lists = vec![Vec::new(); 5];
        for (i, &cta) in ctas.iter().enumerate() {
            let waits: Vec<u32> = if i == 0 { vec![] } else { vec![i as u32 - 1] };
            lists[cta].push(task(i as u32, i as u32, &waits));
        }
        for j in 0..side {
            let waits: Vec<u32> = if j == 0 { vec![] } else { vec![32 + j as u32 - 1] };
            lists[4].push(task((n + j) as u32, 32 + j as u32, &waits));
        }
        prop_assert_eq!(hand_offs(lists), (n.max(side) - 1) as u32);
    }
}
