//! Synthetic tasks for testing the launch machinery without model math: a random DAG of tasks
//! that combine their inputs with integer hashes, computed bit-identically here and on the device
//! (`kernels/synthetic.hip`). Every output word depends on every input word of its task (through
//! a row sum), so a single changed input reaches every sink downstream of it.

use crate::emulator::{TaskFailed, TaskFn};
use crate::layout::{value_of, BoxRange, LayoutError, ScratchLayout};
use crate::placement::Placement;
use crate::task::{Task, MAX_INPUTS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Reads its row from the launch's input buffer: `args[1]` is the offset there.
pub const KIND_LEAF: u32 = 1;
/// Combines its input rows.
pub const KIND_MIX: u32 = 2;
/// `args[2]` of a task that writes no row to the output buffer.
pub const NO_OUTPUT: u32 = u32::MAX;
/// The longest synthetic row; the kernel stages rows of this size (`MBX_SYN_ROW_MAX`).
pub const ROW_MAX: u32 = 64;

/// A bijective 32-bit mixer (xorshift-multiply rounds); each step is invertible, so a change of
/// the input always changes the output.
pub fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x85eb_ca6b);
    x ^= x >> 13;
    x = x.wrapping_mul(0xc2b2_ae35);
    x ^ (x >> 16)
}

fn row_sum(row: &[u32]) -> u32 {
    row.iter().fold(0u32, |s, &v| s.wrapping_add(v))
}

fn seed_word(salt: u32, i: u32) -> u32 {
    mix32(salt ^ i.wrapping_mul(0x9e37_79b9))
}

/// A leaf's row, from its slice of the launch inputs (as long as the row) and the step counter.
pub fn leaf_row(salt: u32, slice: &[u32], step: u32, out: &mut [u32]) {
    let sum = row_sum(slice);
    for (i, o) in out.iter_mut().enumerate() {
        let mut h = seed_word(salt, i as u32);
        h = mix32(h ^ slice[i % slice.len()]);
        h = mix32(h.wrapping_add(sum));
        *o = mix32(h ^ step.wrapping_mul(0x27d4_eb2f));
    }
}

/// A mixing task's row from its input rows (empty rows are skipped).
pub fn mix_row(salt: u32, inputs: &[&[u32]], out: &mut [u32]) {
    let sums: Vec<u32> = inputs.iter().map(|r| row_sum(r)).collect();
    for (i, o) in out.iter_mut().enumerate() {
        let i = i as u32;
        let mut h = seed_word(salt, i);
        for (r, row) in inputs.iter().enumerate().filter(|(_, row)| !row.is_empty()) {
            let len = row.len() as u32;
            let a = row[(i % len) as usize];
            let b = row[((i.wrapping_mul(7).wrapping_add(3)) % len) as usize];
            h = mix32(h ^ a);
            h = mix32(h.wrapping_add(b.rotate_left(5 * r as u32 + 1)));
            h = mix32(h ^ sums[r]);
        }
        *o = h;
    }
}

/// The legend name of a synthetic kind (`leaf`, `mix`), else the stage's own kind number.
pub fn kind_name(kind: u32) -> String {
    match kind {
        KIND_LEAF => "leaf".to_string(),
        KIND_MIX => "mix".to_string(),
        other => crate::trace::kind_name(other),
    }
}

/// The synthetic task function of one launch.
#[derive(Clone, Copy, Debug)]
pub struct Synthetic<'a> {
    /// The launch's input buffer (leaves read slices of it).
    pub inputs: &'a [u32],
    /// The step counter the device reads from its step word.
    pub step: u32,
}

impl TaskFn for Synthetic<'_> {
    fn run(&self, task: &Task, inputs: &[&[u32]], out: &mut [u32]) -> Result<(), TaskFailed> {
        let salt = task.args[0];
        match task.kind {
            KIND_LEAF if out.is_empty() => {}
            KIND_LEAF => {
                let start = task.args[1] as usize;
                let slice = self
                    .inputs
                    .get(start..start + out.len())
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| {
                        TaskFailed(format!(
                            "leaf reads inputs {start}..{} of {}",
                            start + out.len(),
                            self.inputs.len()
                        ))
                    })?;
                leaf_row(salt, slice, self.step, out);
            }
            KIND_MIX => mix_row(salt, inputs, out),
            kind => return Err(TaskFailed(format!("unknown synthetic kind {kind}"))),
        }
        Ok(())
    }
}

