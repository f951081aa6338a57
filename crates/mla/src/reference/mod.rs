//! The CPU reference of MLA for one layer (spec §2.2–2.7): sums in f64; with
//! [`MlaOptions::bf16_activations`] values are rounded to bf16 wherever a bf16 model stores them
//! (every projection's output, the norms, the roped parts, the heads' outputs), so it tracks a
//! bf16 implementation step by step; without, they stay f32 (to compare with an fp32 run).
//!
//! Per row at position p, from the normed hidden state x̂:
//! - c^Q = RMSNorm_qa(W_qa x̂); q = W_qb c^Q, per head nope ‖ rope(pe)
//! - u = W_kva x̂; latent c = RMSNorm_kv(u[..d_c]); k_pe = rope(u[d_c..])  → the cache
//! - absorbed attention over the selected tokens t: q_abs = W_UK\[h\]ᵀ q_nope,
//!   s_t = (q_abs · ĉ_t + q_pe · k_pe_t) / sqrt(qk_head_dim), P = softmax(s),
//!   o_h = W_UV\[h\] Σ_t P_t ĉ_t, out = W_o concat_h(o_h)
//!
//! Both ropes use the config's style (GLM-5: interleaved). The latent norms' eps is a parameter:
//! transformers builds q_a_layernorm and kv_a_layernorm with 1e-6, SGLang and vLLM with
//! rms_norm_eps (1e-5) (spec §2.12).

use std::ops::Range;

use model::numerics::{apply_rope, bf16_round_slice, rms_norm, RopeStyle};
use model::weights::{layer_tensor_name, Matrix, WeightSource};
use model::ModelConfig;

use crate::error::{invalid, Result};
use crate::layout::HeadLayout;

mod cache;

pub use cache::{CacheStore, CachedToken, MlaCache};

/// One layer's MLA weights, as f32 values.
#[derive(Debug, Clone)]
pub struct MlaWeights {
    pub q_a: Matrix,
    pub q_a_norm: Vec<f32>,
    pub q_b: Matrix,
    pub kv_a: Matrix,
    pub kv_a_norm: Vec<f32>,
    pub kv_b: Matrix,
    pub o_proj: Matrix,
}

impl MlaWeights {
    /// Loads `model.layers.{layer}.self_attn.*` with the config's (TP 1) shapes.
    pub fn load(source: &dyn WeightSource, cfg: &ModelConfig, layer: usize) -> Result<Self> {
        let heads = HeadLayout::new(cfg);
        let name = |suffix: &str| layer_tensor_name(layer, &format!("self_attn.{suffix}"));
        let hidden = cfg.hidden_size;
        Ok(MlaWeights {
            q_a: source.matrix(&name("q_a_proj.weight"), cfg.q_lora_rank, hidden)?,
            q_a_norm: source.vector(&name("q_a_layernorm.weight"), cfg.q_lora_rank)?,
            q_b: source.matrix(&name("q_b_proj.weight"), heads.q_b_rows(), cfg.q_lora_rank)?,
            kv_a: source.matrix(
                &name("kv_a_proj_with_mqa.weight"),
                cfg.kv_lora_rank + cfg.qk_rope_head_dim,
                hidden,
            )?,
            kv_a_norm: source.vector(&name("kv_a_layernorm.weight"), cfg.kv_lora_rank)?,
            kv_b: source.matrix(
                &name("kv_b_proj.weight"),
                heads.kv_b_rows(),
                cfg.kv_lora_rank,
            )?,
            o_proj: source.matrix(&name("o_proj.weight"), hidden, heads.o_cols())?,
        })
    }
}

/// The choices implementations differ on, for MLA.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlaOptions {
    pub rope: RopeStyle,
    pub rope_theta: f64,
    /// eps of q_a_layernorm and kv_a_layernorm.
    pub latent_norm_eps: f64,
    /// Round activations to bf16 where a bf16 model stores them.
    pub bf16_activations: bool,
}

impl MlaOptions {
    /// transformers' choices: the config's rope, latent norms with their class default 1e-6,
    /// activations in the model's dtype (`bf16_activations`).
    pub fn transformers(cfg: &ModelConfig, bf16_activations: bool) -> Self {
        MlaOptions {
            rope: RopeStyle::from_interleave(cfg.rope_interleave),
            rope_theta: cfg.rope_theta,
            latent_norm_eps: 1e-6,
            bf16_activations,
        }
    }

    /// SGLang's and vLLM's: latent norms with rms_norm_eps, bf16 activations.
    pub fn engines(cfg: &ModelConfig) -> Self {
        MlaOptions {
            latent_norm_eps: cfg.rms_norm_eps,
            ..Self::transformers(cfg, true)
        }
    }
}

/// What one row's projections produce (all bf16 values).
#[derive(Debug, Clone, PartialEq)]
pub struct Projection {
    /// c^Q, the normed q latent; the indexer's input too.
    pub q_latent: Vec<f32>,
    /// `[heads][nope]`.
    pub q_nope: Vec<f32>,
    /// `[heads][rope]`, roped.
    pub q_pe: Vec<f32>,
    /// The normed KV latent c (what the cache stores).
    pub latent: Vec<f32>,
    /// The roped shared rope key.
    pub k_pe: Vec<f32>,
}

impl MlaOptions {
    /// `values` as the model stores them.
    fn store(&self, mut values: Vec<f32>) -> Vec<f32> {
        if self.bf16_activations {
            bf16_round_slice(&mut values);
        }
        values
    }

