//! Which weight fills which entry of a layer launch, by the checkpoint tensor names of
//! `model::weights` (`WeightPlan::get` and `DeviceWeights` find them; a gate/up pair is one device
//! tensor, `...gate_up_proj.weight`, which `WeightPlan::get` also finds by either half's name).

use model::weights::layer_tensor_name;

/// What one entry of the launch's linear matrix list (`lin_args.mats`) is made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MatrixSource {
    /// A device tensor, whole, in the linear task's packed form.
    Tensor(String),
    /// Columns `col0..col0 + cols` of a tensor, packed as a matrix of their own (the router's
    /// k-splits: `moe::memory` packs them so).
    Columns {
        tensor: String,
        col0: usize,
        cols: usize,
    },
    /// Head `head`'s W_UK from the rank's shard of `tensor` (kv_b_proj): its rows
    /// `head * (nope + v)..+ nope`, a `[nope, latent]` block, transposed to `[latent, nope]` and
    /// padded with zero columns to `[latent, HalfDims::uk_k()]` (`fused::attention` says why).
    UkTransposed { tensor: String, head: usize },
    /// Head `head`'s W_UV from the rank's shard of `tensor` (kv_b_proj): its rows
    /// `head * (nope + v) + nope..+ v`, `[v, latent]` as they are.
    Uv { tensor: String, head: usize },
}

/// One entry of the launch's matrix list: its index and what fills it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerMatrix {
    pub index: u32,
    pub source: MatrixSource,
}

/// One expert bank of the launch (`lin_args.experts[bank]`, `moe::layout::BANK_*`): expert e's
/// weight is `tensors[e]`, all the same shape, laid out `w_stride` apart by the binder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertBank {
    pub bank: u32,
    pub tensors: Vec<String>,
}

/// Where a vector weight (a norm's weight or bias, the router's bias, the embedding table) goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VectorUse {
    /// `HalfWeights::hidden_norm`.
    AttentionInputNorm,
    /// `HalfWeights::q_a_norm`.
    QLatentNorm,
    /// `HalfWeights::kv_a_norm`.
    KvLatentNorm,
    /// `idx_args::norm_weight` (f32 on the device: the indexer reads fp32).
    IndexKeyNormWeight,
    /// `idx_args::norm_bias` (f32).
    IndexKeyNormBias,
    /// The head norm descriptor of this index (`HeadDescriptors::norms`).
    HeadNorm(u32),
    /// The embedding table of the head embed descriptor of this index.
    EmbedTable(u32),
    /// The router's `e_score_correction_bias` (`moe_args`).
    RouterBias,
    /// The MoE part's input norm (the post-attention norm): `LinMatrix::norm_w` of the matrices
    /// that read the MoE's input (the router's k-splits, the shared and the routed gate/ups).
    MoeInputNorm,
}

/// A tensor the launch reads outside the matrix list and the banks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerVector {
    pub name: String,
    pub used_as: VectorUse,
}

/// `model.layers.{layer}.{suffix}`.
pub(super) fn tensor(layer: usize, suffix: &str) -> String {
    layer_tensor_name(layer, suffix)
}

/// The routed experts' banks of layer `layer`: gate/up pairs (bank 0), downs (bank 1).
pub(super) fn expert_banks(layer: usize, experts: usize) -> Vec<ExpertBank> {
    let bank = |bank: u32, part: &str| ExpertBank {
        bank,
        tensors: (0..experts)
            .map(|e| tensor(layer, &format!("mlp.experts.{e}.{part}.weight")))
            .collect(),
    };
    vec![
        bank(moe::layout::BANK_GATE_UP, "gate_up_proj"),
        bank(moe::layout::BANK_DOWN, "down_proj"),
    ]
}
