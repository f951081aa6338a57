//! The device's discrete choices of a step (a full-indexer layer's top-k lists, an MoE layer's
//! routed experts) read from the arena, and those choices against the reference's own over its
//! own scores. The indexer's FP8 scores order near-ties at the k-th key differently from the
//! reference's (a router's near-tie likewise), and a step that attends over other keys or routes
//! to other experts computes something else from then on; so a check steps the reference with the
//! device's choices ([`Choices`]) and accepts one that is not the reference's own only where the
//! reference's gap between the swapped entries is at most the device's measured error on them.

use device::Buffer;
use model::paging::{PageTable, PAGE_TOKENS};
use model::ModelConfig;
use moe::reference::{choose, Routing};
use select::{select_row, TopK};

use super::lists::{check_lists, read_front, slice_words, ListMismatch};
use crate::fused::layer::LayerPlan;
use crate::reference::{Choices, Row};
use crate::step::{Result, StepError};

/// A full-indexer layer's front half as the launch left it.
#[derive(Clone, Debug, PartialEq)]
pub struct FrontLook {
    /// `[rows][stride]`.
    pub scores: Vec<f32>,
    /// `[rows][k]` cache slots, -1 padded.
    pub lists: Vec<i32>,
    /// Where the lists first part from the reference select of the launch's own scores.
    pub own_select: Option<ListMismatch>,
}

/// An MoE layer's routing as the launch left it.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteLook {
    /// `[rows][experts]`: the router's scores (sigmoid of its logits, before the bias).
    pub scores: Vec<f32>,
    /// `[rows][top_k]`: the experts it routed each row to, in rank order.
    pub experts: Vec<u32>,
}

/// The front half launch `plan` left in `arena`, its lists checked against the reference select
/// of its own scores; `None` when it runs no indexer.
pub fn read_front_look(plan: &LayerPlan, arena: &Buffer<u8>) -> Result<Option<FrontLook>> {
    read_front(plan, arena)?
        .map(|f| {
            Ok(FrontLook {
                own_select: check_lists(plan, &f)?,
                scores: f.scores,
                lists: f.lists,
            })
        })
        .transpose()
}

/// The routing launch `plan` left in `arena` for its `rows` rows (the router's split partial
/// logits summed, then the sigmoid); `None` when it routes nothing.
pub fn read_route(
    cfg: &ModelConfig,
    plan: &LayerPlan,
    arena: &Buffer<u8>,
    rows: usize,
) -> Result<Option<RouteLook>> {
    let Some(m) = &plan.moe else {
        return Ok(None);
    };
    let experts = cfg.n_routed_experts;
    let partial = slice_words::<u32>(arena, m.slices.logits)?;
    let mut logits = vec![0f32; rows * experts];
    for split in partial.chunks_exact(rows * experts) {
        for (acc, &v) in logits.iter_mut().zip(split) {
            *acc += f32::from_bits(v);
        }
    }
    let chosen = slice_words::<u32>(arena, m.slices.row_experts)?;
    let top = rows * cfg.num_experts_per_tok;
    if chosen.len() < top {
        return Err(StepError::Invalid(format!(
            "the routed experts' slice holds {} entries, {rows} rows route to {top}",
            chosen.len()
        )));
    }
    Ok(Some(RouteLook {
        scores: logits.iter().map(|&z| 1.0 / (1.0 + (-z).exp())).collect(),
        experts: chosen[..top].to_vec(),
    }))
}

/// The position of cache slot `slot` in request `q`'s pages, -1 for -1, `None` off its pages.
pub fn position_of(table: &PageTable, q: usize, slot: i32) -> Option<i32> {
    if slot < 0 {
        return (slot == -1).then_some(-1);
    }
    let (page, place) = (slot as u32 / PAGE_TOKENS, slot as u32 % PAGE_TOKENS);
    let logical = table.pages(q).iter().position(|&p| p == page)?;
    Some((logical as u32 * PAGE_TOKENS + place) as i32)
}

