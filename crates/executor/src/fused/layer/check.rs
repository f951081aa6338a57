//! The launch's data dependencies, checked: for every byte range of the arena a task reads, every
//! other task of the launch that writes any of it must come before it on a chain of waits (the
//! task waits on a box the writer wrote, or on a box of a task that did, and so on). The
//! placement check sees boxes only; this one knows what the boxes stand for.
//!
//! What each task reads and writes follows from its kind, its arguments and the parts' plans
//! ([`accesses`]): the linear tasks from their matrices' descriptors (bound at arena address 0, so
//! addresses are offsets), the head tasks from their descriptors, the MLA row tasks, Slots tasks,
//! cache writes, splits and combines from the half's arena, the index keys, queries and scores
//! and select from the front half's plan, the MoE part by its inputs and output (its inner
//! hand-offs are `fused::moe::check_moe_handoff`'s). The attention's partial outputs between its
//! splits and combines are the MLA stage's own (its crate checks them) and are not modelled.

use super::LayerPlan;
use crate::fused::attention::{HalfMatrix, HalfPlan, HalfWeights, PackedAt};
use crate::fused::front::FrontGraph;
use crate::fused::head::{DenseWeights, HeadDescriptors, TailWeights};
use indexer::layout::TaskKind as IdxKind;
use linear::gpu::{LinMatrix, FLAG_OUT_F32, FLAG_RESIDUAL, FLAG_RMSNORM};
use linear::layout::{KIND_EXPERT_PAIR, KIND_TILES};
use mailbox::{Placement, Stage, Task};
use mla::layout::{MlaKind, NormOf};
use model::paging::PAGE_TOKENS;
use moe::layout::{KIND_COMBINE, MAT_ROUTER, MAT_SHARED_GATE_UP};
use std::collections::HashMap;
use std::ops::Range;

/// The arena bytes one task reads and writes (offsets from the arena's start).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    pub reads: Vec<Range<u64>>,
    pub writes: Vec<Range<u64>>,
}

/// A dependency the launch misses, or a task the checker cannot place.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DependencyError {
    #[error("task {reader} (kind {reader_kind:#x}) reads arena bytes {start}..{end} that task {writer} (kind {writer_kind:#x}) writes, without waiting on it")]
    Missed {
        reader: u32,
        reader_kind: u32,
        writer: u32,
        writer_kind: u32,
        start: u64,
        end: u64,
    },
    #[error("task {order} (kind {kind:#x}): {what}")]
    Unknown { order: u32, kind: u32, what: String },
}

fn bf16_rows(base: u64, first: u32, n: u32, cols: u64) -> Range<u64> {
    let start = base + u64::from(first) * cols * 2;
    start..start + u64::from(n) * cols * 2
}

/// The bytes a matrix's linear tasks read (x, as far as its rows go where they are shorter than
/// k, or with the RMSNorm prologue the whole source rows it norms; the residual) and write (y).
fn matrix_access(m: &LinMatrix) -> Access {
    let rows = u64::from(m.rows.max(1));
    let out = if m.flags & FLAG_OUT_F32 != 0 { 4 } else { 2 };
    let span = |base: u64, stride: u32, width: u32, bytes: u64| {
        base..base + ((rows - 1) * u64::from(stride) + u64::from(width)) * bytes
    };
    let x = if m.flags & FLAG_RMSNORM != 0 {
        let row = m.x.saturating_sub(2 * u64::from(m.row_at));
        span(row, m.x_stride, m.row_len, 2)
    } else if m.row_len != 0 {
        span(m.x, m.x_stride, m.row_len - m.row_at, 2)
    } else {
        span(m.x, m.x_stride, m.k, 2)
    };
    let mut reads = vec![x];
    if m.flags & FLAG_RESIDUAL != 0 {
        reads.push(span(m.residual, m.y_stride, m.n, 2));
    }
    Access {
        reads,
        writes: vec![span(m.y, m.y_stride, m.n, out)],
    }
}

