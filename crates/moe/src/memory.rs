//! One MoE launch's memory as one byte arena (weights, inputs, intermediates, outputs) and the
//! kernel arguments that point into it from a base address: the GPU uploads the arena as one
//! buffer, the host emulation hands the driver offsets from 0. The argument structs are the twins
//! of `lin_matrix` / `lin_expert` (linear) and `moe_args` (`kernels/moe_task.h`).

use crate::layout::{MoeShape, FLAG_NORM_TOPK};
use crate::problem::MoeProblem;
use crate::Result;
use linear::gpu::{LinExpert, LinMatrix, FLAG_FP8, FLAG_OUT_F32, FLAG_ROW_SCALE, FLAG_SWIGLU};
use model::weights::packed::PackedWeight;
use model::WeightFormat;

/// `struct moe_args`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MoeArgs {
    pub logits: u64,
    pub bias: u64,
    pub row_slots: u64,
    pub row_experts: u64,
    pub row_weights: u64,
    pub slot_scale: u64,
    pub residual: u64,
    pub shared: u64,
    pub routed: u64,
    pub out: u64,
    pub rows: u32,
    pub experts: u32,
    pub top_k: u32,
    pub slots: u32,
    pub hidden: u32,
    pub n_group: u32,
    pub topk_group: u32,
    pub flags: u32,
    pub scaling: f32,
    pub router_splits: u32,
    pub pad: [u32; 2],
}

const _: () = assert!(std::mem::size_of::<MoeArgs>() == 128);

/// A byte range of the arena.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    pub offset: u64,
    pub bytes: u64,
}

/// Where everything lies in the arena.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spans {
    /// The router's k-splits.
    pub router: Vec<Span>,
    pub bias: Span,
    pub shared_gate_up: (Span, Span),
    pub shared_down: (Span, Span),
    /// Every expert's packed gate/up back to back (weights, then scales), then the downs.
    pub gate_up: (Span, Span),
    pub down: (Span, Span),
    pub x: Span,
    pub residual: Span,
    pub logits: Span,
    pub shared_act: Span,
    pub shared_out: Span,
    pub act: Span,
    pub routed: Span,
    pub slot_scale: Span,
    pub row_slots: Span,
    pub row_experts: Span,
    pub row_weights: Span,
    pub out: Span,
    /// One expert's packed gate/up and down, weights and scales (the banks' strides).
    pub expert_bytes: [(u64, u64); 2],
}

/// The arena's bytes and their spans.
pub struct MoeMemory {
    pub shape: MoeShape,
    pub bytes: Vec<u8>,
    pub spans: Spans,
    /// The weight bytes one step reads at least besides the experts' (router, shared expert).
    pub fixed_weight_bytes: u64,
}

fn align(n: usize) -> usize {
    n.next_multiple_of(256)
}

struct Builder {
    bytes: Vec<u8>,
}

impl Builder {
    fn reserve(&mut self, bytes: usize) -> Span {
        let offset = align(self.bytes.len());
        self.bytes.resize(offset + bytes, 0);
        Span {
            offset: offset as u64,
            bytes: bytes as u64,
        }
    }

    fn put(&mut self, data: &[u8]) -> Span {
        let s = self.reserve(data.len());
        self.bytes[s.offset as usize..].copy_from_slice(data);
        s
    }

    fn put_packed(&mut self, w: &PackedWeight) -> (Span, Span) {
        (
            self.put(&w.bytes),
            self.put(bytemuck::cast_slice(&w.scales)),
        )
    }
}

/// What a test may change in the weights before they are laid out (a negative control).
pub type Alter<'a> = &'a (dyn Fn(usize, &mut PackedWeight, &mut PackedWeight) + Sync);

