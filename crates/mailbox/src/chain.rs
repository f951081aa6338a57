//! The longest chain of hand-offs in a placed launch: the second floor of its time beside its bytes
//! (DESIGN section 7). Each hand-off is a release, a box and a poll between two CTAs, about a
//! microsecond on the H200 when every CTA takes part (BENCHMARKS.md, dependent reads), and no
//! amount of bandwidth shortens the chain.

use crate::placement::ValidPlacement;
use std::collections::HashMap;

impl ValidPlacement {
    /// The most hand-offs on any path through the launch. A task that waits on boxes written by
    /// tasks of earlier ranks comes one hand-off after the deepest of those writers; it comes no
    /// earlier than the task before it on its CTA, which hands nothing over (the CTA runs its list
    /// in order). Gang peers that wait on each other add one hand-off to the deepest peer's start.
    /// A launch whose tasks wait on nothing has 0.
    pub fn hand_offs(&self) -> u32 {
        let lists = self.placement().lists();
        let writer = self
            .placement()
            .writers(self.limits().scratch_boxes)
            .expect("a checked placement has one writer a box");
        // Every task by rank, each with its CTA and its place in that CTA's list.
        let mut tasks: Vec<(u32, u32, usize)> = lists
            .iter()
            .enumerate()
            .flat_map(|(cta, list)| {
                list.iter()
                    .enumerate()
                    .map(move |(i, t)| (t.order, cta as u32, i))
            })
            .collect();
        tasks.sort_unstable();
        let mut depth: HashMap<(u32, u32), u32> = HashMap::new();
        let mut deepest = 0;
        for gang in tasks.chunk_by(|a, b| a.0 == b.0) {
            // Each member's start before its peers' boxes: its CTA's last task and its earlier
            // ranks' writers.
            let start: Vec<u32> = gang
                .iter()
                .map(|&(order, cta, i)| {
                    let list = &lists[cta as usize];
                    let after_own = i
                        .checked_sub(1)
                        .and_then(|p| depth.get(&(list[p].order, cta)).copied())
                        .unwrap_or(0);
                    waits(list, i, &writer)
                        .filter(|w| w.0 < order)
                        .filter_map(|w| depth.get(&w).map(|d| d + 1))
                        .fold(after_own, u32::max)
                })
                .collect();
            for (member, &(order, cta, i)) in gang.iter().enumerate() {
                let list = &lists[cta as usize];
                let after_peers = waits(list, i, &writer)
                    .filter(|w| w.0 == order)
                    .filter_map(|w| gang.iter().position(|m| (m.0, m.1) == w))
                    .map(|peer| start[peer] + 1)
                    .fold(start[member], u32::max);
                depth.insert((order, cta), after_peers);
                deepest = deepest.max(after_peers);
            }
        }
        deepest
    }
}

/// The writers (rank, CTA) of every box task `i` of `list` waits on.
fn waits<'a>(
    list: &'a [crate::Task],
    i: usize,
    writer: &'a [Option<(u32, u32)>],
) -> impl Iterator<Item = (u32, u32)> + 'a {
    list[i]
        .inputs()
        .iter()
        .flat_map(|r| r.boxes())
        .filter_map(move |b| writer[b as usize])
}
