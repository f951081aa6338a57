//! The contract a device MoE launch is held to, against `crate::reference`:
//! - the choice: each row's experts are the reference's, except where the device took an expert
//!   whose reference biased score is within [`TIE_MARGIN`] of the last one the reference took
//!   (the fp32 logits are summed in another order), and exactly the lowest top_k when every
//!   expert ties (`Pattern::AllEqual`: equal router rows give equal logits); the weights,
//!   s / (Σ s + 1e-20) · scaling without the bias, within [`WEIGHT_TOLERANCE`] (relative) of the
//!   reference's for that choice;
//! - the combine, exactly: out = bf16(residual + bf16(bf16(Σ weighted outputs, ascending expert,
//!   a bf16 running sum) + shared)) from the device's own expert outputs;
//! - the output against the reference layer (transformers' bf16 order, f64 sums):
//!   |out - ref| <= [`OUTPUT_TOLERANCE`] · (rms of the row's MoE output + |residual|), since every
//!   bf16 rounding on the way (gate, up, silu, product, down, weight, running sum) may land one
//!   step apart when the device's fp32 sums differ from the reference's in the last bits.

use crate::layout::MoeShape;
use crate::layout::Route;
use crate::problem::{bf16_value, MoeProblem, Pattern};
use crate::reference::{choose, moe_with_routes, scores, weigh, MlpWeights};
use crate::Result;
use model::numerics::{bf16_round, sigmoid};
use std::collections::BTreeMap;

/// Biased scores closer than this to the reference's last chosen one may be chosen either way.
pub const TIE_MARGIN: f32 = 1e-5;
/// Relative error allowed in a routed weight (2^-14).
pub const WEIGHT_TOLERANCE: f32 = 1.0 / 16384.0;
/// Output error allowed, in units of the row's MoE output rms + |residual| (2^-5).
pub const OUTPUT_TOLERANCE: f32 = 1.0 / 32.0;

/// What a launch left in memory, decoded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceResult {
    /// `[router_splits, rows, experts]`: the router's partial logits, the route task's input.
    pub logits: Vec<f32>,
    /// `[slots, rows]`: each slot's weight in each row (0 where the row did not choose it).
    pub slot_scale: Vec<f32>,
    /// `[rows, top_k]`, ascending expert within a row.
    pub row_experts: Vec<u32>,
    pub row_weights: Vec<f32>,
    pub row_slots: Vec<u32>,
    /// `[rows, slots, hidden]` bf16 bits.
    pub routed: Vec<u16>,
    /// `[rows, hidden]` bf16 bits.
    pub shared: Vec<u16>,
    pub out: Vec<u16>,
}

impl DeviceResult {
    /// Row r's routes as the device took them.
    pub fn routes(&self, k: usize) -> Vec<Vec<Route>> {
        self.row_experts
            .chunks(k)
            .zip(self.row_weights.chunks(k))
            .map(|(e, w)| {
                e.iter()
                    .zip(w)
                    .map(|(&expert, &weight)| Route {
                        expert: expert as usize,
                        weight,
                    })
                    .collect()
            })
            .collect()
    }
}

/// What a passing launch measured.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Measured {
    pub outputs: usize,
    /// Rows whose choice differed from the reference's within the tie margin.
    pub tied_rows: usize,
    /// The largest relative weight error.
    pub max_weight_error: f32,
    /// The largest output error in units of (row rms + |residual|).
    pub max_output_error: f32,
    /// Outputs bit-equal to the reference's.
    pub exact: usize,
    /// Distinct experts the step chose.
    pub distinct: usize,
}

/// The reference's side of a problem: its scores and routes, and the experts' weights it has
/// loaded (on demand: a GLM-5.2 rank has 256).
pub struct Oracle {
    pub xs: Vec<Vec<f32>>,
    pub scores: Vec<Vec<f32>>,
    pub routes: Vec<Vec<Route>>,
    shared: MlpWeights,
    experts: BTreeMap<usize, MlpWeights>,
}

