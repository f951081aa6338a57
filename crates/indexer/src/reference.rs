//! The CPU reference of the lightning indexer (spec §3.1–3.7): plain loops, sums in f64, the
//! oracle for every kernel of this crate and the indexer of the whole-model reference.
//!
//! Per row r at position p_r:
//! - key   k_r = format(H · rope(LayerNorm(W_k x̂_r)))            one per token, cached
//! - query q_{r,h} = format(H · rope((W_qb c^Q_r)_h))             one per head
//! - head weights w_{r,h} = g_{r,h} · (H_I · d_I)^-1/2 · s^q_{r,h}  with g = W_w x̂
//! - score I\[r,t\] = Σ_h w_{r,h} · ReLU(q_{r,h} · k_t) · s^k_t for t ≤ p_r, −inf past it,
//!
//! where H is the optional 1/sqrt(d_I) Hadamard rotation, rope turns dims 0..qk_rope_head_dim, and
//! format rounds to bf16, to FP8 with a power-of-two scale (s), or keeps f32 (s = 1).
//! [`IndexerOptions`] picks these per implementation; the numerics are `model::numerics`.

use model::numerics::{
    apply_rope, bf16_round, hadamard_scaled, layer_norm, quantise_block_e4m3, RopeStyle,
};
use model::weights::{layer_tensor_name, WeightSource};
use model::ModelConfig;

use crate::error::{check_len, shape, Result};

/// How a roped and rotated vector is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VectorFormat {
    /// As computed (transformers scores in fp32).
    F32,
    /// Rounded to bf16 (what `index_qh` publishes).
    Bf16,
    /// E4M3 codes times one power-of-two (ue8m0) scale for the whole vector (spec §3.4).
    Fp8,
}

/// The choices on which implementations of the indexer differ (spec §3.2–3.4, §6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IndexerOptions {
    pub rope: RopeStyle,
    /// The Hadamard rotation of q and k (spec §3.3). It is orthogonal, so exact scores do not
    /// depend on it; it only spreads FP8 rounding error. DeepSeek's reference and SGLang's unfused
    /// path apply it; SGLang's fused GLM-5 path (the one GLM-5 takes, since its indexer rope is
    /// interleaved), vLLM and transformers do not.
    pub hadamard: bool,
    pub query: VectorFormat,
    pub key: VectorFormat,
    /// Round the projections W_qb c^Q, W_k x̂ and W_w x̂ to bf16, as a bf16 GEMV stores them.
    pub bf16_projections: bool,
}

impl IndexerOptions {
    /// What this crate's kernels compute: Hadamard on, q bf16 (`index_qh`), k FP8 (the cache).
    pub fn kernels(cfg: &ModelConfig) -> Self {
        IndexerOptions {
            rope: RopeStyle::from_interleave(cfg.indexer_rope_interleave),
            hadamard: true,
            query: VectorFormat::Bf16,
            key: VectorFormat::Fp8,
            bf16_projections: true,
        }
    }

    /// DeepSeek's reference and SGLang's unfused path: Hadamard, q and k both FP8.
    pub fn deepseek(cfg: &ModelConfig) -> Self {
        IndexerOptions {
            query: VectorFormat::Fp8,
            ..Self::kernels(cfg)
        }
    }

    /// SGLang's fused GLM-5 path: q and k FP8 without the Hadamard rotation.
    pub fn sglang_fused(cfg: &ModelConfig) -> Self {
        IndexerOptions {
            hadamard: false,
            ..Self::deepseek(cfg)
        }
    }

    /// Transformers: no rotation, no quantisation (it scores bf16 tensors in fp32). Every switch
    /// off; only the projections keep their bf16 store.
    pub fn transformers(cfg: &ModelConfig) -> Self {
        IndexerOptions {
            hadamard: false,
            query: VectorFormat::F32,
            key: VectorFormat::F32,
            ..Self::kernels(cfg)
        }
    }
}

/// A vector as stored: the value of element i is `values[i] * scale`. For FP8 `values` are the
/// decoded E4M3 codes (exact in f32) and `scale` a power of two; otherwise `scale` is 1.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaledVector {
    pub values: Vec<f32>,
    pub scale: f32,
}

