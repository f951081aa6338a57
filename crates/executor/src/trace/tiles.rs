//! The linear tiles' milestones in a traced step (`mono trace --tiles`): each linear task's
//! `LIN_STAMP_*` clock readings (`kernels/ops/linear.h`), read back for the last launch of each
//! kind (the records sit at an address built into the kind's kernel, so each launch overwrites the
//! one before), as microseconds after the tile's start: when its input wait ended, x was in LDS,
//! the first and last batches were multiplied, the epilogue stored, the boxes published and the
//! slowest group's last batch was multiplied. A pair task gives two rows, its gate/up's and its
//! down's.

use device::timing::median;
use linear::gpu::{stamp_milestones, STAMP_MILESTONES};
use mailbox::trace::{Record, RECORD_MARK};
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

/// The SM clock the launch's task records saw, in us a tick: their cycles over their shared-clock
/// nanoseconds, over the tasks of at least 2 us (the shared clock steps by about 0.26 us). The
/// device's nominal clock is its highest, and a loaded H200 ran about 5 % below it, which made
/// every milestone that much early. None where no task ran that long.
pub fn us_per_tick_seen(launch: &TracedLaunch) -> Option<f64> {
    let words = &launch.records.words;
    let records: &[Record] = bytemuck::try_cast_slice(words).ok()?;
    let (mut ns, mut ticks) = (0u64, 0u64);
    for r in records.iter().filter(|r| r.mark == RECORD_MARK) {
        let span_ns = r.end_ns.saturating_sub(r.start_ns);
        if span_ns >= 2_000 {
            ns += span_ns;
            ticks += r.end_cycles.saturating_sub(r.start_cycles);
        }
    }
    (ns > 0 && ticks > 0).then(|| ns as f64 * 1e-3 / ticks as f64)
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
            let v: Vec<f64> = members.iter().filter_map(|r| r.us[j]).collect();
            if v.is_empty() {
                continue;
            }
            text.push_str(&format!(" {m} {:.2}", median(&v)));
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

    fn launch_of(records: &[Record]) -> TracedLaunch {
        TracedLaunch {
            name: "layer 0".into(),
            kind: "test".into(),
            records: crate::step::graph::LaunchRecords {
                table: mailbox::TaskTable {
                    tasks: Vec::new(),
                    offsets: vec![0],
                },
                words: bytemuck::cast_slice(records).to_vec(),
                task_names: Vec::new(),
            },
        }
    }

    fn record(ns: u64, cycles: u64) -> Record {
        Record {
            start_ns: 1_000,
            end_ns: 1_000 + ns,
            start_cycles: 5_000,
            end_cycles: 5_000 + cycles,
            sm: 0,
            cta: 0,
            order_kind: 0,
            mark: RECORD_MARK,
        }
    }

    #[test]
    fn the_clock_is_the_one_the_long_tasks_saw() {
        // 1.88 GHz over 10 us of long tasks; the 1 us task (coarse on the shared clock) and the
        // unwritten record do not count.
        let mut unwritten = record(4_000, 1);
        unwritten.mark = 0;
        let launch = launch_of(&[
            record(6_000, 11_280),
            record(4_000, 7_520),
            record(1_000, 9_000),
            unwritten,
        ]);
        let tick = us_per_tick_seen(&launch).unwrap();
        assert!((1e-3 / tick - 1.88).abs() < 1e-9, "{}", 1e-3 / tick);
        // Negative control: with the short task counted the clock would read otherwise.
        let all = launch_of(&[
            record(6_000, 11_280),
            record(4_000, 7_520),
            record(2_000, 9_000),
        ]);
        assert!((1e-3 / us_per_tick_seen(&all).unwrap() - 1.88).abs() > 0.1);
        assert_eq!(us_per_tick_seen(&launch_of(&[record(1_000, 1_880)])), None);
    }
}
