//! Where every weight of one TP rank lives on the device: each published tensor's shard (its rows
//! or columns of the whole TP 1 tensor, as [`RankShapes`] splits it), the form a launch reads it in,
//! and its byte range in one arena, so that the whole rank is one allocation that either fits or
//! fails before anything is written.

use model::weights::packed::{PackedLayout, Pairing};
use model::{LayerPlan, ModelConfig, RankShapes, Storage, WeightFormat, WeightSpec};

use crate::step::{Result, StepError};

/// Byte alignment of every tensor in the arena (the widest vector load, and a cache line pair).
pub const ALIGN: usize = 256;
/// FP8 scale blocks are 128 x 128; FP8 shards must start on a block.
const BLOCK: usize = model::WEIGHT_BLOCK;

/// A rank's part of one published tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// The published name (`model.layers.3.mlp.experts.7.up_proj.weight`).
    pub name: String,
    /// The whole tensor's shape as the checkpoint stores it (`[n]` for vectors).
    pub full_shape: Vec<usize>,
    pub row0: usize,
    pub col0: usize,
    pub rows: usize,
    pub cols: usize,
}

impl Shard {
    /// Columns of the whole tensor (1 for vectors).
    pub fn full_cols(&self) -> usize {
        if self.full_shape.len() == 2 {
            self.full_shape[1]
        } else {
            1
        }
    }
}

/// How a device tensor's elements are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    /// E4M3 codes with fp32 scales.
    Fp8,
    Bf16,
    F32,
}

impl Element {
    pub fn bytes(self) -> usize {
        match self {
            Element::Fp8 => 1,
            Element::Bf16 => 2,
            Element::F32 => 4,
        }
    }
}

/// The layout a launch reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// The linear task's layout (`model::weights::packed`): FP8 scales packed `[tile][kb][half]`.
    Packed(PackedLayout),
    /// `[rows, cols]` row-major; FP8 scales as the checkpoint's `[rows/128, cols/128]` grid.
    RowMajor,
}

/// One tensor in the arena: one shard, or a gate/up pair packed together.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceTensor {
    /// The published name, or `...gate_up_proj.weight` for a gate/up pair.
    pub name: String,
    /// One shard, or gate then up.
    pub sources: Vec<Shard>,
    pub element: Element,
    pub form: Form,
    /// Byte offset of the elements in the arena, and their length.
    pub offset: usize,
    pub bytes: usize,
    /// Byte offset and count of the fp32 scales (FP8 only).
    pub scales: Option<(usize, usize)>,
}

impl DeviceTensor {
    /// Rows and columns of each source shard.
    pub fn shape(&self) -> (usize, usize) {
        (self.sources[0].rows, self.sources[0].cols)
    }

    /// Elements of the shard(s) in the checkpoint's terms (padding rows not counted).
    pub fn elements(&self) -> u64 {
        let (rows, cols) = self.shape();
        (rows * cols * self.sources.len()) as u64
    }
}

/// Every weight of one rank, placed in one arena.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightPlan {
    pub tp: usize,
    pub rank: usize,
    pub format: WeightFormat,
    pub tensors: Vec<DeviceTensor>,
    /// Bytes of the arena.
    pub bytes: usize,
}

impl WeightPlan {
    /// The plan of rank `rank` of `tp` for `cfg` in `format`. Fails on a config that does not
    /// shard, a rank outside the TP, or an FP8 shard that does not start on a 128 x 128 block.
    pub fn new(cfg: &ModelConfig, tp: usize, rank: usize, format: WeightFormat) -> Result<Self> {
        if rank >= tp {
            return Err(StepError::Invalid(format!("rank {rank} of TP {tp}")));
        }
        let rank_shapes = RankShapes::new(cfg, tp)?;
        let full_shapes = RankShapes::new(cfg, 1)?;
        let mut specs: Vec<(String, WeightSpec, WeightSpec)> = vec![(
            String::new(),
            rank_shapes.embedding(),
            full_shapes.embedding(),
        )];
        for layer in cfg.layer_plan()? {
            specs.extend(layer_specs(&rank_shapes, &full_shapes, &layer));
        }
        specs.extend(
            rank_shapes
                .tail_weights()
                .into_iter()
                .zip(full_shapes.tail_weights())
                .map(|(r, f)| (String::new(), r, f)),
        );
        let mut shards = Vec::new();
        for (prefix, here, whole) in &specs {
            for copy in 0..here.count {
                let name = format!("{prefix}{}", here.name.replace('*', &copy.to_string()));
                shards.push((shard(name, here, whole, rank)?, here.storage));
            }
        }
        let mut plan = WeightPlan {
            tp,
            rank,
            format,
            tensors: Vec::new(),
            bytes: 0,
        };
        let index: std::collections::HashMap<&str, usize> = shards
            .iter()
            .enumerate()
            .map(|(i, (s, _))| (s.name.as_str(), i))
            .collect();
        let mut taken = vec![false; shards.len()];
        for (i, (shard, storage)) in shards.iter().enumerate() {
            if taken[i] {
                continue;
            }
            let up = shard
                .name
                .strip_suffix("gate_proj.weight")
                .and_then(|prefix| index.get(format!("{prefix}up_proj.weight").as_str()));
            let mut sources = vec![shard.clone()];
            if let Some(&u) = up {
                sources.push(shards[u].0.clone());
                taken[u] = true;
            }
            plan.push(sources, element_of(*storage, format))?;
        }
        Ok(plan)
    }