/// The launch's matrices and head descriptors bound at arena address 0 (weights at 0): their
/// pointers are arena offsets.
fn bound_at_zero(plan: &LayerPlan) -> (Vec<Option<LinMatrix>>, HeadDescriptors) {
    let mut mats = vec![LinMatrix::default(); plan.launch.matrices as usize];
    let mut bound = vec![false; mats.len()];
    let mut d = HeadDescriptors::new(&plan.head_lists);
    let put = |mats: &mut Vec<LinMatrix>, bound: &mut Vec<bool>, i: u32, m: LinMatrix| {
        if let Some(slot) = mats.get_mut(i as usize) {
            *slot = m;
            bound[i as usize] = true;
        }
    };
    if let Some(half) = &plan.attention {
        let w = HalfWeights {
            matrices: vec![PackedAt::default(); HalfMatrix::all(half.dims.heads).len()],
            ..HalfWeights::default()
        };
        let half_mats = half
            .matrices(0, &w)
            .expect("zero weight addresses are aligned");
        for (i, m) in half_mats.into_iter().enumerate() {
            put(&mut mats, &mut bound, half.first_matrix + i as u32, m);
        }
    }
    if let Some(ix) = &plan.index {
        let ix_mats = ix
            .projections
            .matrices(0, &Default::default())
            .expect("zero weight addresses are aligned");
        for (i, m) in ix_mats {
            put(&mut mats, &mut bound, i, m);
        }
    }
    if let Some(dense) = &plan.dense {
        let mut all = mats.clone();
        dense.bind(0, &DenseWeights::default(), &mut all, &mut d);
        for i in [dense.gate_up, dense.down] {
            put(&mut mats, &mut bound, i, all[i as usize]);
        }
    }
    if let Some(tail) = &plan.tail {
        let mut all = mats.clone();
        tail.bind(0, &TailWeights::default(), &mut all, &mut d);
        put(
            &mut mats,
            &mut bound,
            tail.lm_head,
            all[tail.lm_head as usize],
        );
    }
    if let Some(embed) = &plan.embed {
        embed.bind(0, 0, 0, plan.slices.tokens.offset, &mut d);
    }
    let mats = mats
        .into_iter()
        .zip(bound)
        .map(|(m, b)| b.then_some(m))
        .collect();
    (mats, d)
}

/// What a task of the attention's MLA stage reads and writes.
fn mla_access(half: &HalfPlan, slot_lists: u64, topk: u64, t: &Task) -> Option<Access> {
    let (a, d) = (&half.arena, &half.dims);
    let (heads, latent, rope) = (d.heads as u64, d.latent as u64, d.rope as u64);
    let own = t.kind & 0xff;
    let (first, n) = (t.args[0], t.args[1]);
    let mut x = Access::default();
    if own == MlaKind::Norm as u32 {
        let which = t.args[2];
        if which == NormOf::Hidden as u32 {
            x.reads.push(bf16_rows(a.hidden, first, n, d.hidden as u64));
            x.writes
                .push(bf16_rows(a.hidden_normed, first, n, d.hidden as u64));
        } else if which == NormOf::QLatent as u32 {
            // A layer launch has no slice for it: q_b and wq_b norm q_a's output themselves.
            return None;
        } else {
            x.reads.push(bf16_rows(a.kv_a, first, n, latent + rope));
            x.writes.push(bf16_rows(a.new_latent, first, n, latent));
            x.writes.push(bf16_rows(a.new_rope, first, n, rope));
        }
    } else if own == MlaKind::RopeQ as u32 {
        x.reads
            .push(bf16_rows(a.q, first, n, heads * d.qk() as u64));
        x.writes.push(bf16_rows(a.q_pe, first, n, heads * rope));
    } else if own == MlaKind::Slots as u32 {
        let start = slot_lists + u64::from(first) * topk * 4;
        x.reads.push(start..start + u64::from(n) * topk * 4);
    } else if own == MlaKind::CacheWrite as u32 {
        x.reads.push(bf16_rows(a.new_latent, first, n, latent));
        x.reads.push(bf16_rows(a.new_rope, first, n, rope));
    } else if own == MlaKind::Split as u32 {
        let n = n & 0x7f;
        x.reads.push(bf16_rows(a.q_abs, first, n, heads * latent));
        x.reads.push(bf16_rows(a.q_pe, first, n, heads * rope));
        x.reads.push(bf16_rows(a.new_latent, first, n, latent));
        x.reads.push(bf16_rows(a.new_rope, first, n, rope));
    } else if own == MlaKind::Combine as u32 {
        let (q0, nq) = (t.args[2] & 0xffff, t.args[2] >> 16);
        let start = a.attn + (u64::from(first) * heads + u64::from(q0)) * latent * 2;
        x.writes.push(start..start + u64::from(nq) * latent * 2);
    } else {
        return None;
    }
    Some(x)
}

