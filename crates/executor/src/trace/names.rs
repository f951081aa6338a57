//! Every task of a step's launch in words, for traces: its stage and kind ("linear tiles", "mla
//! split"), and what it works on, from its descriptor's arguments and the launch's plan (which
//! matrix a linear task's tiles are of, which row or slice).

use crate::fused::layer::{LayerPlan, MatrixSource};
use mailbox::{Stage, Task, STAGE_SHIFT};
use mla::layout::{MlaKind, NormOf};

/// The legend's name of a kind word: its stage and own kind in words.
pub fn kind_label(kind: u32) -> String {
    let own = kind & ((1 << STAGE_SHIFT) - 1);
    let Some(stage) = Stage::from_bits(kind >> STAGE_SHIFT) else {
        return format!("kind {kind:#x}");
    };
    let what = match (stage, kind) {
        (Stage::Linear, linear::layout::KIND_TILES) => "tiles",
        (Stage::Linear, linear::layout::KIND_EXPERT_PAIR) => "expert pair",
        (Stage::Moe, moe::layout::KIND_ROUTE) => "route",
        (Stage::Moe, moe::layout::KIND_COMBINE) => "combine",
        (Stage::Head, head::layout::KIND_EMBED) => "embed",
        (Stage::Head, head::layout::KIND_NORM) => "norm",
        (Stage::Head, head::layout::KIND_ARGMAX) => "argmax",
        (Stage::Head, head::layout::KIND_PICK) => "pick",
        (Stage::Indexer, k) if k == indexer::layout::TaskKind::Key.kind() => "key",
        (Stage::Indexer, k) if k == indexer::layout::TaskKind::Query.kind() => "query",
        (Stage::Indexer, k) if k == indexer::layout::TaskKind::Score.kind() => "score",
        (Stage::Select, k) if k == select::layout::SelectKind::OneCta.kind() => "row",
        (Stage::Select, k) if k == select::layout::SelectKind::Registers.kind() => {
            "row in registers"
        }
        (Stage::Select, k) if k == select::layout::SelectKind::Slice.kind() => "slice",
        (Stage::Mla, k) => match mla_kind(k) {
            Some(MlaKind::CacheWrite) => "cache write",
            Some(MlaKind::Split) => "split",
            Some(MlaKind::Combine) => "combine",
            Some(MlaKind::Norm) => "norm",
            Some(MlaKind::RopeQ) => "rope q",
            Some(MlaKind::Slots) => "slots",
            None => return format!("{} {own}", stage.name()),
        },
        _ => return format!("{} {own}", stage.name()),
    };
    format!("{} {what}", stage.name())
}

fn mla_kind(kind: u32) -> Option<MlaKind> {
    [
        MlaKind::CacheWrite,
        MlaKind::Split,
        MlaKind::Combine,
        MlaKind::Norm,
        MlaKind::RopeQ,
        MlaKind::Slots,
    ]
    .into_iter()
    .find(|k| k.kind() == kind)
}

/// A launch's matrices by index, named short ("q_b_proj", "W_UK head 3"), for naming its tasks.
pub struct TaskNames {
    matrices: Vec<(u32, String)>,
}

impl TaskNames {
    pub fn new(plan: &LayerPlan) -> Self {
        TaskNames {
            matrices: plan
                .matrices
                .iter()
                .map(|m| (m.index, matrix_name(&m.source)))
                .collect(),
        }
    }

    fn matrix(&self, index: u32) -> String {
        self.matrices
            .iter()
            .find(|m| m.0 == index)
            .map_or_else(|| format!("matrix {index}"), |m| m.1.clone())
    }