    /// The tensor of published name `name` (a gate or up projection finds its pair).
    pub fn get(&self, name: &str) -> Option<&DeviceTensor> {
        self.tensors
            .iter()
            .find(|t| t.name == name || t.sources.iter().any(|s| s.name == name))
    }

    fn push(&mut self, sources: Vec<Shard>, element: Element) -> Result<()> {
        let first = &sources[0];
        let (rows, cols) = (first.rows, first.cols);
        let on_block = |start: usize, len: usize, whole: usize| {
            start % BLOCK == 0 && ((start + len) % BLOCK == 0 || start + len == whole)
        };
        let whole_rows = first.full_shape[0];
        let fp8_aligned =
            on_block(first.row0, rows, whole_rows) && on_block(first.col0, cols, first.full_cols());
        if element == Element::Fp8 && !fp8_aligned {
            return Err(StepError::Invalid(format!(
                "{}: this rank's FP8 shard (rows {}.., columns {}.., {rows} x {cols}) does not \
                 cover whole {BLOCK} x {BLOCK} scale blocks; use a smaller TP or bf16 weights",
                first.name, first.row0, first.col0
            )));
        }
        let is_matrix = first.full_shape.len() == 2 && first.name != "model.embed_tokens.weight";
        let pairing = if sources.len() == 2 {
            Pairing::GateUp
        } else {
            Pairing::Plain
        };
        let packed_format = match element {
            Element::Fp8 => Some(WeightFormat::Fp8),
            Element::Bf16 => Some(WeightFormat::Bf16),
            Element::F32 => None,
        };
        let packed = packed_format
            .filter(|_| is_matrix && cols % BLOCK == 0)
            .map(|f| PackedLayout::new(f, pairing, rows, cols))
            .transpose()?;
        let name = match pairing {
            Pairing::GateUp => first.name.replace("gate_proj", "gate_up_proj"),
            Pairing::Plain => first.name.clone(),
        };
        let (form, bytes, scales_len) = match packed {
            Some(layout) => (Form::Packed(layout), layout.bytes(), layout.scales_len()),
            None => {
                let grid = rows.div_ceil(BLOCK) * cols.div_ceil(BLOCK) * sources.len();
                let scales = if element == Element::Fp8 { grid } else { 0 };
                (
                    Form::RowMajor,
                    rows * cols * sources.len() * element.bytes(),
                    scales,
                )
            }
        };
        let offset = self.reserve(bytes);
        let scales = (scales_len > 0).then(|| (self.reserve(scales_len * 4), scales_len));
        self.tensors.push(DeviceTensor {
            name,
            sources,
            element,
            form,
            offset,
            bytes,
            scales,
        });
        Ok(())
    }

    fn reserve(&mut self, bytes: usize) -> usize {
        let at = self.bytes.next_multiple_of(ALIGN);
        self.bytes = at + bytes;
        at
    }

    /// The most FP8 block scales one source has (the generator's scratch).
    pub fn largest_scale_grid(&self) -> usize {
        self.tensors
            .iter()
            .filter(|t| t.element == Element::Fp8)
            .map(|t| {
                let (rows, cols) = t.shape();
                rows.div_ceil(BLOCK) * cols.div_ceil(BLOCK)
            })
            .max()
            .unwrap_or(0)
    }
}

fn layer_specs(
    rank: &RankShapes,
    full: &RankShapes,
    layer: &LayerPlan,
) -> Vec<(String, WeightSpec, WeightSpec)> {
    let prefix = format!("model.layers.{}.", layer.index);
    rank.layer_weights(layer)
        .into_iter()
        .zip(full.layer_weights(layer))
        .map(|(r, f)| (prefix.clone(), r, f))
        .collect()
}

/// Rank `rank`'s shard of a tensor whose rank shape is `here` and whole shape `whole`: the rows
/// or columns TP divides, at the rank's index.
fn shard(name: String, here: &WeightSpec, whole: &WeightSpec, rank: usize) -> Result<Shard> {
    let [rows, cols] = here.shape;
    let [full_rows, full_cols] = whole.shape;
    if full_rows % rows != 0 || full_cols % cols != 0 {
        return Err(StepError::Invalid(format!(
            "{name}: a rank's [{rows}, {cols}] does not divide the whole [{full_rows}, {full_cols}]"
        )));
    }
    let full_shape = if full_cols == 1 {
        vec![full_rows]
    } else {
        vec![full_rows, full_cols]
    };
    Ok(Shard {
        name,
        full_shape,
        row0: if rows < full_rows { rank * rows } else { 0 },
        col0: if cols < full_cols { rank * cols } else { 0 },
        rows,
        cols,
    })
}

fn element_of(storage: Storage, format: WeightFormat) -> Element {
    match (storage, format) {
        (Storage::Quantisable, WeightFormat::Fp8) => Element::Fp8,
        (Storage::F32, _) => Element::F32,
        _ => Element::Bf16,
    }
}