/// What every task of `placement` reads and writes, by its position in `placement.tasks()`.
pub fn accesses(plan: &LayerPlan, placement: &Placement) -> Result<Vec<Access>, DependencyError> {
    let (mats, heads) = bound_at_zero(plan);
    let topk = u64::from(plan.slices.dims.topk);
    let slot_lists = plan.slices.slot_lists.offset;
    // The MoE's input readers norm the attention's output rows as they stage them.
    let moe_x = plan
        .moe
        .as_ref()
        .and(plan.attention.as_ref())
        .map(|h| h.out.data);
    let mut out = Vec::new();
    for (_, t) in placement.tasks() {
        let unknown = |what: &str| DependencyError::Unknown {
            order: t.order,
            kind: t.kind,
            what: what.to_owned(),
        };
        let range = |s: crate::fused::ArenaSlice| s.offset..s.offset + s.bytes;
        let moe = plan.moe.as_ref();
        let in_moe = |i: u32| {
            moe.is_some_and(|m| {
                (m.first_matrix..m.first_matrix + 2 + m.shape.router_splits() as u32).contains(&i)
            })
        };
        let access = match t.stage_bits() {
            s if s == Stage::Linear as u32 && t.kind == KIND_TILES => {
                let i = t.args[0];
                if in_moe(i) {
                    let m = moe.expect("a MoE part");
                    let local = i - m.first_matrix;
                    let reads_x = local == MAT_SHARED_GATE_UP || local >= MAT_ROUTER;
                    Access {
                        reads: moe_x.filter(|_| reads_x).map(range).into_iter().collect(),
                        writes: Vec::new(),
                    }
                } else {
                    let m = mats
                        .get(i as usize)
                        .copied()
                        .flatten()
                        .ok_or_else(|| unknown("a matrix no part binds"))?;
                    matrix_access(&m)
                }
            }
            // A pair's gate/up reads the MoE input; its down, the gang's own rows.
            s if s == Stage::Linear as u32 && t.kind == KIND_EXPERT_PAIR => Access {
                reads: moe_x.map(range).into_iter().collect(),
                writes: Vec::new(),
            },
            s if s == Stage::Moe as u32 => {
                plan.moe.as_ref().ok_or_else(|| unknown("no MoE part"))?;
                if t.kind == KIND_COMBINE {
                    let residual = plan.attention.as_ref().map(|h| h.out.data);
                    Access {
                        reads: residual.map(range).into_iter().collect(),
                        writes: vec![range(plan.out.data)],
                    }
                } else {
                    Access::default()
                }
            }
            s if s == Stage::Mla as u32 => {
                let half = plan
                    .attention
                    .as_ref()
                    .ok_or_else(|| unknown("no attention"))?;
                mla_access(half, slot_lists, topk, t).ok_or_else(|| unknown("an MLA kind"))?
            }
            s if s == Stage::Indexer as u32 => {
                let ix = plan.index.as_ref().ok_or_else(|| unknown("no indexer"))?;
                index_access(ix, t).ok_or_else(|| unknown("an indexer kind"))?
            }
            s if s == Stage::Select as u32 => {
                let ix = plan.index.as_ref().ok_or_else(|| unknown("no indexer"))?;
                let row = t.args[0];
                let r = FrontGraph::select_range(t);
                let stride = u64::from(ix.front.plan.stride);
                let base = ix.scores.offset + u64::from(row) * stride * 4;
                let list = plan.slices.slot_list(row);
                let scores = base + u64::from(r.start) * 4..base + u64::from(r.end) * 4;
                Access {
                    reads: std::iter::once(scores).collect(),
                    writes: vec![range(list)],
                }
            }
            s if s == Stage::Head as u32 => {
                head_access(&heads, t).ok_or_else(|| unknown("a head kind"))?
            }
            _ => return Err(unknown("a stage no layer runs")),
        };
        out.push(access);
    }
    Ok(out)
}

/// What an index key, query or score task reads and writes.
fn index_access(ix: &super::IndexPart, t: &Task) -> Option<Access> {
    let p = &ix.projections;
    let d = p.dims;
    let own = t.kind & 0xff;
    let mut x = Access::default();
    if own == IdxKind::Key as u32 {
        x.reads.push(bf16_rows(
            p.key_proj.offset,
            t.args[0],
            1,
            u64::from(d.head_dim),
        ));
    } else if own == IdxKind::Query as u32 {
        let r = u64::from(t.args[0]);
        x.reads.push(bf16_rows(
            p.query_proj.offset,
            t.args[0],
            1,
            u64::from(d.heads * d.head_dim),
        ));
        let g = p.gates.offset + r * u64::from(d.heads) * 4;
        x.reads.push(g..g + u64::from(d.heads) * 4);
    } else if own == IdxKind::Score as u32 {
        let plan = &ix.front.plan;
        let stride = u64::from(plan.stride);
        for run in plan
            .runs
            .iter()
            .skip(t.args[0] as usize)
            .take(t.args[1] as usize)
        {
            let group = plan.groups[run.group as usize];
            for row in group.first_row..group.first_row + group.n_rows {
                let first = u64::from(run.first_page * PAGE_TOKENS);
                let base = ix.scores.offset + (u64::from(row) * stride + first) * 4;
                x.writes
                    .push(base..base + u64::from(run.n_pages * PAGE_TOKENS) * 4);
            }
        }
    } else {
        return None;
    }
    Some(x)
}

