//! Bytes a launch must move, for `mono info` and for the bandwidth floors of ARCHITECTURE.md section 7.
//!
//! Every number here is per TP rank: the weights from [`RankShapes`]'s table, and the caches,
//! which every rank reads whole (the MLA latent serves all heads; the indexer is replicated).
//! Activations and the cross-rank all-reduce are not counted: they are tiny next to weights.

use crate::config::{IndexerKind, LayerPlan, MlpKind};
use crate::format::{
    index_cache_bytes_per_token, mla_cache_bytes_per_token, CacheFormat, WeightFormat,
};
use crate::shapes::{RankShapes, WeightClass, WeightSpec};

/// H200 measured copy bandwidth (ARCHITECTURE.md section 7), bytes per second.
pub const H200_COPY_BYTES_PER_S: f64 = 4.0e12;

/// The work of one step: `requests` sequences, each with `rows_per_request` consecutive query
/// rows (1 for plain decode, k+1 for MTP verify), each seeing `context` cached tokens including
/// the rows written this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub requests: u64,
    pub rows_per_request: u64,
    pub context: u64,
}

impl Load {
    /// Plain decode: one row per request.
    pub fn decode(requests: u64, context: u64) -> Self {
        Load {
            requests,
            rows_per_request: 1,
            context,
        }
    }

    pub fn rows(&self) -> u64 {
        self.requests * self.rows_per_request
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Formats {
    pub weights: WeightFormat,
    pub cache: CacheFormat,
}

/// The kinds of launch a step is made of. Layers differ only in MLP and indexer, so those two
/// name the kind; `DenseShared` does not occur in the released configs but is allowed by them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LaunchKind {
    DenseFull,
    DenseShared,
    MoeFull,
    MoeShared,
    /// Final norm, lm_head, argmax.
    Tail,
}

impl LaunchKind {
    pub fn of(layer: &LayerPlan) -> Self {
        let full = layer.indexer == IndexerKind::Full;
        match (layer.mlp, full) {
            (MlpKind::Dense, true) => LaunchKind::DenseFull,
            (MlpKind::Dense, false) => LaunchKind::DenseShared,
            (MlpKind::Moe, true) => LaunchKind::MoeFull,
            (MlpKind::Moe, false) => LaunchKind::MoeShared,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LaunchKind::DenseFull => "dense layer",
            LaunchKind::DenseShared => "dense layer, shared indexer",
            LaunchKind::MoeFull => "MoE layer, full indexer",
            LaunchKind::MoeShared => "MoE layer, shared indexer",
            LaunchKind::Tail => "tail",
        }
    }

    /// A layer of this kind; only its MLP and indexer matter to the byte counts.
    fn sample_layer(self) -> Option<LayerPlan> {
        let (mlp, indexer) = match self {
            LaunchKind::DenseFull => (MlpKind::Dense, IndexerKind::Full),
            LaunchKind::DenseShared => (MlpKind::Dense, IndexerKind::Shared { source_layer: 0 }),
            LaunchKind::MoeFull => (MlpKind::Moe, IndexerKind::Full),
            LaunchKind::MoeShared => (MlpKind::Moe, IndexerKind::Shared { source_layer: 0 }),
            LaunchKind::Tail => return None,
        };
        Some(LayerPlan {
            index: 0,
            mlp,
            indexer,
        })
    }
}

/// Weight bytes split by how they scale with TP and with rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WeightBytes {
    pub replicated: u64,
    pub sharded: u64,
    pub shared_expert: u64,
    pub routed_experts: u64,
}

impl WeightBytes {
    pub fn experts(&self) -> u64 {
        self.shared_expert + self.routed_experts
    }

    pub fn total(&self) -> u64 {
        self.replicated + self.sharded + self.experts()
    }

    fn add(&mut self, class: WeightClass, bytes: u64) {
        match class {
            WeightClass::Replicated => self.replicated += bytes,
            WeightClass::Sharded => self.sharded += bytes,
            WeightClass::SharedExpert => self.shared_expert += bytes,
            WeightClass::RoutedExpert => self.routed_experts += bytes,
        }
    }
}

/// What one launch reads and writes on one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchTraffic {
    pub kind: LaunchKind,
    /// Weights read, with routed experts counted for `experts_touched` experts.
    pub weights: WeightBytes,
    /// One routed expert's slice on this rank (gate, up, down, scales).
    pub routed_expert_bytes: u64,
    /// Distinct routed experts read: at most min(n_routed_experts, rows x num_experts_per_tok).
    pub experts_touched: u64,
    /// Every row reads min(index_topk, context) tokens of the MLA cache (no sharing across rows).
    pub mla_cache_read: u64,
    /// Full-indexer layers score every cached key once per request.
    pub index_cache_read: u64,
    /// Every row writes its MLA cache token, and its index key on full-indexer layers.
    pub cache_write: u64,
}

impl LaunchTraffic {
    pub fn cache_bytes(&self) -> u64 {
        self.mla_cache_read + self.index_cache_read + self.cache_write
    }

    pub fn total_bytes(&self) -> u64 {
        self.weights.total() + self.cache_bytes()
    }
}

