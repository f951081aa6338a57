//! The device addresses each part of a layer launch reads its weights from, bound from one rank's
//! [`DeviceWeights`] by the published tensor names: the attention half's matrices and norms
//! ([`HalfWeights`]), the indexer's projections and key norm, the post-attention norm, the dense
//! MLP's or the MoE half's matrices (the routed experts as two banks of a fixed stride), and the
//! embedding and the tail.
//!
//! Three forms a launch reads are not tensors of the checkpoint, so they are made here once, on
//! the host, from the values the rank's tensors hold, and uploaded beside the weights
//! ([`LaunchForms`]): W_UK\[h\]ᵀ padded to whole 128-column blocks and W_UV\[h\] of every head
//! (bf16, from `kv_b_proj`), the router's k-splits (bf16, from `mlp.gate.weight`), and the index
//! key norm's weight and bias in fp32. The values are those the rank's tensors hold
//! ([`DeviceWeights::stored_values`]: made again by the synthetic rule, or kept from the
//! checkpoint when loaded; FP8 tensors dequantised, so the bf16 forms round what the FP8 codes
//! hold).

use device::{Buffer, Device};
use mla::HeadLayout;
use model::numerics::bf16_round;
use model::weights::packed::{pack, PackedWeight, Pairing, SourceWeight};
use model::{IndexerKind, LayerPlan, MlpKind, ModelConfig, RankShapes};

use crate::fused::attention::{HalfDims, HalfMatrix, HalfWeights, PackedAt};
use crate::fused::head::{DenseWeights, TailWeights};
use crate::step::weights::{DeviceTensor, DeviceWeights, Element, Form};
use crate::step::{Result, StepError};

/// The indexer's weights on a full-indexer layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexerWeights {
    /// `[heads * head_dim, q_lora]`: the index queries from the q latent.
    pub wq_b: PackedAt,
    /// `[head_dim, hidden]`: the index key from the normed input.
    pub wk: PackedAt,
    /// `[heads, hidden]` bf16: the heads' gates.
    pub weights_proj: PackedAt,
    /// `[head_dim]` fp32 (made from the bf16 tensors).
    pub k_norm_weight: u64,
    pub k_norm_bias: u64,
}

/// A bank of same-shaped experts: expert e's packed weight `e * w_stride` bytes after expert 0's,
/// its scales `e * scales_stride` floats after (`linear::gpu::LinExpert`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertBank {
    pub first: PackedAt,
    pub w_stride: u64,
    pub scales_stride: u64,
    pub experts: u32,
}

/// The MoE half's weights.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MoeWeights {
    /// The router's k-splits (`moe::layout::MoeShape::router_splits`), bf16.
    pub router: Vec<PackedAt>,
    /// `[experts]` fp32 e_score_correction_bias.
    pub bias: u64,
    pub shared_gate_up: PackedAt,
    pub shared_down: PackedAt,
    pub gate_up: ExpertBank,
    pub down: ExpertBank,
}

/// The MLP half of a layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MlpWeights {
    /// The post-attention norm is `DenseWeights::post_norm`.
    Dense(DenseWeights),
    Moe(MoeWeights),
}

/// Every weight of one layer's launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerWeights {
    pub plan: LayerPlan,
    pub attention: HalfWeights,
    /// On full-indexer layers.
    pub indexer: Option<IndexerWeights>,
    /// bf16 `[hidden]`.
    pub post_norm: u64,
    pub mlp: MlpWeights,
}

/// The whole rank's bound weights.
pub struct ModelWeights {
    /// Where the rank's tensors are (their names, for checks), and its arena's address.
    pub plan: crate::step::weights::WeightPlan,
    pub arena: u64,
    /// `[vocab, hidden]` bf16 row-major.
    pub embedding: u64,
    pub vocab: u32,
    pub layers: Vec<LayerWeights>,
    pub tail: TailWeights,
    /// The derived forms the addresses above point into (besides the weights' arena).
    pub forms: LaunchForms,
}

/// The derived forms on the device.
pub struct LaunchForms {
    pub buffer: Buffer<u8>,
}