impl ScaledVector {
    fn store(values: Vec<f32>, format: VectorFormat) -> Self {
        match format {
            VectorFormat::F32 => ScaledVector { values, scale: 1.0 },
            VectorFormat::Bf16 => ScaledVector {
                values: values.into_iter().map(bf16_round).collect(),
                scale: 1.0,
            },
            VectorFormat::Fp8 => {
                let block = quantise_block_e4m3(&values);
                ScaledVector {
                    values: block
                        .codes
                        .iter()
                        .map(|&c| model::numerics::e4m3_decode(c))
                        .collect(),
                    scale: block.scale,
                }
            }
        }
    }

    /// E4M3 codes of FP8 values (exact: every stored value is one).
    pub fn codes(&self) -> Vec<u8> {
        self.values
            .iter()
            .map(|&v| model::numerics::e4m3_encode(v))
            .collect()
    }
}

/// One row's query as the scorer uses it: the heads' stored values and the head weights, each
/// with its query scale already multiplied in (spec §3.6).
#[derive(Debug, Clone, PartialEq)]
pub struct RowQuery {
    /// `[index_n_heads][index_head_dim]`, row-major.
    pub q: Vec<f32>,
    /// `[index_n_heads]`.
    pub weights: Vec<f32>,
}

/// The indexer's weights of one layer, as f32 (dequantised or bf16 values), row-major `[out, in]`.
#[derive(Debug, Clone, Copy)]
pub struct IndexerWeights<'a> {
    /// `[index_n_heads * index_head_dim, q_lora_rank]`.
    pub wq_b: &'a [f32],
    /// `[index_head_dim, hidden_size]`.
    pub wk: &'a [f32],
    pub k_norm_weight: &'a [f32],
    pub k_norm_bias: &'a [f32],
    /// `[index_n_heads, hidden_size]`.
    pub weights_proj: &'a [f32],
}

/// A full indexer layer's weights, owned, loaded from a checkpoint (the reference borrows them
/// through [`OwnedIndexerWeights::view`]).
#[derive(Debug, Clone)]
pub struct OwnedIndexerWeights {
    pub wq_b: Vec<f32>,
    pub wk: Vec<f32>,
    pub k_norm_weight: Vec<f32>,
    pub k_norm_bias: Vec<f32>,
    pub weights_proj: Vec<f32>,
}

impl OwnedIndexerWeights {
    /// Loads `model.layers.{layer}.self_attn.indexer.*` with the config's shapes.
    pub fn load(source: &dyn WeightSource, cfg: &ModelConfig, layer: usize) -> Result<Self> {
        let name = |suffix: &str| layer_tensor_name(layer, &format!("self_attn.indexer.{suffix}"));
        let (heads, dim, hidden) = (cfg.index_n_heads, cfg.index_head_dim, cfg.hidden_size);
        Ok(OwnedIndexerWeights {
            wq_b: source.tensor(&name("wq_b.weight"), &[heads * dim, cfg.q_lora_rank])?,
            wk: source.tensor(&name("wk.weight"), &[dim, hidden])?,
            k_norm_weight: source.vector(&name("k_norm.weight"), dim)?,
            k_norm_bias: source.vector(&name("k_norm.bias"), dim)?,
            weights_proj: source.tensor(&name("weights_proj.weight"), &[heads, hidden])?,
        })
    }

    pub fn view(&self) -> IndexerWeights<'_> {
        IndexerWeights {
            wq_b: &self.wq_b,
            wk: &self.wk,
            k_norm_weight: &self.k_norm_weight,
            k_norm_bias: &self.k_norm_bias,
            weights_proj: &self.weights_proj,
        }
    }
}

/// Shapes the indexer needs from the config, checked once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IndexerDims {
    pub heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub rope_theta: f64,
}