/// Upper bound on distinct routed experts `rows` rows touch; the floor assumes no overlap.
pub fn experts_touched(shapes: &RankShapes, rows: u64) -> u64 {
    let c = &shapes.config;
    (rows * c.num_experts_per_tok as u64).min(c.n_routed_experts as u64)
}

/// Bytes of one launch of `kind` on one rank.
pub fn launch_traffic(
    shapes: &RankShapes,
    kind: LaunchKind,
    formats: Formats,
    load: Load,
) -> LaunchTraffic {
    let Some(layer) = kind.sample_layer() else {
        return tail_traffic(shapes, formats);
    };
    let c = &shapes.config;
    let table = shapes.layer_weights(&layer);
    let touched = match layer.mlp {
        MlpKind::Moe => experts_touched(shapes, load.rows()),
        MlpKind::Dense => 0,
    };
    let weights = sum_weights(&table, formats.weights, touched);
    let routed_expert_bytes = table
        .iter()
        .filter(|w| w.class == WeightClass::RoutedExpert)
        .map(|w| w.bytes(formats.weights))
        .sum();

    let mla_token = mla_cache_bytes_per_token(c, formats.cache);
    let index_token = index_cache_bytes_per_token(c);
    let full = layer.indexer == IndexerKind::Full;
    let selected = load.context.min(c.index_topk as u64);
    let index_cache_read = if full {
        load.requests * load.context * index_token
    } else {
        0
    };
    let write_per_row = mla_token + if full { index_token } else { 0 };
    LaunchTraffic {
        kind,
        weights,
        routed_expert_bytes,
        experts_touched: touched,
        mla_cache_read: load.rows() * selected * mla_token,
        index_cache_read,
        cache_write: load.rows() * write_per_row,
    }
}

fn tail_traffic(shapes: &RankShapes, formats: Formats) -> LaunchTraffic {
    LaunchTraffic {
        kind: LaunchKind::Tail,
        weights: sum_weights(&shapes.tail_weights(), formats.weights, 0),
        routed_expert_bytes: 0,
        experts_touched: 0,
        mla_cache_read: 0,
        index_cache_read: 0,
        cache_write: 0,
    }
}

/// Weight bytes of a table with routed experts counted `routed_copies` times.
fn sum_weights(table: &[WeightSpec], format: WeightFormat, routed_copies: u64) -> WeightBytes {
    let mut bytes = WeightBytes::default();
    for w in table {
        let copies = match w.class {
            WeightClass::RoutedExpert => routed_copies,
            _ => w.count as u64,
        };
        bytes.add(w.class, w.bytes(format) * copies);
    }
    bytes
}

/// A whole step on one rank: each launch kind once with how many times it runs, in the order the
/// kinds first appear, then the tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepTraffic {
    pub launches: Vec<(LaunchTraffic, u64)>,
    /// Layer 0 gathers one bf16 embedding row per query row.
    pub embedding_read: u64,
}

impl StepTraffic {
    pub fn weight_bytes(&self) -> u64 {
        self.sum(|t| t.weights.total())
    }

    pub fn cache_bytes(&self) -> u64 {
        self.sum(LaunchTraffic::cache_bytes)
    }

    pub fn total_bytes(&self) -> u64 {
        self.sum(LaunchTraffic::total_bytes) + self.embedding_read
    }

    fn sum(&self, bytes: impl Fn(&LaunchTraffic) -> u64) -> u64 {
        self.launches.iter().map(|(t, n)| bytes(t) * n).sum()
    }
}

/// Bytes of one step over `plan` (from [`crate::ModelConfig::layer_plan`]).
pub fn step_traffic(
    shapes: &RankShapes,
    plan: &[LayerPlan],
    formats: Formats,
    load: Load,
) -> StepTraffic {
    let mut counts: Vec<(LaunchKind, u64)> = Vec::new();
    for layer in plan {
        let kind = LaunchKind::of(layer);
        match counts.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => counts.push((kind, 1)),
        }
    }
    counts.push((LaunchKind::Tail, 1));
    let launches = counts
        .into_iter()
        .map(|(kind, n)| (launch_traffic(shapes, kind, formats, load), n))
        .collect();
    let embedding = shapes.embedding();
    let row_bytes = embedding
        .storage
        .bytes(1, embedding.shape[1], formats.weights);
    StepTraffic {
        launches,
        embedding_read: load.rows() * row_bytes,
    }
}

/// Weight bytes one rank stores (every routed expert, the whole embedding), for memory budgets.
pub fn weight_storage(
    shapes: &RankShapes,
    plan: &[LayerPlan],
    format: WeightFormat,
) -> WeightBytes {
    let mut bytes = WeightBytes::default();
    let mut table: Vec<WeightSpec> = plan.iter().flat_map(|l| shapes.layer_weights(l)).collect();
    table.push(shapes.embedding());
    table.extend(
        shapes
            .tail_weights()
            .into_iter()
            // A tied lm_head is the embedding, already counted.
            .filter(|w| !(shapes.config.tie_word_embeddings && w.name == "lm_head.weight")),
    );
    for w in &table {
        bytes.add(w.class, w.total_bytes(format));
    }
    bytes
}

/// Time to move `bytes` at `bytes_per_s`, in microseconds: the launch can go no faster.
pub fn floor_us(bytes: u64, bytes_per_s: f64) -> f64 {
    bytes as f64 / bytes_per_s * 1e6
}