/// What a head task reads and writes, from the descriptors bound at arena address 0.
fn head_access(d: &HeadDescriptors, t: &Task) -> Option<Access> {
    use head::layout::{KIND_ARGMAX, KIND_EMBED, KIND_NORM, KIND_PICK};
    let (op, first, n) = (t.args[0] as usize, t.args[1], t.args[2]);
    let rows = |base: u64, stride: u32, width: u32, bytes: u64| {
        let start = base + u64::from(first) * u64::from(stride) * bytes;
        start..start + ((u64::from(n) - 1) * u64::from(stride) + u64::from(width)) * bytes
    };
    let mut x = Access::default();
    if t.kind == KIND_NORM {
        let m = d.norms.get(op)?;
        x.reads.push(rows(m.x, m.x_stride, m.n, 2));
        x.writes.push(rows(m.y, m.y_stride, m.n, 2));
    } else if t.kind == KIND_EMBED {
        let m = d.embeds.get(op)?;
        x.writes.push(rows(m.y, m.y_stride, m.hidden, 2));
    } else if t.kind == KIND_ARGMAX {
        let m = d.argmaxes.get(op)?;
        x.reads.push(rows(m.logits, m.stride, m.n, 2));
        x.writes.push(rows(m.pairs, m.shards, m.shards, 8));
    } else if t.kind == KIND_PICK {
        let m = d.picks.get(op)?;
        x.reads.push(rows(m.pairs, m.shards, m.shards, 8));
        x.writes.push(rows(m.tokens, 1, 1, 4));
    } else {
        return None;
    }
    Some(x)
}

/// Every task of `placement` reaches, through its waits, every other task that writes arena
/// bytes it reads (the module doc says what is modelled).
pub fn check_dependencies(plan: &LayerPlan, placement: &Placement) -> Result<(), DependencyError> {
    let tasks: Vec<&Task> = placement.tasks().map(|(_, t)| t).collect();
    let access = accesses(plan, placement)?;
    let mut writer: HashMap<u64, usize> = HashMap::new();
    for (i, t) in tasks.iter().enumerate() {
        for b in t.out.boxes() {
            writer.insert(b, i);
        }
    }
    // Direct predecessors: the writers of the boxes each task waits on.
    let preds: Vec<Vec<usize>> = tasks
        .iter()
        .map(|t| {
            let mut p: Vec<usize> = t
                .inputs()
                .iter()
                .flat_map(|r| r.boxes())
                .filter_map(|b| writer.get(&b).copied())
                .collect();
            p.sort_unstable();
            p.dedup();
            p
        })
        .collect();
    // Ancestors as bit sets, in rank order; a gang's members (one rank) may wait on each other,
    // so a rank is repeated until nothing changes.
    let words = tasks.len().div_ceil(64);
    let mut anc = vec![vec![0u64; words]; tasks.len()];
    let mut by_rank: Vec<usize> = (0..tasks.len()).collect();
    by_rank.sort_by_key(|&i| tasks[i].order);
    let mut start = 0;
    while start < by_rank.len() {
        let rank = tasks[by_rank[start]].order;
        let end = by_rank[start..]
            .iter()
            .position(|&i| tasks[i].order != rank)
            .map_or(by_rank.len(), |n| start + n);
        loop {
            let mut changed = false;
            for &i in &by_rank[start..end] {
                let mut set = anc[i].clone();
                for &p in &preds[i] {
                    set[p / 64] |= 1 << (p % 64);
                    for (w, a) in set.iter_mut().zip(&anc[p]) {
                        *w |= a;
                    }
                }
                if set != anc[i] {
                    anc[i] = set;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        start = end;
    }
    for (i, t) in tasks.iter().enumerate() {
        for read in &access[i].reads {
            for (j, w) in tasks.iter().enumerate() {
                if j == i || anc[i][j / 64] & (1 << (j % 64)) != 0 {
                    continue;
                }
                if let Some(hit) = access[j]
                    .writes
                    .iter()
                    .find(|r| r.start < read.end && read.start < r.end)
                {
                    return Err(DependencyError::Missed {
                        reader: t.order,
                        reader_kind: t.kind,
                        writer: w.order,
                        writer_kind: w.kind,
                        start: hit.start.max(read.start),
                        end: hit.end.min(read.end),
                    });
                }
            }
        }
    }
    Ok(())
}