impl MoeMemory {
    /// Lays out `p` with every routed expert packed (in parallel over the host's cores); `alter`
    /// may change expert e's packed gate/up and down first. Intermediates and outputs are filled
    /// with all-ones bits, so that what the launch does not write fails a check.
    pub fn new(p: &MoeProblem, alter: Option<Alter>) -> Result<Self> {
        let s = p.shape;
        let mut b = Builder { bytes: Vec::new() };
        let router: Vec<Span> = p.packed_router()?.iter().map(|w| b.put(&w.bytes)).collect();
        let bias = b.put(bytemuck::cast_slice(&p.bias));
        let (shared_gu, shared_dn) = p.expert(None)?.packed()?;
        let shared_gate_up = b.put_packed(&shared_gu);
        let shared_down = b.put_packed(&shared_dn);
        let fixed_weight_bytes = router.iter().map(|s| s.bytes).sum::<u64>()
            + shared_gate_up.0.bytes
            + shared_gate_up.1.bytes
            + shared_down.0.bytes
            + shared_down.1.bytes;
        let sizes = |w: &PackedWeight| (align(w.bytes.len()), align(4 * w.scales.len()));
        let ((gw, gs), (dw, ds)) = (sizes(&shared_gu), sizes(&shared_dn));
        let e = s.experts;
        let gate_up = (b.reserve(gw * e), b.reserve(gs * e));
        let down = (b.reserve(dw * e), b.reserve(ds * e));
        b.fill_experts(p, alter, [gate_up, down], [(gw, gs), (dw, ds)])?;
        let x = b.put(bytemuck::cast_slice(&p.x));
        let residual = b.put(bytemuck::cast_slice(&p.residual));
        let (rows, slots) = (s.rows, s.slots());
        let poisoned = |b: &mut Builder, bytes: usize| {
            let span = b.reserve(bytes);
            b.bytes[span.offset as usize..].fill(0xff);
            span
        };
        let logits = poisoned(&mut b, 4 * s.router_splits() * rows * e);
        let shared_act = poisoned(&mut b, 2 * rows * s.inter);
        let shared_out = poisoned(&mut b, 2 * rows * s.hidden);
        let act = poisoned(&mut b, 2 * slots * rows * s.inter);
        let routed = poisoned(&mut b, 2 * rows * slots * s.hidden);
        let slot_scale = poisoned(&mut b, 4 * slots * rows);
        let row_slots = poisoned(&mut b, 4 * rows * s.top_k);
        let row_experts = poisoned(&mut b, 4 * rows * s.top_k);
        let row_weights = poisoned(&mut b, 4 * rows * s.top_k);
        let out = poisoned(&mut b, 2 * rows * s.hidden);
        let bytes_len = align(b.bytes.len());
        b.bytes.resize(bytes_len, 0);
        let spans = Spans {
            router,
            bias,
            shared_gate_up,
            shared_down,
            gate_up,
            down,
            x,
            residual,
            logits,
            shared_act,
            shared_out,
            act,
            routed,
            slot_scale,
            row_slots,
            row_experts,
            row_weights,
            out,
            expert_bytes: [(gw as u64, gs as u64), (dw as u64, ds as u64)],
        };
        Ok(MoeMemory {
            shape: s,
            bytes: b.bytes,
            spans,
            fixed_weight_bytes,
        })
    }

    /// The launch's matrices, expert banks and MoE arguments with the arena at `base`.
    pub fn args(&self, base: u64, p: &MoeProblem) -> (Vec<LinMatrix>, Vec<LinExpert>, MoeArgs) {
        let (s, sp) = (self.shape, &self.spans);
        let at = |span: Span| base + span.offset;
        let fp8 = if s.format == WeightFormat::Fp8 {
            FLAG_FP8
        } else {
            0
        };
        let (rows, slots) = (s.rows as u32, s.slots() as u32);
        let matrix = |w: (Span, Span), x: Span, y: Span, k: usize, n: usize, flags: u32| {
            let tiles = if flags & FLAG_SWIGLU != 0 {
                n.div_ceil(8)
            } else {
                n.div_ceil(16)
            };
            LinMatrix {
                w: at(w.0),
                scales: at(w.1),
                x: at(x),
                y: at(y),
                residual: 0,
                row_scale: 0,
                k: k as u32,
                n: n as u32,
                tiles: tiles as u32,
                rows,
                x_stride: k as u32,
                y_stride: n as u32,
                flags,
                ..LinMatrix::default()
            }
        };
        let none = Span::default();
        let mut mats = vec![
            matrix(
                sp.shared_gate_up,
                sp.x,
                sp.shared_act,
                s.hidden,
                s.inter,
                fp8 | FLAG_SWIGLU,
            ),
            matrix(
                sp.shared_down,
                sp.shared_act,
                sp.shared_out,
                s.inter,
                s.hidden,
                fp8,
            ),
        ];
        // Split s of the router: columns s k .. (s + 1) k of x, partial logits block s.
        let k = s.hidden / s.router_splits();
        for (i, &w) in sp.router.iter().enumerate() {
            let mut m = matrix((w, none), sp.x, sp.logits, k, s.experts, FLAG_OUT_F32);
            m.x += (2 * i * k) as u64;
            m.x_stride = s.hidden as u32;
            m.y += (4 * i * s.rows * s.experts) as u64;
            mats.push(m);
        }
        let gate_up = LinExpert {
            m: matrix(
                sp.gate_up,
                sp.x,
                sp.act,
                s.hidden,
                s.inter,
                fp8 | FLAG_SWIGLU,
            ),
            w_stride: sp.expert_bytes[0].0,
            scales_stride: sp.expert_bytes[0].1 / 4,
            x_slot: 0,
            y_slot: u64::from(rows) * s.inter as u64,
            row_scale_slot: 0,
            n_experts: s.experts as u32,
            pad: 0,
        };
        let mut down_m = matrix(
            sp.down,
            sp.act,
            sp.routed,
            s.inter,
            s.hidden,
            fp8 | FLAG_ROW_SCALE,
        );
        down_m.row_scale = at(sp.slot_scale);
        down_m.y_stride = slots * s.hidden as u32;
        let down = LinExpert {
            m: down_m,
            w_stride: sp.expert_bytes[1].0,
            scales_stride: sp.expert_bytes[1].1 / 4,
            x_slot: u64::from(rows) * s.inter as u64,
            y_slot: s.hidden as u64,
            row_scale_slot: u64::from(rows),
            n_experts: s.experts as u32,
            pad: 0,
        };
        let args = MoeArgs {
            logits: at(sp.logits),
            bias: at(sp.bias),
            row_slots: at(sp.row_slots),
            row_experts: at(sp.row_experts),
            row_weights: at(sp.row_weights),
            slot_scale: at(sp.slot_scale),
            residual: at(sp.residual),
            shared: at(sp.shared_out),
            routed: at(sp.routed),
            out: at(sp.out),
            rows,
            experts: s.experts as u32,
            top_k: s.top_k as u32,
            slots,
            hidden: s.hidden as u32,
            n_group: s.n_group as u32,
            topk_group: s.topk_group as u32,
            flags: if p.routing.norm_topk_prob {
                FLAG_NORM_TOPK
            } else {
                0
            },
            scaling: p.routing.scaling,
            router_splits: s.router_splits() as u32,
            pad: [0; 2],
        };
        (mats, vec![gate_up, down], args)
    }
}