    fn linear(&self, w: &Matrix, x: &[f32]) -> Result<Vec<f32>> {
        Ok(self.store(w.matvec(x)?))
    }

    fn linear_rows(&self, w: &Matrix, rows: Range<usize>, x: &[f32]) -> Result<Vec<f32>> {
        Ok(self.store(w.matvec_rows(rows, x)?))
    }

    fn latent_norm(&self, x: &[f32], weight: &[f32]) -> Result<Vec<f32>> {
        Ok(self.store(rms_norm(x, weight, self.latent_norm_eps)?))
    }

    fn roped(&self, v: &[f32], position: usize) -> Result<Vec<f32>> {
        let mut out = v.to_vec();
        apply_rope(&mut out, position as u64, self.rope_theta, self.rope)?;
        Ok(self.store(out))
    }
}

/// Spec §2.2–2.4 for one row: `x_hat` is the input-normed hidden state of the row at `position`.
pub fn project(
    heads: &HeadLayout,
    w: &MlaWeights,
    opts: &MlaOptions,
    x_hat: &[f32],
    position: usize,
) -> Result<Projection> {
    let q_latent = opts.latent_norm(&opts.linear(&w.q_a, x_hat)?, &w.q_a_norm)?;
    let q = opts.linear(&w.q_b, &q_latent)?;
    let mut q_nope = Vec::with_capacity(heads.heads * heads.nope);
    let mut q_pe = Vec::with_capacity(heads.heads * heads.rope);
    for h in 0..heads.heads {
        q_nope.extend_from_slice(&q[heads.q_nope_rows(h)]);
        q_pe.extend(opts.roped(&q[heads.q_rope_rows(h)], position)?);
    }
    let u = opts.linear(&w.kv_a, x_hat)?;
    let latent_len = w.kv_a_norm.len();
    let latent = opts.latent_norm(&u[..latent_len], &w.kv_a_norm)?;
    let k_pe = opts.roped(&u[latent_len..], position)?;
    Ok(Projection {
        q_latent,
        q_nope,
        q_pe,
        latent,
        k_pe,
    })
}

/// Spec §2.7 steps 3-5 for one row: per head, the softmax (scale `scale`) of
/// `q_abs[h] · ĉ_t + q_pe[h] · k_pe_t` over the cached tokens listed in `selected` (positions; -1
/// entries are padding and skipped), and the weighted sum of their latents: `[heads][latent]`,
/// the attention output in latent space, before W_UV. `q_abs` is `[heads][latent]`, `q_pe`
/// `[heads][rope]`.
pub fn attend_latent(
    q_abs: &[f32],
    q_pe: &[f32],
    cache: &MlaCache,
    selected: &[i32],
    scale: f64,
) -> Result<Vec<f32>> {
    let (latent, rope) = cache.widths();
    let heads = q_abs.len() / latent;
    if q_abs.len() != heads * latent || q_pe.len() != heads * rope || heads == 0 {
        return Err(invalid(
            "MLA attention",
            format!(
                "queries of {} and {} values do not make whole heads of {latent} + {rope}",
                q_abs.len(),
                q_pe.len()
            ),
        ));
    }
    let tokens = selected
        .iter()
        .filter(|&&t| t >= 0)
        .map(|&t| cache.read(t as usize))
        .collect::<Result<Vec<_>>>()?;
    if tokens.is_empty() {
        return Err(invalid("MLA attention", "no token selected"));
    }
    let mut out = Vec::with_capacity(heads * latent);
    for h in 0..heads {
        let q_abs = &q_abs[h * latent..(h + 1) * latent];
        let q_pe = &q_pe[h * rope..(h + 1) * rope];
        let scores: Vec<f64> = tokens
            .iter()
            .map(|t| (dot(q_abs, &t.latent) + dot(q_pe, &t.k_pe)) * scale)
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut o = vec![0f64; latent];
        for (t, p) in tokens.iter().zip(&weights) {
            for (o, &c) in o.iter_mut().zip(&t.latent) {
                *o += p / total * f64::from(c);
            }
        }
        out.extend(o.into_iter().map(|v| v as f32));
    }
    Ok(out)
}

/// Spec §2.7: the row's attention output (after o_proj, before the residual) over the cached
/// tokens listed in `selected` (positions; -1 entries are padding and skipped). The softmax
/// scale is 1/sqrt(nope + rope).
pub fn attend(
    heads: &HeadLayout,
    w: &MlaWeights,
    opts: &MlaOptions,
    proj: &Projection,
    cache: &MlaCache,
    selected: &[i32],
) -> Result<Vec<f32>> {
    let mut q_abs = Vec::with_capacity(heads.heads * cache.widths().0);
    for h in 0..heads.heads {
        let q_nope = &proj.q_nope[h * heads.nope..(h + 1) * heads.nope];
        q_abs.extend(w.kv_b.transposed_matvec_rows(heads.uk_rows(h), q_nope)?);
    }
    let scale = 1.0 / (heads.qk_dim() as f64).sqrt();
    let o_latent = attend_latent(&q_abs, &proj.q_pe, cache, selected, scale)?;
    let latent = cache.widths().0;
    let mut concat = Vec::with_capacity(heads.o_cols());
    for h in 0..heads.heads {
        concat.extend(opts.linear_rows(
            &w.kv_b,
            heads.uv_rows(h),
            &o_latent[h * latent..(h + 1) * latent],
        )?);
    }
    opts.linear(&w.o_proj, &concat)
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}