/// The device's choices of one step for the reference to take: each layer's `(layer, front,
/// route)` of `looks` over `rows`, the lists' slots mapped to positions through `table`. A list
/// holding a slot off its request's pages is a fault (its layer left to the reference).
pub fn device_choices<'a>(
    layers: usize,
    looks: impl IntoIterator<Item = (usize, Option<&'a FrontLook>, Option<&'a RouteLook>)>,
    rows: &[Row],
    table: &PageTable,
    step: usize,
) -> (Choices, Vec<String>) {
    let mut chosen = Choices {
        lists: vec![None; layers],
        experts: vec![None; layers],
    };
    let mut faults = Vec::new();
    if rows.is_empty() {
        return (chosen, faults);
    }
    for (l, front, route) in looks {
        if l >= layers {
            continue;
        }
        if let Some(route) = route {
            let k = route.experts.len() / rows.len();
            if k > 0 {
                chosen.experts[l] = Some(
                    route
                        .experts
                        .chunks_exact(k)
                        .map(|e| e.iter().map(|&x| x as usize).collect())
                        .collect(),
                );
            }
        }
        let Some(front) = front else { continue };
        let k = front.lists.len() / rows.len();
        let mut lists = Vec::new();
        for (r, row) in rows.iter().enumerate() {
            let slots = &front.lists[r * k..(r + 1) * k];
            match slots
                .iter()
                .map(|&s| position_of(table, row.request, s))
                .collect::<Option<Vec<i32>>>()
            {
                Some(list) => lists.push(list),
                None => faults.push(format!(
                    "step {step} layer {l} row {r}: the list {slots:?} holds a slot off its \
                     request's pages"
                )),
            }
        }
        if lists.len() == rows.len() {
            chosen.lists[l] = Some(lists);
        }
    }
    (chosen, faults)
}

/// A row's top-k list (positions) or routed experts on one layer that are not the reference's
/// own choice over the reference's own scores (the reference then takes the device's).
#[derive(Clone, Debug, PartialEq)]
pub struct ChoiceFlip {
    pub step: usize,
    pub layer: usize,
    pub row: usize,
    /// "lists positions" or "routes to experts".
    pub what: &'static str,
    /// What the device chose and the reference did not, and the other way round.
    pub device_only: Vec<i32>,
    pub reference_only: Vec<i32>,
    /// The reference's score (biased, for experts) of one it chose over one the device chose
    /// instead, for the pair hardest to explain.
    pub gap: f32,
    /// The device's error on the scores of that pair, summed: a gap at most this is a near-tie
    /// that the measured score error can swap.
    pub error: f32,
}

impl ChoiceFlip {
    /// Whether the measured error of the scores can swap every pair the two lists differ in.
    pub fn explained(&self) -> bool {
        self.gap <= self.error
    }
}

impl std::fmt::Display for ChoiceFlip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {} layer {} row {}: the device {} {:?} where the reference chose {:?} (the \
             reference's scores {:.2e} apart; the device's error on them {:.2e}: {})",
            self.step,
            self.layer,
            self.row,
            self.what,
            self.device_only,
            self.reference_only,
            self.gap,
            self.error,
            if self.explained() {
                "a near-tie"
            } else {
                "NOT explained by the score error"
            }
        )
    }
}