impl Oracle {
    pub fn new(p: &MoeProblem) -> Result<Self> {
        let router = p.router_weights()?;
        let xs = p.x_rows();
        let scores = xs
            .iter()
            .map(|x| scores(&router, x))
            .collect::<Result<Vec<_>>>()?;
        let routes = scores
            .iter()
            .map(|s| Ok(weigh(s, &choose(s, &p.bias, &p.routing)?, &p.routing)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Oracle {
            xs,
            scores,
            routes,
            shared: p.expert(None)?.weights()?,
            experts: BTreeMap::new(),
        })
    }

    /// The layer's output rows, bf16(residual + moe), for `routes`.
    pub fn output(&mut self, p: &MoeProblem, routes: &[Vec<Route>]) -> Result<Vec<Vec<f32>>> {
        for r in routes.iter().flatten() {
            if let std::collections::btree_map::Entry::Vacant(slot) = self.experts.entry(r.expert) {
                slot.insert(p.expert(Some(r.expert))?.weights()?);
            }
        }
        let experts = &self.experts;
        moe_with_routes(
            &self.shared,
            &|e| experts.get(&e),
            p.shape.experts,
            routes,
            &self.xs,
            true,
        )
    }
}

fn row_rms(v: &[f32]) -> f32 {
    (v.iter().map(|x| x * x).sum::<f32>() / v.len().max(1) as f32).sqrt()
}

/// Checks the device's choice for every row; returns the routes the output is held to and the
/// measures so far.
pub fn check_routes(
    p: &MoeProblem,
    oracle: &Oracle,
    dev: &DeviceResult,
) -> std::result::Result<(Vec<Vec<Route>>, Measured), String> {
    let k = p.shape.top_k;
    let mut m = Measured::default();
    let mut used = Vec::new();
    let got = dev.routes(k);
    if got.len() != p.shape.rows {
        return Err(format!("{} rows of routes for {}", got.len(), p.shape.rows));
    }
    for (r, (row, want)) in got.iter().zip(&oracle.routes).enumerate() {
        let s = &oracle.scores[r];
        let biased = |e: usize| s[e] + p.bias[e];
        let mut mine: Vec<usize> = row.iter().map(|x| x.expert).collect();
        if mine.iter().any(|&e| e >= p.shape.experts) || mine.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!(
                "{}: row {r} chose {mine:?}: not {k} distinct experts ascending",
                p.name
            ));
        }
        if p.pattern == Pattern::AllEqual && mine.iter().copied().ne(0..k) {
            return Err(format!(
                "{}: row {r} chose {mine:?}; every expert ties, so the lowest {k} win",
                p.name
            ));
        }
        let mut theirs: Vec<usize> = want.iter().map(|x| x.expert).collect();
        theirs.sort_unstable();
        let chosen = if mine == theirs {
            want.clone()
        } else {
            let last = biased(want[k - 1].expert);
            if let Some(&e) = mine.iter().chain(&theirs).find(|&&e| {
                mine.contains(&e) != theirs.contains(&e) && (biased(e) - last).abs() > TIE_MARGIN
            }) {
                return Err(format!(
                    "{}: row {r} chose {mine:?}, the reference {theirs:?}; expert {e}'s biased score {} is {} from the last chosen one's",
                    p.name,
                    biased(e),
                    biased(e) - last
                ));
            }
            m.tied_rows += 1;
            mine.sort_by(|&a, &b| biased(b).total_cmp(&biased(a)));
            weigh(s, &mine, &p.routing)
        };
        for x in row {
            let w = chosen
                .iter()
                .find(|c| c.expert == x.expert)
                .map_or(f32::NAN, |c| c.weight);
            let err = (x.weight - w).abs() / w.abs().max(f32::MIN_POSITIVE);
            if err.is_nan() || err > WEIGHT_TOLERANCE {
                return Err(format!(
                    "{}: row {r} expert {}: weight {}, reference {w} (relative error {err:e})",
                    p.name, x.expert, x.weight
                ));
            }
            m.max_weight_error = m.max_weight_error.max(err);
        }
        used.push(chosen);
    }
    let mut distinct: Vec<u32> = dev.row_experts.clone();
    distinct.sort_unstable();
    distinct.dedup();
    m.distinct = distinct.len();
    Ok((used, m))
}

