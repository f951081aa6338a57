//! The MoE half's arguments in a layer launch: its entries of the launch's matrix list (the
//! shared expert, the router's k-splits), the two expert banks and `moe_args`, from the part's
//! plan and arena slices (`fused::moe::MoePart`) and the bound weights, as `moe::memory` lays out
//! the same for a launch of its own.

use linear::gpu::{LinExpert, LinMatrix, FLAG_FP8, FLAG_OUT_F32, FLAG_ROW_SCALE, FLAG_SWIGLU};
use model::weights::packed::TILE_ROWS;
use moe::layout::{FLAG_NORM_TOPK, MAT_ROUTER, MAT_SHARED_DOWN, MAT_SHARED_GATE_UP};
use moe::memory::MoeArgs;
use moe::reference::Routing;

use super::weights::MoeWeights;
use crate::fused::attention::PackedAt;
use crate::fused::graph::ArenaSlice;
use crate::fused::moe::MoePart;
use crate::step::{Result, StepError};

/// The MoE half's share of a launch's arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeBinding {
    /// (index in the launch's matrix list, descriptor).
    pub mats: Vec<(u32, LinMatrix)>,
    /// `lin_args.experts`: `moe::layout::BANK_GATE_UP`, then `BANK_DOWN`.
    pub banks: [LinExpert; 2],
    pub args: MoeArgs,
}

/// Where the part's input and output sit: `h` the attention's output rows (arena offsets), the
/// MoE's residual and, normed by the post-attention norm (bf16 weight at device address `norm`,
/// `eps`) as the matrices that read it stage it, its input; `out` the layer's output rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeRows {
    pub h: ArenaSlice,
    pub norm: u64,
    pub eps: f32,
    pub out: ArenaSlice,
}

/// `part`'s arguments with the arena at `arena`.
pub fn bind_moe(
    part: &MoePart,
    arena: u64,
    rows_at: MoeRows,
    w: &MoeWeights,
    routing: &Routing,
) -> Result<MoeBinding> {
    let s = part.shape;
    let sl = part.slices;
    let at = |slice: ArenaSlice| arena + slice.offset;
    let (rows, slots) = (s.rows as u32, s.slots() as u32);
    let splits = s.router_splits();
    if w.router.len() != splits {
        return Err(StepError::Invalid(format!(
            "the router is bound in {} k-splits; the MoE part reads {splits}",
            w.router.len()
        )));
    }
    let matrix = |p: &PackedAt, x: u64, y: u64, k: usize, n: usize, flags: u32| {
        let swiglu = flags & FLAG_SWIGLU != 0;
        let tiles = n.div_ceil(if swiglu { TILE_ROWS / 2 } else { TILE_ROWS });
        LinMatrix {
            w: p.w,
            scales: p.scales,
            x,
            y,
            residual: 0,
            row_scale: 0,
            k: k as u32,
            n: n as u32,
            tiles: tiles as u32,
            rows,
            x_stride: k as u32,
            y_stride: n as u32,
            flags: flags | if p.fp8 { FLAG_FP8 } else { 0 },
            ..LinMatrix::default()
        }
    };
    let first = part.first_matrix;
    let x = at(rows_at.h);
    // The input's readers norm h as they stage it: their k-range's element k0 of a row of hidden.
    let normed = |m: LinMatrix, k0: usize| {
        m.with_rmsnorm(rows_at.norm, s.hidden as u32, k0 as u32, rows_at.eps)
            .map_err(|e| StepError::Invalid(format!("the MoE's input norm: {e}")))
    };
    let mut mats = vec![
        (
            first + MAT_SHARED_GATE_UP,
            normed(
                matrix(
                    &w.shared_gate_up,
                    x,
                    at(sl.shared_act),
                    s.hidden,
                    s.inter,
                    FLAG_SWIGLU,
                ),
                0,
            )?,
        ),
        (
            first + MAT_SHARED_DOWN,
            matrix(
                &w.shared_down,
                at(sl.shared_act),
                at(sl.shared_out),
                s.inter,
                s.hidden,
                0,
            ),
        ),
    ];
    // Split i of the router: columns i k .. (i + 1) k of x, partial logits block i.
    let k = s.hidden / splits;
    for (i, p) in w.router.iter().enumerate() {
        let mut m = matrix(p, x, at(sl.logits), k, s.experts, FLAG_OUT_F32);
        m.x += (2 * i * k) as u64;
        m.x_stride = s.hidden as u32;
        m.y += (4 * i * s.rows * s.experts) as u64;
        mats.push((first + MAT_ROUTER + i as u32, normed(m, i * k)?));
    }
    let gate_up = LinExpert {
        m: normed(
            matrix(
                &w.gate_up.first,
                x,
                at(sl.act),
                s.hidden,
                s.inter,
                FLAG_SWIGLU,
            ),
            0,
        )?,
        w_stride: w.gate_up.w_stride,
        scales_stride: w.gate_up.scales_stride,
        x_slot: 0,
        y_slot: u64::from(rows) * s.inter as u64,
        row_scale_slot: 0,
        n_experts: w.gate_up.experts,
        pad: 0,
    };
    let mut down_m = matrix(
        &w.down.first,
        at(sl.act),
        at(sl.routed),
        s.inter,
        s.hidden,
        FLAG_ROW_SCALE,
    );
    down_m.row_scale = at(sl.slot_scale);
    down_m.y_stride = slots * s.hidden as u32;
    let down = LinExpert {
        m: down_m,
        w_stride: w.down.w_stride,
        scales_stride: w.down.scales_stride,
        x_slot: u64::from(rows) * s.inter as u64,
        y_slot: s.hidden as u64,
        row_scale_slot: u64::from(rows),
        n_experts: w.down.experts,
        pad: 0,
    };
    let args = MoeArgs {
        logits: at(sl.logits),
        bias: w.bias,
        row_slots: at(sl.row_slots),
        row_experts: at(sl.row_experts),
        row_weights: at(sl.row_weights),
        slot_scale: at(sl.slot_scale),
        residual: x,
        shared: at(sl.shared_out),
        routed: at(sl.routed),
        out: at(rows_at.out),
        rows,
        experts: s.experts as u32,
        top_k: s.top_k as u32,
        slots,
        hidden: s.hidden as u32,
        n_group: s.n_group as u32,
        topk_group: s.topk_group as u32,
        flags: if routing.norm_topk_prob {
            FLAG_NORM_TOPK
        } else {
            0
        },
        scaling: routing.scaling,
        router_splits: splits as u32,
        pad: [0; 2],
    };
    Ok(MoeBinding {
        mats,
        banks: [gate_up, down],
        args,
    })
}