/// What the forms of one layer are, before upload: packed matrices and fp32 vectors by name.
#[derive(Default)]
struct FormsImage {
    bytes: Vec<u8>,
    /// (name, offset of the weights, offset of the scales or none).
    entries: Vec<(String, usize, Option<usize>)>,
}

impl FormsImage {
    fn put(&mut self, name: String, data: &[u8]) -> usize {
        let at = self
            .bytes
            .len()
            .next_multiple_of(crate::step::weights::plan::ALIGN);
        self.bytes.resize(at, 0);
        self.bytes.extend_from_slice(data);
        self.entries.push((name, at, None));
        at
    }

    fn put_packed(&mut self, name: String, w: &PackedWeight) {
        self.put(name.clone(), &w.bytes);
        let scales = (!w.scales.is_empty())
            .then(|| self.put(format!("{name}.scales"), bytemuck::cast_slice(&w.scales)));
        let last = self.entries.len() - 1 - usize::from(scales.is_some());
        self.entries[last].2 = scales;
    }
}

fn missing(name: &str, what: String) -> StepError {
    StepError::Invalid(format!("weight {name}: {what}"))
}

/// A packed matrix of `n` x `k` (per source) by name.
fn packed_at(w: &DeviceWeights, name: &str, n: usize, k: usize) -> Result<PackedAt> {
    let t = w.tensor(name)?;
    let Form::Packed(layout) = t.form else {
        return Err(missing(
            name,
            "stored row-major; the linear task reads it packed".into(),
        ));
    };
    if (layout.n, layout.k) != (n, k) {
        return Err(missing(
            name,
            format!(
                "packed as {} x {}; the launch reads {n} x {k}",
                layout.n, layout.k
            ),
        ));
    }
    Ok(PackedAt {
        w: w.ptr(t),
        scales: w.scales_ptr(t),
        fp8: t.element == Element::Fp8,
    })
}

/// A vector of `n` elements of `element` by name.
fn vector_at(w: &DeviceWeights, name: &str, n: usize, element: Element) -> Result<u64> {
    let t = w.tensor(name)?;
    if t.element != element || t.elements() != n as u64 {
        return Err(missing(
            name,
            format!(
                "{} {:?} elements; the launch reads {n} {element:?}",
                t.elements(),
                t.element
            ),
        ));
    }
    Ok(w.ptr(t))
}

fn bf16_bits(v: &[f32]) -> Vec<u16> {
    v.iter()
        .map(|&x| (bf16_round(x).to_bits() >> 16) as u16)
        .collect()
}

fn pack_bf16(rows: usize, cols: usize, values: &[f32]) -> Result<PackedWeight> {
    let bits = bf16_bits(values);
    Ok(pack(
        Pairing::Plain,
        &[SourceWeight::Bf16 {
            rows,
            cols,
            bits: &bits,
        }],
    )?)
}

/// The tensors the derived forms are made from, by the end of their published names: a
/// checkpoint's loader keeps their values ([`DeviceWeights::from_source`]).
pub const FORM_SOURCES: [&str; 4] = [
    "self_attn.kv_b_proj.weight",
    "mlp.gate.weight",
    "self_attn.indexer.k_norm.weight",
    "self_attn.indexer.k_norm.bias",
];

/// The values of the one-source tensor `name`, one of [`FORM_SOURCES`].
fn values_of<'w>(w: &'w DeviceWeights, name: &str) -> Result<(Vec<f32>, &'w DeviceTensor)> {
    let t = w.tensor(name)?;
    let mut v = w.stored_values(t)?;
    if v.len() != 1 {
        return Err(missing(name, format!("{} sources; one expected", v.len())));
    }
    Ok((v.remove(0), t))
}

fn layer_name(layer: usize, suffix: &str) -> String {
    format!("model.layers.{layer}.{suffix}")
}