/// Where the device's choice for one row (positions of its top-k list, or experts) parts from the
/// reference's own: what each chose alone, and of the pairs the two swapped the one hardest to
/// explain: the reference's gap between them (`want`, its scores) and the device's error on the
/// two (`got`, the device's scores).
fn list_flip(
    got: &[f32],
    want: &[f32],
    device: &[i32],
    reference: &[i32],
) -> Option<(Vec<i32>, Vec<i32>, f32, f32)> {
    let listed = |l: &[i32]| -> Vec<i32> {
        let mut v: Vec<i32> = l.iter().copied().filter(|&p| p >= 0).collect();
        v.sort_unstable();
        v
    };
    let (d, r) = (listed(device), listed(reference));
    let device_only: Vec<i32> = d.iter().copied().filter(|p| !r.contains(p)).collect();
    let reference_only: Vec<i32> = r.iter().copied().filter(|p| !d.contains(p)).collect();
    if device_only.is_empty() && reference_only.is_empty() {
        return None;
    }
    let score = |s: &[f32], p: i32| s.get(p as usize).copied().unwrap_or(f32::NAN);
    let off = |p: i32| (score(got, p) - score(want, p)).abs();
    // The pair hardest to explain decides: every pair must be one the error can swap.
    let mut worst: Option<(f32, f32)> = None;
    for &q in &reference_only {
        for &p in &device_only {
            let (g, e) = (score(want, q) - score(want, p), off(p) + off(q));
            // A score off the row (NaN) is no near-tie.
            let (g, e) = if g.is_nan() || e.is_nan() {
                (f32::INFINITY, 0.0)
            } else {
                (g, e)
            };
            if worst.is_none_or(|(wg, we)| g - e > wg - we) {
                worst = Some((g, e));
            }
        }
    }
    // One listing more keys than the other is no near-tie.
    let (gap, error) = match worst {
        Some(w) if device_only.len() == reference_only.len() => w,
        _ => (f32::INFINITY, 0.0),
    };
    Some((device_only, reference_only, gap, error))
}

/// One layer's choices of one kind against the reference's own, row by row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChoiceCheck {
    /// Every row whose choice is not the reference's own.
    pub flips: Vec<ChoiceFlip>,
    /// What no near-tie explains: a finite score past a row's position, a list not the select of
    /// the launch's own scores, experts not the rule's choice over the device's own scores.
    pub faults: Vec<String>,
    /// Rows compared.
    pub compared: usize,
    /// Largest error of a device's score (an index score at a position at most the row's).
    pub score_error: f32,
}

/// A full-indexer layer's lists against the reference's selection over its own scores `want`
/// (`[rows][position + 1]`): `lists` are the device's lists as positions (those the reference
/// took), `None` where they were not usable.
pub fn check_front(
    step: usize,
    layer: usize,
    front: &FrontLook,
    lists: Option<&Vec<Vec<i32>>>,
    want: &[Vec<f32>],
    rows: &[Row],
    top: TopK,
) -> ChoiceCheck {
    let mut out = ChoiceCheck::default();
    if let Some(m) = &front.own_select {
        out.faults.push(format!(
            "step {step} layer {layer}: the lists are not the select of the launch's own scores: \
             {m}"
        ));
    }
    if rows.is_empty() {
        return out;
    }
    let stride = front.scores.len() / rows.len();
    for (r, row) in rows.iter().enumerate() {
        out.compared += 1;
        let got = &front.scores[r * stride..(r + 1) * stride];
        if row.position >= stride {
            out.faults.push(format!(
                "step {step} layer {layer} row {r}: {stride} scores a row, the row is at \
                 position {}",
                row.position
            ));
            continue;
        }
        let (mine, past) = got.split_at(row.position + 1);
        if let Some(i) = past.iter().position(|&v| v != f32::NEG_INFINITY) {
            out.faults.push(format!(
                "step {step} layer {layer} row {r}: a finite score at position {}, past the \
                 row's {}",
                row.position + 1 + i,
                row.position
            ));
        }
        let Some(want_r) = want.get(r) else {
            out.faults.push(format!(
                "step {step} layer {layer} row {r}: no reference scores"
            ));
            continue;
        };
        let err = mine
            .iter()
            .zip(want_r)
            .map(|(g, w)| (g - w).abs())
            .fold(0.0f32, f32::max);
        out.score_error = out.score_error.max(err);
        let own = match select_row(want_r, top) {
            Ok(s) => s.list,
            Err(e) => {
                out.faults.push(format!(
                    "step {step} layer {layer} row {r}: the reference select: {e}"
                ));
                continue;
            }
        };
        let device_list = lists.map(|c| c[r].clone()).unwrap_or_default();
        if let Some((device_only, reference_only, gap, error)) =
            list_flip(mine, want_r, &device_list, &own)
        {
            out.flips.push(ChoiceFlip {
                step,
                layer,
                row: r,
                what: "lists positions",
                device_only,
                reference_only,
                gap,
                error,
            });
        }
    }
    out
}