impl IndexerDims {
    pub fn new(cfg: &ModelConfig) -> Result<Self> {
        let dims = IndexerDims {
            heads: cfg.index_n_heads,
            head_dim: cfg.index_head_dim,
            rope_dim: cfg.qk_rope_head_dim,
            rope_theta: cfg.rope_theta,
        };
        // The Hadamard rotation's power-of-two width is checked where the rotation is asked for
        // (`ModelConfig::check_index_hadamard`, `KernelConfig::new`), not here: scores without it
        // take any width.
        if dims.heads == 0 || dims.head_dim == 0 {
            return Err(shape(
                "indexer config",
                format!(
                    "{} heads of {} dims: need at least one head of at least one dim",
                    dims.heads, dims.head_dim
                ),
            ));
        }
        if dims.rope_dim % 2 != 0 || dims.rope_dim > dims.head_dim {
            return Err(shape(
                "indexer config",
                format!(
                    "rope dim {} must be even and at most the head dim {}",
                    dims.rope_dim, dims.head_dim
                ),
            ));
        }
        Ok(dims)
    }

    /// (H_I · d_I)^-1/2: the constant in every head weight.
    pub fn weight_scale(&self) -> f64 {
        1.0 / ((self.heads * self.head_dim) as f64).sqrt()
    }
}

/// y = W x in f64, for `W` row-major `[rows, x.len()]`; rounded to bf16 when `bf16` is set.
pub fn project(
    what: &'static str,
    w: &[f32],
    x: &[f32],
    rows: usize,
    bf16: bool,
) -> Result<Vec<f32>> {
    if x.is_empty() {
        return Err(shape(what, "input vector is empty"));
    }
    check_len(what, "weight", w.len(), rows * x.len())?;
    Ok(w.chunks_exact(x.len())
        .map(|row| {
            let y = row
                .iter()
                .zip(x)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum::<f64>() as f32;
            if bf16 {
                bf16_round(y)
            } else {
                y
            }
        })
        .collect())
}

/// Rope on the first `rope_dim` dims, then the optional rotation: what q heads and k share.
fn rope_and_rotate(
    dims: &IndexerDims,
    opts: &IndexerOptions,
    mut v: Vec<f32>,
    position: u64,
) -> Result<Vec<f32>> {
    apply_rope(
        &mut v[..dims.rope_dim],
        position,
        dims.rope_theta,
        opts.rope,
    )?;
    if opts.hadamard {
        hadamard_scaled(&mut v)?;
    }
    Ok(v)
}

/// The key of one token from its projection W_k x̂ (`index_head_dim` values): LayerNorm (eps
/// 1e-6, affine), rope, rotation, store. What the `index_key` kernel computes from its input.
pub fn key_from_projection(
    dims: &IndexerDims,
    opts: &IndexerOptions,
    projected: &[f32],
    norm_weight: &[f32],
    norm_bias: &[f32],
    position: u64,
) -> Result<ScaledVector> {
    check_len("index key", "projection", projected.len(), dims.head_dim)?;
    let normed = layer_norm(
        projected,
        norm_weight,
        norm_bias,
        ModelConfig::INDEX_K_NORM_EPS,
    )?;
    let rotated = rope_and_rotate(dims, opts, normed, position)?;
    Ok(ScaledVector::store(rotated, opts.key))
}

/// Every head of one row's query from its projection W_qb c^Q (`heads * head_dim` values): rope,
/// rotation, store, per head. What the `index_qh` kernel computes from its input.
pub fn query_heads_from_projection(
    dims: &IndexerDims,
    opts: &IndexerOptions,
    projected: &[f32],
    position: u64,
) -> Result<Vec<ScaledVector>> {
    check_len(
        "index query",
        "projection",
        projected.len(),
        dims.heads * dims.head_dim,
    )?;
    projected
        .chunks_exact(dims.head_dim)
        .map(|head| {
            let rotated = rope_and_rotate(dims, opts, head.to_vec(), position)?;
            Ok(ScaledVector::store(rotated, opts.query))
        })
        .collect()
}