/// Layer `layer`'s derived forms.
fn layer_forms(
    w: &DeviceWeights,
    cfg: &ModelConfig,
    dims: &HalfDims,
    plan: &LayerPlan,
    router_splits: usize,
) -> Result<FormsImage> {
    let l = plan.index;
    let mut img = FormsImage::default();
    let kv_b = layer_name(l, "self_attn.kv_b_proj.weight");
    let (values, t) = values_of(w, &kv_b)?;
    let heads = HeadLayout {
        heads: dims.heads,
        nope: dims.nope,
        rope: dims.rope,
        v: dims.v,
    };
    let latent = dims.latent;
    if t.shape() != (heads.kv_b_rows(), latent) {
        return Err(missing(
            &kv_b,
            format!(
                "{:?} on this rank; the launch reads [{}, {latent}]",
                t.shape(),
                heads.kv_b_rows()
            ),
        ));
    }
    for h in 0..dims.heads {
        // W_UK[h]ᵀ: [latent, nope], zero columns up to uk_k.
        let k = dims.uk_k();
        let mut uk = vec![0f32; latent * k];
        for (i, r) in heads.uk_rows(h).enumerate() {
            for c in 0..latent {
                uk[c * k + i] = values[r * latent + c];
            }
        }
        img.put_packed(format!("{kv_b}.uk{h}"), &pack_bf16(latent, k, &uk)?);
        let rows = heads.uv_rows(h);
        let uv = &values[rows.start * latent..rows.end * latent];
        img.put_packed(format!("{kv_b}.uv{h}"), &pack_bf16(dims.v, latent, uv)?);
    }
    if plan.mlp == MlpKind::Moe {
        let gate = layer_name(l, "mlp.gate.weight");
        let (values, _) = values_of(w, &gate)?;
        let (e, hidden) = (cfg.n_routed_experts, cfg.hidden_size);
        let k = hidden / router_splits;
        for s in 0..router_splits {
            let split: Vec<f32> = (0..e)
                .flat_map(|row| values[row * hidden + s * k..row * hidden + (s + 1) * k].to_vec())
                .collect();
            img.put_packed(format!("{gate}.split{s}"), &pack_bf16(e, k, &split)?);
        }
    }
    if plan.indexer == IndexerKind::Full {
        for what in ["weight", "bias"] {
            let name = layer_name(l, &format!("self_attn.indexer.k_norm.{what}"));
            let (values, _) = values_of(w, &name)?;
            img.put(format!("{name}.f32"), bytemuck::cast_slice(&values));
        }
    }
    Ok(img)
}