/// An MoE layer's routed experts against the reference's choice over its own router scores
/// `want` (`[rows][experts]`, before the `bias`), and against the rule's choice over the
/// device's own scores (which they must be, up to exact ties).
pub fn check_route(
    step: usize,
    layer: usize,
    route: &RouteLook,
    want: &[Vec<f32>],
    bias: &[f32],
    routing: &Routing,
) -> ChoiceCheck {
    let mut out = ChoiceCheck::default();
    let rows = want.len();
    let experts = want.first().map_or(0, Vec::len);
    if rows == 0 || route.scores.len() != rows * experts {
        out.faults.push(format!(
            "step {step} layer {layer}: {} router scores read, the reference has {rows} rows of \
             {experts}",
            route.scores.len()
        ));
        return out;
    }
    let k = route.experts.len() / rows;
    let biased = |s: &[f32]| -> Vec<f32> { s.iter().zip(bias).map(|(s, b)| s + b).collect() };
    let as_i32 = |v: Vec<usize>| v.into_iter().map(|e| e as i32).collect::<Vec<_>>();
    for (r, want_s) in want.iter().enumerate() {
        out.compared += 1;
        let mine = &route.scores[r * experts..(r + 1) * experts];
        let got = biased(mine);
        let device: Vec<i32> = route.experts[r * k..(r + 1) * k]
            .iter()
            .map(|&e| e as i32)
            .collect();
        match choose(mine, bias, routing) {
            Ok(own) => {
                let own = as_i32(own);
                if let Some((d_only, o_only, gap, _)) = list_flip(&got, &got, &device, &own) {
                    if gap > 1e-5 {
                        out.faults.push(format!(
                            "step {step} layer {layer} row {r}: the device routes to {d_only:?} \
                             where its own scores choose {o_only:?} ({gap:.2e} apart)"
                        ));
                    }
                }
            }
            Err(e) => out.faults.push(format!(
                "step {step} layer {layer} row {r}: the routing rule over the device's scores: {e}"
            )),
        }
        let reference = match choose(want_s, bias, routing) {
            Ok(c) => as_i32(c),
            Err(e) => {
                out.faults.push(format!(
                    "step {step} layer {layer} row {r}: the routing rule over the reference's \
                     scores: {e}"
                ));
                continue;
            }
        };
        if let Some((device_only, reference_only, gap, error)) =
            list_flip(&got, &biased(want_s), &device, &reference)
        {
            out.flips.push(ChoiceFlip {
                step,
                layer,
                row: r,
                what: "routes to experts",
                device_only,
                reference_only,
                gap,
                error,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_swap_is_a_near_tie_only_within_the_measured_error() {
        // The reference lists 0 and 1 (scores 3.0 and 2.0); the device lists 0 and 2, whose
        // reference score 1.95 is 0.05 below 1's.
        let want = [3.0f32, 2.0, 1.95, 0.0];
        let near = [3.0f32, 1.97, 1.98, 0.0];
        let (d, r, gap, error) = list_flip(&near, &want, &[0, 2], &[1, 0]).unwrap();
        assert_eq!((d, r), (vec![2], vec![1]));
        assert!((gap - 0.05).abs() < 1e-6 && (error - 0.06).abs() < 1e-6);
        let far = [3.0f32, 1.999, 1.951, 0.0];
        let (_, _, gap, error) = list_flip(&far, &want, &[0, 2], &[0, 1]).unwrap();
        assert!(gap > error, "{gap} {error}");
        assert!(list_flip(&near, &want, &[1, 0], &[0, 1]).is_none());
        // A list of more keys than the other's is never a near-tie.
        let (_, _, gap, _) = list_flip(&near, &want, &[0, 1, 2], &[0, 1]).unwrap();
        assert_eq!(gap, f32::INFINITY);
    }
}