/// The size of a random DAG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DagShape {
    pub tasks: u32,
    /// The first `leaves` tasks are leaves.
    pub leaves: u32,
    /// Input ranges of a mixing task, 1 to this many (at most [`MAX_INPUTS`]).
    pub max_inputs: u32,
    /// Row length, 1 to this many boxes (at most [`ROW_MAX`]).
    pub max_row: u32,
    /// A task takes inputs from the `window` tasks before it: small windows make long chains.
    pub window: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SynthError {
    #[error("bad DAG shape {0:?}: need 1 <= leaves <= tasks, 1 <= max_inputs <= {MAX_INPUTS}, 1 <= max_row <= {ROW_MAX}, window >= 1")]
    Shape(DagShape),
    #[error(transparent)]
    Layout(#[from] LayoutError),
}

/// A random DAG of synthetic tasks, listed by rank (`tasks[i].order` never decreases); without
/// gangs `tasks[i].order == i`.
#[derive(Clone, Debug)]
pub struct SynthDag {
    pub tasks: Vec<Task>,
    /// One region, `rows`: a slot per task.
    pub layout: ScratchLayout,
    /// Words of the input buffer the leaves read.
    pub input_words: u32,
    /// Words of one launch's output: the rows of the sinks (tasks no later rank reads), back to back.
    pub out_words: u32,
}

impl SynthDag {
    pub fn random(seed: u64, shape: DagShape) -> Result<SynthDag, SynthError> {
        SynthDag::random_gangs(seed, shape, 1)
    }

    /// A random DAG whose ranks after the leaves' hold gangs of 1 to `max_gang` tasks. Each
    /// member of a gang waits on a part of the rows of 1 to 3 of its peers (the boxes they share)
    /// besides its inputs from the `window` tasks before its rank, at most [`MAX_INPUTS`] ranges in
    /// all; with `max_gang == 1` this is [`SynthDag::random`].
    pub fn random_gangs(seed: u64, shape: DagShape, max_gang: u32) -> Result<SynthDag, SynthError> {
        let ok = shape.leaves >= 1
            && shape.leaves <= shape.tasks
            && (1..=MAX_INPUTS as u32).contains(&shape.max_inputs)
            && (1..=ROW_MAX).contains(&shape.max_row)
            && shape.window >= 1
            && max_gang >= 1;
        if !ok {
            return Err(SynthError::Shape(shape));
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let mut builder = ScratchLayout::builder();
        let rows = builder.region::<u32>("rows", shape.tasks, shape.max_row)?;
        let mut tasks: Vec<Task> = Vec::with_capacity(shape.tasks as usize);
        let mut input_words = 0;
        let mut read = vec![false; shape.tasks as usize];
        let mut start = 0;
        while start < shape.tasks {
            let order = tasks.last().map_or(0, |t| t.order + 1);
            let size = if start < shape.leaves || max_gang == 1 {
                1
            } else {
                rng.gen_range(1..=max_gang.min(shape.tasks - start))
            };
            let gang = start..start + size;
            let mut members = Vec::with_capacity(size as usize);
            for index in gang.clone() {
                let len = rng.gen_range(1..=shape.max_row);
                let first = rows
                    .box_index(index, 0)
                    .ok_or(LayoutError::TooLarge { boxes: 0 })?;
                members.push((BoxRange::new(first, len), rng.gen::<u32>()));
            }
            for (index, &(out, salt)) in gang.clone().zip(&members) {
                let task = if index < shape.leaves {
                    input_words += out.len;
                    Task::new(
                        KIND_LEAF,
                        order,
                        out,
                        &[],
                        [salt, input_words - out.len, NO_OUTPUT],
                    )
                } else {
                    let peers: Vec<BoxRange> = gang
                        .clone()
                        .zip(&members)
                        .filter(|&(other, _)| other != index)
                        .map(|(_, &(row, _))| row)
                        .collect();
                    let n_peers = if peers.is_empty() {
                        0
                    } else {
                        rng.gen_range(1..=peers.len().min(MAX_INPUTS - 1))
                    };
                    let lo = start.saturating_sub(shape.window);
                    let most = shape
                        .max_inputs
                        .min(start - lo)
                        .min((MAX_INPUTS - n_peers) as u32);
                    let n = rng.gen_range(1..=most);
                    let mut producers: Vec<u32> = Vec::new();
                    while producers.len() < n as usize {
                        let p = rng.gen_range(lo..start);
                        if !producers.contains(&p) {
                            producers.push(p);
                            read[p as usize] = true;
                        }
                    }
                    let mut rows: Vec<BoxRange> =
                        producers.iter().map(|&p| tasks[p as usize].out).collect();
                    for i in rand::seq::index::sample(&mut rng, peers.len(), n_peers) {
                        rows.push(peers[i]);
                    }
                    let inputs: Vec<BoxRange> = rows
                        .iter()
                        .map(|row| {
                            let at = rng.gen_range(0..row.len);
                            BoxRange::new(row.first + at, rng.gen_range(1..=row.len - at))
                        })
                        .collect();
                    Task::new(KIND_MIX, order, out, &inputs, [salt, 0, NO_OUTPUT])
                };
                // At most MAX_INPUTS ranges were made, so this cannot fail; map it anyway.
                tasks.push(task.map_err(|_| SynthError::Shape(shape))?);
            }
            start += size;
        }
        let out_words = mark_sinks(&mut tasks, &read);
        Ok(SynthDag {
            tasks,
            layout: builder.build(),
            input_words,
            out_words,
        })
    }

    /// Each gang on random distinct CTAs (each task on a random CTA, without gangs); every CTA's
    /// list in global order, so the placement is valid. A gang larger than the grid cannot be
    /// placed: its members wrap around the CTAs, and the check rejects it.
    pub fn place_random(&self, ctas: u32, seed: u64) -> Placement {
        let mut rng = StdRng::seed_from_u64(seed);
        let n = ctas.max(1) as usize;
        let mut lists = vec![Vec::new(); n];
        for gang in self.tasks.chunk_by(|a, b| a.order == b.order) {
            if let [t] = gang {
                lists[rng.gen_range(0..n)].push(*t);
                continue;
            }
            let picks = if gang.len() <= n {
                rand::seq::index::sample(&mut rng, n, gang.len()).into_vec()
            } else {
                (0..gang.len()).map(|i| i % n).collect()
            };
            for (t, cta) in gang.iter().zip(picks) {
                lists[cta].push(*t);
            }
        }
        Placement::new(lists)
    }

    /// Task `i` on CTA `i % ctas` (so a gang no larger than the grid lands on distinct CTAs).
    pub fn place_round_robin(&self, ctas: u32) -> Placement {
        let mut lists = vec![Vec::new(); ctas.max(1) as usize];
        let n = lists.len();
        for (i, t) in self.tasks.iter().enumerate() {
            lists[i % n].push(*t);
        }
        Placement::new(lists)
    }

    /// Random launch inputs.
    pub fn random_inputs(&self, seed: u64) -> Vec<u32> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..self.input_words).map(|_| rng.gen()).collect()
    }

    /// One launch's output words, gathered from a scratch image as the kernel writes them.
    pub fn outputs(&self, image: &[u64]) -> Vec<u32> {
        let mut out = vec![0; self.out_words as usize];
        for t in self.tasks.iter().filter(|t| t.args[2] != NO_OUTPUT) {
            for (i, b) in t.out.boxes().enumerate() {
                if let (Some(o), Some(&w)) =
                    (out.get_mut(t.args[2] as usize + i), image.get(b as usize))
                {
                    *o = value_of(w);
                }
            }
        }
        out
    }
}

/// Gives every task whose row no later rank reads an offset in the output; returns the output's size.
fn mark_sinks(tasks: &mut [Task], read: &[bool]) -> u32 {
    let mut words = 0;
    for (t, &was_read) in tasks.iter_mut().zip(read) {
        if !was_read {
            t.args[2] = words;
            words += t.out.len;
        }
    }
    words
}