impl ModelWeights {
    /// Binds every layer of `cfg` at TP `tp` from `w` (made for the same config, TP and rank),
    /// making and uploading the derived forms. A missing or misshapen tensor is an error naming it.
    pub fn bind(dev: &Device, cfg: &ModelConfig, w: &DeviceWeights) -> Result<Self> {
        let tp = w.plan.tp;
        let rank = RankShapes::new(cfg, tp)?;
        let dims = HalfDims::new(cfg, tp, model::CacheFormat::Fp8)
            .map_err(|e| StepError::Invalid(e.to_string()))?;
        let format = w.plan.format;
        let router_splits = moe::layout::MoeShape::new(cfg, tp, 1, format)
            .map(|s| s.router_splits())
            .unwrap_or(1);
        let plans = cfg.layer_plan()?;
        // The forms of each layer, made on the host's cores.
        let images: Vec<Result<FormsImage>> = std::thread::scope(|s| {
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let chunk = plans.len().div_ceil(threads).max(1);
            let handles: Vec<_> = plans
                .chunks(chunk)
                .map(|part| {
                    let dims = &dims;
                    s.spawn(move || {
                        part.iter()
                            .map(|p| layer_forms(w, cfg, dims, p, router_splits))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("a forms thread panicked"))
                .collect()
        });
        let mut all = FormsImage::default();
        for img in images {
            let img = img?;
            let base = all
                .bytes
                .len()
                .next_multiple_of(crate::step::weights::plan::ALIGN);
            all.bytes.resize(base, 0);
            all.bytes.extend_from_slice(&img.bytes);
            all.entries.extend(
                img.entries
                    .into_iter()
                    .map(|(n, at, sc)| (n, base + at, sc.map(|s| base + s))),
            );
        }
        let buffer = dev.upload(&all.bytes.iter().copied().chain([0]).collect::<Vec<u8>>())?;
        let base = buffer.device_ptr();
        let form = |name: &str| -> Result<(u64, u64)> {
            all.entries
                .iter()
                .find(|(n, _, _)| n == name)
                .map(|(_, at, sc)| (base + *at as u64, sc.map_or(0, |s| base + s as u64)))
                .ok_or_else(|| StepError::Invalid(format!("no derived form {name}")))
        };
        let bf16_form = |name: &str| -> Result<PackedAt> {
            let (w, scales) = form(name)?;
            Ok(PackedAt {
                w,
                scales,
                fp8: false,
            })
        };
        let mut layers = Vec::new();
        for plan in plans {
            let l = plan.index;
            let name = |s: &str| layer_name(l, s);
            let kv_b = name("self_attn.kv_b_proj.weight");
            let mut matrices = Vec::new();
            for m in HalfMatrix::all(dims.heads) {
                let (n, k) = m.shape(&dims);
                matrices.push(match m {
                    HalfMatrix::QA => packed_at(w, &name("self_attn.q_a_proj.weight"), n, k)?,
                    HalfMatrix::KvA => {
                        packed_at(w, &name("self_attn.kv_a_proj_with_mqa.weight"), n, k)?
                    }
                    HalfMatrix::QB => packed_at(w, &name("self_attn.q_b_proj.weight"), n, k)?,
                    HalfMatrix::OProj => packed_at(w, &name("self_attn.o_proj.weight"), n, k)?,
                    HalfMatrix::Uk(h) => bf16_form(&format!("{kv_b}.uk{h}"))?,
                    HalfMatrix::Uv(h) => bf16_form(&format!("{kv_b}.uv{h}"))?,
                });
            }
            let attention = HalfWeights {
                matrices,
                hidden_norm: vector_at(
                    w,
                    &name("input_layernorm.weight"),
                    dims.hidden,
                    Element::Bf16,
                )?,
                q_a_norm: vector_at(
                    w,
                    &name("self_attn.q_a_layernorm.weight"),
                    dims.q_lora,
                    Element::Bf16,
                )?,
                kv_a_norm: vector_at(
                    w,
                    &name("self_attn.kv_a_layernorm.weight"),
                    dims.latent,
                    Element::Bf16,
                )?,
            };
            let indexer = match plan.indexer {
                IndexerKind::Full => {
                    let (heads, d) = (cfg.index_n_heads, cfg.index_head_dim);
                    Some(IndexerWeights {
                        wq_b: packed_at(
                            w,
                            &name("self_attn.indexer.wq_b.weight"),
                            heads * d,
                            cfg.q_lora_rank,
                        )?,
                        wk: packed_at(w, &name("self_attn.indexer.wk.weight"), d, cfg.hidden_size)?,
                        weights_proj: packed_at(
                            w,
                            &name("self_attn.indexer.weights_proj.weight"),
                            heads,
                            cfg.hidden_size,
                        )?,
                        k_norm_weight: form(&name("self_attn.indexer.k_norm.weight.f32"))?.0,
                        k_norm_bias: form(&name("self_attn.indexer.k_norm.bias.f32"))?.0,
                    })
                }
                IndexerKind::Shared { .. } => None,
            };
            let post_norm = vector_at(
                w,
                &name("post_attention_layernorm.weight"),
                cfg.hidden_size,
                Element::Bf16,
            )?;
            let hidden = cfg.hidden_size;
            let mlp = match plan.mlp {
                MlpKind::Dense => {
                    let inter = rank.dense_intermediate;
                    let gu = packed_at(w, &name("mlp.gate_up_proj.weight"), inter, hidden)?;
                    let dn = packed_at(w, &name("mlp.down_proj.weight"), hidden, inter)?;
                    MlpWeights::Dense(DenseWeights {
                        post_norm,
                        gate_up: gu.w,
                        gate_up_scales: gu.scales,
                        down: dn.w,
                        down_scales: dn.scales,
                    })
                }
                MlpKind::Moe => {
                    let (si, ei) = (rank.shared_intermediate, rank.expert_intermediate);
                    let gate = name("mlp.gate.weight");
                    MlpWeights::Moe(MoeWeights {
                        router: (0..router_splits)
                            .map(|s| bf16_form(&format!("{gate}.split{s}")))
                            .collect::<Result<_>>()?,
                        bias: vector_at(
                            w,
                            &name("mlp.gate.e_score_correction_bias"),
                            cfg.n_routed_experts,
                            Element::F32,
                        )?,
                        shared_gate_up: packed_at(
                            w,
                            &name("mlp.shared_experts.gate_up_proj.weight"),
                            si,
                            hidden,
                        )?,
                        shared_down: packed_at(
                            w,
                            &name("mlp.shared_experts.down_proj.weight"),
                            hidden,
                            si,
                        )?,
                        gate_up: bank(w, cfg, l, "gate_up_proj", ei, hidden)?,
                        down: bank(w, cfg, l, "down_proj", hidden, ei)?,
                    })
                }
            };
            layers.push(LayerWeights {
                plan,
                attention,
                indexer,
                post_norm,
                mlp,
            });
        }
        let lm_head = packed_at(w, "lm_head.weight", rank.vocab_rows, cfg.hidden_size)?;
        let embedding = w.tensor("model.embed_tokens.weight")?;
        if embedding.element != Element::Bf16
            || embedding.shape() != (cfg.vocab_size, cfg.hidden_size)
        {
            return Err(missing(
                "model.embed_tokens.weight",
                format!(
                    "{:?} {:?}; the launch reads bf16 [vocab, hidden]",
                    embedding.shape(),
                    embedding.element
                ),
            ));
        }
        Ok(ModelWeights {
            plan: w.plan.clone(),
            arena: w.arena.device_ptr(),
            embedding: w.ptr(embedding),
            vocab: cfg.vocab_size as u32,
            layers,
            tail: TailWeights {
                final_norm: vector_at(w, "model.norm.weight", cfg.hidden_size, Element::Bf16)?,
                lm_head: lm_head.w,
                lm_head_scales: lm_head.scales,
            },
            forms: LaunchForms { buffer },
        })
    }

    /// Device address of the elements of the rank's tensor `name`.
    pub fn tensor_ptr(&self, name: &str) -> Result<u64> {
        let t = self
            .plan
            .get(name)
            .ok_or_else(|| StepError::Invalid(format!("no weight named {name} on this rank")))?;
        Ok(self.arena + t.offset as u64)
    }

    /// Whether the rank's tensor `name` is stored FP8.
    pub fn tensor_fp8(&self, name: &str) -> Result<bool> {
        let t = self
            .plan
            .get(name)
            .ok_or_else(|| StepError::Invalid(format!("no weight named {name} on this rank")))?;
        Ok(t.element == Element::Fp8)
    }

    /// Layer `layer`'s weights, or an error naming it.
    pub fn layer(&self, layer: usize) -> Result<&LayerWeights> {
        self.layers
            .iter()
            .find(|l| l.plan.index == layer)
            .ok_or_else(|| StepError::Invalid(format!("no weights bound for layer {layer}")))
    }
}

/// The routed experts' `part` of layer `layer` as a bank: every expert's tensor at one stride
/// from expert 0's, or an error naming the first that is not.
fn bank(
    w: &DeviceWeights,
    cfg: &ModelConfig,
    layer: usize,
    part: &str,
    n: usize,
    k: usize,
) -> Result<ExpertBank> {
    let name = |e: usize| layer_name(layer, &format!("mlp.experts.{e}.{part}.weight"));
    let experts = cfg.n_routed_experts;
    let first = packed_at(w, &name(0), n, k)?;
    let (w_stride, scales_stride) = if experts > 1 {
        let second = packed_at(w, &name(1), n, k)?;
        (
            second.w - first.w,
            second.scales.saturating_sub(first.scales),
        )
    } else {
        (0, 0)
    };
    for e in 0..experts {
        let at = packed_at(w, &name(e), n, k)?;
        let e64 = e as u64;
        let scales_ok = !first.fp8 || at.scales == first.scales + e64 * scales_stride;
        if at.w != first.w + e64 * w_stride || !scales_ok || at.fp8 != first.fp8 {
            return Err(missing(
                &name(e),
                format!(
                    "not at expert 0's address plus {e} x {w_stride} bytes, as a bank's experts \
                     must be"
                ),
            ));
        }
    }
    if scales_stride % 4 != 0 {
        return Err(missing(
            &name(1),
            "scales not a whole number of floats apart".into(),
        ));
    }
    Ok(ExpertBank {
        first,
        w_stride,
        scales_stride: scales_stride / 4,
        experts: experts as u32,
    })
}