/// The route task's outputs from its own input, bit for bit: a row's scores are the sigmoid of
/// the device's partial logits summed in split order, its choice and weights are `choose` and
/// `weigh` of them (the device's order of every fp32 operation), the slots are the chosen experts
/// ascending in the step's union, and each slot's per-row weight is 0 for rows that did not choose
/// it. Holds where the device's exp is the host's (the host emulation).
pub fn check_route_exact(p: &MoeProblem, dev: &DeviceResult) -> std::result::Result<(), String> {
    let s: MoeShape = p.shape;
    let (rows, e, k, splits) = (s.rows, s.experts, s.top_k, s.router_splits());
    if dev.logits.len() != splits * rows * e || dev.slot_scale.len() != s.slots() * rows {
        return Err(format!(
            "{}: {} logits and {} slot scales for {splits} splits of {rows} x {e} and {} slots",
            p.name,
            dev.logits.len(),
            dev.slot_scale.len(),
            s.slots()
        ));
    }
    let mut experts = Vec::with_capacity(rows * k);
    let mut weights = Vec::with_capacity(rows * k);
    for r in 0..rows {
        let scores: Vec<f32> = (0..e)
            .map(|x| {
                let mut logit = dev.logits[r * e + x];
                for q in 1..splits {
                    logit += dev.logits[(q * rows + r) * e + x];
                }
                sigmoid(logit)
            })
            .collect();
        let chosen = choose(&scores, &p.bias, &p.routing).map_err(|e| e.to_string())?;
        let mut routes = weigh(&scores, &chosen, &p.routing);
        routes.sort_by_key(|x| x.expert);
        experts.extend(routes.iter().map(|x| x.expert as u32));
        weights.extend(routes.iter().map(|x| x.weight));
    }
    let mut used = experts.clone();
    used.sort_unstable();
    used.dedup();
    let slot_of = |x: &u32| used.binary_search(x).unwrap_or(usize::MAX) as u32;
    let slots: Vec<u32> = experts.iter().map(slot_of).collect();
    let mut scale = vec![0f32; s.slots() * rows];
    for (i, (&slot, &w)) in slots.iter().zip(&weights).enumerate() {
        scale[slot as usize * rows + i / k] = w;
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for (what, got, want) in [
        ("experts", dev.row_experts.clone(), experts),
        ("weights", bits(&dev.row_weights), bits(&weights)),
        ("slots", dev.row_slots.clone(), slots),
        ("slot scales", bits(&dev.slot_scale), bits(&scale)),
    ] {
        if let Some(i) = (0..want.len().max(got.len())).find(|&i| got.get(i) != want.get(i)) {
            return Err(format!(
                "{}: route {what} [{i}] = {:?} (bits), its logits give {:?}",
                p.name,
                got.get(i),
                want.get(i)
            ));
        }
    }
    Ok(())
}

/// The combine from the device's own expert outputs, bit for bit.
pub fn check_combine(p: &MoeProblem, dev: &DeviceResult) -> std::result::Result<(), String> {
    let s: MoeShape = p.shape;
    let (k, h, slots) = (s.top_k, s.hidden, s.slots());
    for r in 0..s.rows {
        for c in 0..h {
            let mut y = 0f32;
            for q in 0..k {
                let slot = dev.row_slots[r * k + q] as usize;
                if slot >= slots {
                    return Err(format!("{}: row {r} names slot {slot} of {slots}", p.name));
                }
                y = bf16_round(y + bf16_value(dev.routed[(r * slots + slot) * h + c]));
            }
            y = bf16_round(y + bf16_value(dev.shared[r * h + c]));
            let want = bf16_round(bf16_value(p.residual[r * h + c]) + y);
            let got = bf16_value(dev.out[r * h + c]);
            if got.to_bits() != want.to_bits() {
                return Err(format!(
                    "{}: combine [{r}, {c}] = {got}, its inputs give {want}",
                    p.name
                ));
            }
        }
    }
    Ok(())
}

/// `out` (`[rows, hidden]` values) against the reference layer for `routes`.
pub fn check_output(
    p: &MoeProblem,
    oracle: &mut Oracle,
    routes: &[Vec<Route>],
    out: &[f32],
    m: &mut Measured,
) -> std::result::Result<(), String> {
    let h = p.shape.hidden;
    let moe = oracle.output(p, routes).map_err(|e| e.to_string())?;
    for (r, y) in moe.iter().enumerate() {
        let rms = row_rms(y);
        for (c, &v) in y.iter().enumerate() {
            let residual = bf16_value(p.residual[r * h + c]);
            let want = bf16_round(residual + v);
            let got = out[r * h + c];
            let err = (got - want).abs() / (rms + residual.abs());
            if err.is_nan() || err > OUTPUT_TOLERANCE {
                return Err(format!(
                    "{}: output [{r}, {c}] = {got}, reference {want} (error {err:.3e} x (rms {rms:.3e} + |residual|))",
                    p.name
                ));
            }
            m.max_output_error = m.max_output_error.max(err);
            m.exact += usize::from(got.to_bits() == want.to_bits());
            m.outputs += 1;
        }
    }
    Ok(())
}

/// Every part of the contract.
pub fn check(
    p: &MoeProblem,
    oracle: &mut Oracle,
    dev: &DeviceResult,
) -> std::result::Result<Measured, String> {
    let (routes, mut m) = check_routes(p, oracle, dev)?;
    check_combine(p, dev)?;
    let out: Vec<f32> = dev.out.iter().map(|&b| bf16_value(b)).collect();
    check_output(p, oracle, &routes, &out, &mut m)?;
    Ok(m)
}

/// The scale block whose value is furthest (by ratio) from block 0's, for the swapped-scales
/// control; `None` when all are equal.
pub fn most_different_scale(scales: &[f32]) -> Option<usize> {
    let ratio = |i: usize| (scales[i] / scales[0]).ln().abs();
    (1..scales.len())
        .filter(|&i| scales[i] != scales[0] && ratio(i).is_finite())
        .max_by(|&a, &b| ratio(a).total_cmp(&ratio(b)))
}