/// The scorer's view of a row: stored q values and w_h = g_h · (H_I d_I)^-1/2 · s^q_h, rounded
/// once to f32 (the kernels receive f32 weights).
pub fn row_query(dims: &IndexerDims, heads: &[ScaledVector], gates: &[f32]) -> Result<RowQuery> {
    check_len("row query", "heads", heads.len(), dims.heads)?;
    check_len("row query", "gates", gates.len(), dims.heads)?;
    let mut q = Vec::with_capacity(dims.heads * dims.head_dim);
    for head in heads {
        check_len("row query", "head", head.values.len(), dims.head_dim)?;
        q.extend_from_slice(&head.values);
    }
    let weights = heads
        .iter()
        .zip(gates)
        .map(|(head, &g)| (f64::from(g) * dims.weight_scale() * f64::from(head.scale)) as f32)
        .collect();
    Ok(RowQuery { q, weights })
}

/// A token's key from the hidden state x̂: projection, then [`key_from_projection`].
pub fn key(
    dims: &IndexerDims,
    opts: &IndexerOptions,
    w: &IndexerWeights,
    x_hat: &[f32],
    position: u64,
) -> Result<ScaledVector> {
    let projected = project(
        "index key",
        w.wk,
        x_hat,
        dims.head_dim,
        opts.bf16_projections,
    )?;
    key_from_projection(
        dims,
        opts,
        &projected,
        w.k_norm_weight,
        w.k_norm_bias,
        position,
    )
}

/// A row's query from the q latent c^Q and the hidden state x̂ (which feeds the head gates).
pub fn query(
    dims: &IndexerDims,
    opts: &IndexerOptions,
    w: &IndexerWeights,
    c_q: &[f32],
    x_hat: &[f32],
    position: u64,
) -> Result<RowQuery> {
    let projected = project(
        "index query",
        w.wq_b,
        c_q,
        dims.heads * dims.head_dim,
        opts.bf16_projections,
    )?;
    let heads = query_heads_from_projection(dims, opts, &projected, position)?;
    let gates = project(
        "head gates",
        w.weights_proj,
        x_hat,
        dims.heads,
        opts.bf16_projections,
    )?;
    row_query(dims, &heads, &gates)
}

/// I\[t\] = Σ_h w_h · ReLU(q_h · k_t) · s_t for t ≤ `position`, −inf for the other keys. `keys[t]`
/// is the token at position t of the row's request; the result has one score per key.
pub fn score_row(
    dims: &IndexerDims,
    row: &RowQuery,
    keys: &[ScaledVector],
    position: u64,
) -> Result<Vec<f32>> {
    check_len("score", "query", row.q.len(), dims.heads * dims.head_dim)?;
    check_len("score", "weights", row.weights.len(), dims.heads)?;
    keys.iter()
        .enumerate()
        .map(|(t, k)| {
            if t as u64 > position {
                return Ok(f32::NEG_INFINITY);
            }
            check_len("score", "key", k.values.len(), dims.head_dim)?;
            Ok(key_score(dims, row, &k.values, k.scale) as f32)
        })
        .collect()
}

/// One valid key's score, Σ_h w_h · ReLU(q_h · k) · s, in f64. The caller checks the lengths
/// (`row` as [`score_row`] does, `key` of `head_dim` values).
pub fn key_score(dims: &IndexerDims, row: &RowQuery, key: &[f32], scale: f32) -> f64 {
    let sum: f64 = row
        .q
        .chunks_exact(dims.head_dim)
        .zip(&row.weights)
        .map(|(q, &w)| f64::from(w) * dot(q, key).max(0.0))
        .sum();
    sum * f64::from(scale)
}

/// Σ a_i b_i in f64, as eight interleaved partial sums so that the compiler may keep them in
/// vector registers (the GPU checks score hundreds of millions of keys with this).
fn dot(a: &[f32], b: &[f32]) -> f64 {
    const LANES: usize = 8;
    let mut partial = [0.0f64; LANES];
    let (chunks_a, chunks_b) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f64 = chunks_a
        .remainder()
        .iter()
        .zip(chunks_b.remainder())
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    for (x, y) in chunks_a.zip(chunks_b) {
        for i in 0..LANES {
            partial[i] += f64::from(x[i]) * f64::from(y[i]);
        }
    }
    partial.iter().sum::<f64>() + tail
}