    /// `task` in words: its kind's label and what it works on.
    pub fn task(&self, task: &Task) -> String {
        let label = kind_label(task.kind);
        let [a, b, c] = task.args;
        let range = |first: u32, count: u32| match count {
            1 => format!("{first}"),
            _ => format!("{first}..{}", first + count),
        };
        let what = match task.kind {
            linear::layout::KIND_TILES => {
                return format!("linear {} tiles {}", self.matrix(a), range(b, c));
            }
            linear::layout::KIND_EXPERT_PAIR => {
                let (up, down) = (linear::layout::pair_range(b), linear::layout::pair_range(c));
                return format!(
                    "moe expert slot {} gate/up tiles {}, down tiles {}",
                    a >> 16,
                    range(up.first, up.count),
                    range(down.first, down.count)
                );
            }
            moe::layout::KIND_COMBINE => format!("columns {}", range(a, b)),
            k if k == indexer::layout::TaskKind::Score.kind() => format!("runs {}", range(a, b)),
            k if k == indexer::layout::TaskKind::Key.kind()
                || k == indexer::layout::TaskKind::Query.kind() =>
            {
                format!("row {a}")
            }
            k if k == select::layout::SelectKind::Slice.kind() => {
                format!("row {a} slice {} of {}", c & 0xffff, c >> 16)
            }
            k if k >> STAGE_SHIFT == Stage::Select as u32 => format!("row {a}"),
            k if k == MlaKind::CacheWrite.kind() => format!("row {a} slot {b}"),
            k if k == MlaKind::Split.kind() => {
                format!("rows {} split {}", range(a, b & 0x7f), b >> 8)
            }
            k if k == MlaKind::Norm.kind() => {
                let of = match c {
                    x if x == NormOf::Hidden as u32 => "hidden",
                    x if x == NormOf::QLatent as u32 => "q latent",
                    x if x == NormOf::KvLatent as u32 => "kv latent",
                    _ => "rows",
                };
                format!("{of} rows {}", range(a, b))
            }
            k if k == MlaKind::Combine.kind() => format!("rows from {a}, {b} splits"),
            _ => return label,
        };
        format!("{label} {what}")
    }
}

/// A matrix's tensor without the layer's prefix and the `.weight` suffix.
fn matrix_name(source: &MatrixSource) -> String {
    let short = |t: &str| {
        let t = t.strip_suffix(".weight").unwrap_or(t);
        let t = match t.strip_prefix("model.layers.") {
            Some(rest) => rest.split_once('.').map_or(rest, |(_, r)| r),
            None => t.strip_prefix("model.").unwrap_or(t),
        };
        t.strip_prefix("self_attn.")
            .unwrap_or(t)
            .replace("mlp.shared_experts.", "shared ")
            .replace("mlp.", "")
    };
    match source {
        MatrixSource::Tensor(t) => short(t),
        MatrixSource::Columns { tensor, col0, .. } => format!("{} cols {col0}", short(tensor)),
        MatrixSource::UkTransposed { head, .. } => format!("W_UK head {head}"),
        MatrixSource::Uv { head, .. } => format!("W_UV head {head}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_matrices_read_as_words() {
        assert_eq!(kind_label(MlaKind::Split.kind()), "mla split");
        assert_eq!(kind_label(moe::layout::KIND_ROUTE), "moe route");
        assert_eq!(kind_label(linear::layout::KIND_TILES), "linear tiles");
        assert_eq!(kind_label(0x7700), "kind 0x7700");
        let m = |s: &str| matrix_name(&MatrixSource::Tensor(s.into()));
        assert_eq!(m("model.layers.3.self_attn.q_b_proj.weight"), "q_b_proj");
        assert_eq!(
            m("model.layers.4.mlp.shared_experts.down_proj.weight"),
            "shared down_proj"
        );
        assert_eq!(m("lm_head.weight"), "lm_head");
        let names = TaskNames {
            matrices: vec![(2, "q_b_proj".into())],
        };
        let tiles = Task::new(
            linear::layout::KIND_TILES,
            0,
            Default::default(),
            &[],
            [2, 3, 1],
        );
        assert_eq!(names.task(&tiles.unwrap()), "linear q_b_proj tiles 3");
        let expert = linear::layout::expert_arg(moe::layout::BANK_GATE_UP, 17).unwrap();
        let run = |first, count| {
            linear::layout::pair_range_arg(linear::layout::TileRange { first, count }).unwrap()
        };
        let task = Task::new(
            linear::layout::KIND_EXPERT_PAIR,
            0,
            Default::default(),
            &[],
            [expert, run(0, 4), run(24, 1)],
        );
        assert_eq!(
            names.task(&task.unwrap()),
            "moe expert slot 17 gate/up tiles 0..4, down tiles 24"
        );
    }
}
