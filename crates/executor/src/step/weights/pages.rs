//! How many memory pages of the arena a step's weights lie in: each page a link reads needs its
//! translation, and a step touches its pages once each, far apart in a rank's arena. Set beside
//! what the TLBs keep (`cargo bench -p device --bench pages`).

use std::collections::BTreeMap;

use super::plan::WeightPlan;

/// The GPU's large page (2 MB), in which device allocations of this size are mapped.
pub const PAGE_BYTES: usize = 2 << 20;

/// The pages of a step's weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepPages {
    /// Pages of every weight a step reads whole (all but the routed experts and the embedding,
    /// of which a step reads one row a token).
    pub whole: usize,
    /// Pages of one routed expert (its gate/up, its down and their scales), the mean over the
    /// first MoE layer's experts.
    pub per_expert: f64,
    /// MoE layers.
    pub moe_layers: usize,
}

impl StepPages {
    /// The pages of a step whose MoE layers each touch `experts` routed experts.
    pub fn total(&self, experts: u64) -> f64 {
        self.whole as f64 + self.per_expert * experts as f64 * self.moe_layers as f64
    }
}

/// Distinct pages of `page` bytes that the byte ranges (offset, length) lie in.
pub fn distinct_pages(ranges: impl IntoIterator<Item = (usize, usize)>, page: usize) -> usize {
    let mut pages: Vec<(usize, usize)> = ranges
        .into_iter()
        .filter(|&(_, len)| len > 0)
        .map(|(at, len)| (at / page, (at + len - 1) / page))
        .collect();
    pages.sort_unstable();
    let mut count = 0;
    let mut next = 0; // the first page not yet counted
    for (first, last) in pages {
        let from = first.max(next);
        if last >= from {
            count += last - from + 1;
            next = last + 1;
        }
    }
    count
}

/// A routed expert's tensors: `model.layers.L.mlp.experts.E.` names them.
fn expert_of(name: &str) -> Option<(&str, &str)> {
    let (layer, rest) = name.split_once(".mlp.experts.")?;
    let (expert, _) = rest.split_once('.')?;
    Some((layer, expert))
}

impl WeightPlan {
    /// The pages of [`PAGE_BYTES`] a step's weights lie in.
    pub fn step_pages(&self) -> StepPages {
        let ranges = |t: &super::DeviceTensor| {
            std::iter::once((t.offset, t.bytes)).chain(t.scales.map(|(at, n)| (at, 4 * n)))
        };
        let whole = distinct_pages(
            self.tensors
                .iter()
                .filter(|t| expert_of(&t.name).is_none() && t.name != "model.embed_tokens.weight")
                .flat_map(ranges),
            PAGE_BYTES,
        );
        // An expert's gate/up and down lie in banks of their own, so its tensors are apart in
        // the plan: gathered by (layer, expert).
        let mut experts: BTreeMap<(&str, &str), Vec<(usize, usize)>> = BTreeMap::new();
        let mut layers: Vec<&str> = Vec::new();
        for t in &self.tensors {
            let Some((layer, expert)) = expert_of(&t.name) else {
                continue;
            };
            if !layers.contains(&layer) {
                layers.push(layer);
            }
            experts
                .entry((layer, expert))
                .or_default()
                .extend(ranges(t));
        }
        let first: Vec<usize> = experts
            .iter()
            .filter(|((layer, _), _)| Some(layer) == layers.first())
            .map(|(_, r)| distinct_pages(r.iter().copied(), PAGE_BYTES))
            .collect();
        StepPages {
            whole,
            per_expert: match first.len() {
                0 => 0.0,
                n => first.iter().sum::<usize>() as f64 / n as f64,
            },
            moe_layers: layers.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::{ModelConfig, WeightFormat};

    /// Every page a range touches, counted once however many ranges share it, against a count
    /// of each byte's page.
    #[test]
    fn distinct_pages_counts_each_page_once() {
        let page = 16;
        let cases: Vec<Vec<(usize, usize)>> = vec![
            vec![],
            vec![(0, 0)],
            vec![(0, 1)],
            vec![(15, 2)],
            vec![(0, 16), (16, 16)],
            vec![(3, 40), (10, 5), (60, 1), (47, 1)],
            vec![(100, 3), (0, 200), (500, 1)],
        ];
        for ranges in cases {
            let mut byte_pages: Vec<usize> = ranges
                .iter()
                .flat_map(|&(at, len)| (at..at + len).map(|b| b / page))
                .collect();
            byte_pages.sort_unstable();
            byte_pages.dedup();
            assert_eq!(
                distinct_pages(ranges.iter().copied(), page),
                byte_pages.len(),
                "{ranges:?}"
            );
        }
        // Negative control: pages counted a range at a time count a shared page twice.
        let shared = [(0, 8), (8, 8)];
        let one_by_one: usize = shared.iter().map(|&r| distinct_pages([r], page)).sum();
        assert_ne!(one_by_one, distinct_pages(shared, page));
    }

    /// GLM-5.2 at TP8: every MoE layer's experts are found, an expert's ~4.7 MB (two banks) lie
    /// in three to five pages, and the weights read whole lie in no fewer pages than their bytes fill.
    #[test]
    fn a_glm52_rank_step_pages() {
        let cfg = ModelConfig::preset("glm-5.2").unwrap();
        let plan = WeightPlan::new(&cfg, 8, 0, WeightFormat::Fp8).unwrap();
        let pages = plan.step_pages();
        let moe = cfg
            .layer_plan()
            .unwrap()
            .iter()
            .filter(|l| matches!(l.mlp, model::MlpKind::Moe))
            .count();
        assert_eq!(pages.moe_layers, moe);
        assert!((3.0..=5.0).contains(&pages.per_expert), "{pages:?}");
        let whole_bytes: usize = plan
            .tensors
            .iter()
            .filter(|t| expert_of(&t.name).is_none() && t.name != "model.embed_tokens.weight")
            .map(|t| t.bytes)
            .sum();
        assert!(pages.whole >= whole_bytes / PAGE_BYTES, "{pages:?}");
        assert!(pages.whole <= whole_bytes / PAGE_BYTES * 2, "{pages:?}");
    }
}