impl Builder {
    /// Packs every expert into its place in the banks, experts split over the host's threads.
    fn fill_experts(
        &mut self,
        p: &MoeProblem,
        alter: Option<Alter>,
        banks: [(Span, Span); 2],
        strides: [(usize, usize); 2],
    ) -> Result<()> {
        let e = p.shape.experts;
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(e);
        let per = e.div_ceil(threads);
        let results: Vec<Result<Vec<(usize, PackedWeight, PackedWeight)>>> =
            std::thread::scope(|scope| {
                let handles: Vec<_> = (0..threads)
                    .map(|t| {
                        scope.spawn(move || {
                            (t * per..((t + 1) * per).min(e))
                                .map(|ex| {
                                    let (mut gu, mut dn) = p.expert(Some(ex))?.packed()?;
                                    if let Some(f) = alter {
                                        f(ex, &mut gu, &mut dn);
                                    }
                                    Ok((ex, gu, dn))
                                })
                                .collect()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a packing thread panicked"))
                    .collect()
            });
        for chunk in results {
            for (ex, gu, dn) in chunk? {
                for ((w, s), (sw, ss), packed) in
                    [(banks[0], strides[0], &gu), (banks[1], strides[1], &dn)]
                {
                    let at = w.offset as usize + ex * sw;
                    self.bytes[at..at + packed.bytes.len()].copy_from_slice(&packed.bytes);
                    let at = s.offset as usize + ex * ss;
                    let scales: &[u8] = bytemuck::cast_slice(&packed.scales);
                    self.bytes[at..at + scales.len()].copy_from_slice(scales);
                }
            }
        }
        Ok(())
    }
}

impl MoeMemory {
    /// The launch's results from a copy of the arena after it ran.
    pub fn read(&self, arena: &[u8]) -> crate::check::DeviceResult {
        let sp = &self.spans;
        let bytes = |s: Span| &arena[s.offset as usize..(s.offset + s.bytes) as usize];
        let u16s = |s: Span| -> Vec<u16> {
            bytes(s)
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect()
        };
        let u32s = |s: Span| -> Vec<u32> {
            bytes(s)
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let f32s = |s: Span| -> Vec<f32> { u32s(s).into_iter().map(f32::from_bits).collect() };
        crate::check::DeviceResult {
            logits: f32s(sp.logits),
            slot_scale: f32s(sp.slot_scale),
            row_experts: u32s(sp.row_experts),
            row_weights: f32s(sp.row_weights),
            row_slots: u32s(sp.row_slots),
            routed: u16s(sp.routed),
            shared: u16s(sp.shared_out),
            out: u16s(sp.out),
        }
    }

    /// The spans a launch writes (what the host reads back after it).
    pub fn written(&self) -> Span {
        let sp = &self.spans;
        let first = sp.logits.offset;
        Span {
            offset: first,
            bytes: sp.out.offset + sp.out.bytes - first,
        }
    }
}
