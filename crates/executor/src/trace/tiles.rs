//! The linear tiles' milestones in a traced step (`mono trace --tiles`): each linear task's
//! `LIN_STAMP_*` clock readings (`kernels/ops/linear.h`), read back for the last launch of each
//! kind (the records sit at an address built into the kind's kernel, so each launch overwrites the
//! one before), as microseconds after the tile's start: when its input wait ended, x was in LDS,
//! the first and last batches were multiplied, the epilogue stored and the boxes published. A
//! pair task gives two rows, its gate/up's and its down's.

use linear::gpu::{stamp_milestones, STAMP_MILESTONES};
use mailbox::Task;

use crate::step::graph::TracedLaunch;

/// One tile range's milestones.
#[derive(Clone, Debug, PartialEq)]
pub struct TileRow {
    pub launch: String,
    pub kind: String,
    /// The task in words (`trace::names`), and which of a pair's matrices ("tiles" otherwise).
    pub task: String,
    pub part: &'static str,
    /// Each milestone after the first (`STAMP_MILESTONES[1..]`), us after the tile's start; None
    /// where the tile noted none (a range with no batch of its own).
    pub us: Vec<Option<f64>>,
}

/// The records (`linear::gpu::STAMP_WORDS` a box) of the tasks of `launch` that stream a matrix: a tiles task's
/// at its first box, a pair's gate/up there and its down at the next box. `us_per_tick` turns
/// clock readings into microseconds. A record whose tile start is zero was not written (a pair of
/// an unused slot, which publishes without a tile) and gives no row.
pub fn tile_rows(launch: &TracedLaunch, words: &[u64], us_per_tick: f64) -> Vec<TileRow> {
    let r = &launch.records;
    let mut rows = Vec::new();
    for (task, name) in r.table.tasks.iter().zip(&r.task_names) {
        for (part, record) in parts(task) {
            let Some(ticks) = stamp_milestones(words, record as usize) else {
                continue;
            };
            let us = ticks
                .into_iter()
                .map(|t| t.map(|t| t as f64 * us_per_tick))
                .collect();
            rows.push(TileRow {
                launch: launch.name.clone(),
                kind: launch.kind.clone(),
                task: name.clone(),
                part,
                us,
            });
        }
    }
    rows
}

fn parts(task: &Task) -> Vec<(&'static str, u32)> {
    match task.kind {
        linear::layout::KIND_TILES => vec![("tiles", task.out.first)],
        linear::layout::KIND_EXPERT_PAIR => {
            vec![("gate/up", task.out.first), ("down", task.out.first + 1)]
        }
        _ => Vec::new(),
    }
}

/// Tab-separated: a header, then a line a row.
pub fn tiles_tsv(rows: &[TileRow]) -> String {
    let mut text = String::from("launch\tkind\ttask\tpart");
    for m in &STAMP_MILESTONES[1..] {
        text.push_str(&format!("\t{m}_us"));
    }
    text.push('\n');
    for r in rows {
        text.push_str(&format!("{}\t{}\t{}\t{}", r.launch, r.kind, r.task, r.part));
        for v in &r.us {
            match v {
                Some(v) => text.push_str(&format!("\t{v:.3}")),
                None => text.push('\t'),
            }
        }
        text.push('\n');
    }
    text
}

/// A task's link: its name with every number as `#` and a tiles range as "tiles", so that the
/// tasks of one matrix (or one slot's pairs) share it.
pub fn link_of(task: &str) -> String {
    let mut out = String::new();
    let mut digits = false;
    for c in task.chars() {
        if c.is_ascii_digit() {
            if !digits {
                out.push('#');
            }
            digits = true;
        } else {
            digits = false;
            out.push(c);
        }
    }
    out.replace(" tiles #..#", " tiles")
        .replace(" tiles #", " tiles")
}

/// A line a (kind, link, part): its ranges and the median of each milestone, us after the tile's
/// start, in the order the kinds and links first appear.
pub fn tiles_summary(rows: &[TileRow]) -> String {
    // (kind, link, part) and its rows.
    type Group<'a> = ((String, String, &'static str), Vec<&'a TileRow>);
    let mut groups: Vec<Group> = Vec::new();
    for r in rows {
        let key = (r.kind.clone(), link_of(&r.task), r.part);
        match groups.iter_mut().find(|g| g.0 == key) {
            Some(g) => g.1.push(r),
            None => groups.push((key, vec![r])),
        }
    }
    let mut text = String::new();
    for ((kind, link, part), members) in groups {
        text.push_str(&format!("{kind}: {link} ({part}, {}):", members.len()));
        for (j, m) in STAMP_MILESTONES[1..].iter().enumerate() {
            let mut v: Vec<f64> = members.iter().filter_map(|r| r.us[j]).collect();
            if v.is_empty() {
                continue;
            }
            v.sort_by(f64::total_cmp);
            text.push_str(&format!(" {m} {:.2}", v[v.len() / 2]));
        }
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_name_a_matrix_or_a_slot_without_its_numbers() {
        assert_eq!(
            link_of("linear q_b_proj tiles 32..34"),
            "linear q_b_proj tiles"
        );
        assert_eq!(link_of("linear q_a_proj tiles 47"), "linear q_a_proj tiles");
        assert_eq!(
            link_of("linear W_UK head 3 tiles 20..24"),
            "linear W_UK head # tiles"
        );
        assert_eq!(
            link_of("moe expert slot 0 gate/up tiles 2..4, down tiles 24..48"),
            "moe expert slot # gate/up tiles, down tiles"
        );
    }
}
