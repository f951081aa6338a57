//! The step's host-side layout math, property-tested: where a rank's weights lie (every published
//! tensor placed once, as the rank's rows or columns of the whole tensor, in disjoint aligned
//! ranges of the arena) and the step inputs' cache slots and greedy feed.

use std::collections::HashMap;

use executor::step::weights::plan::{Form, WeightPlan, ALIGN};
use executor::step::{Batch, HostRows, RequestInput};
use model::weights::checkpoint_tensors;
use model::weights::packed::Pairing;
use model::{ModelConfig, WeightFormat, SUPPORTED_TP};
use proptest::prelude::*;

fn check_plan(
    preset: &str,
    tp: usize,
    rank: usize,
    format: WeightFormat,
) -> Result<(), TestCaseError> {
    let cfg = ModelConfig::preset(preset).unwrap();
    let plan = match WeightPlan::new(&cfg, tp, rank, format) {
        Ok(plan) => plan,
        Err(e) => {
            // Only FP8 shards off the scale blocks are refused, and by name.
            prop_assert!(format == WeightFormat::Fp8, "{preset} TP {tp}: {e}");
            prop_assert!(e.to_string().contains("scale blocks"), "{e}");
            return Ok(());
        }
    };
    let whole: HashMap<String, Vec<usize>> = checkpoint_tensors(&cfg)
        .unwrap()
        .into_iter()
        .map(|s| (s.name, s.shape))
        .collect();
    let mut seen = 0;
    let mut ranges = Vec::new();
    for t in &plan.tensors {
        ranges.push((t.offset, t.offset + t.bytes));
        if let Some((at, n)) = t.scales {
            ranges.push((at, at + 4 * n));
        }
        if let Form::Packed(layout) = t.form {
            prop_assert_eq!(layout.pairing == Pairing::GateUp, t.sources.len() == 2);
            prop_assert_eq!(layout.bytes(), t.bytes);
        }
        for s in &t.sources {
            seen += 1;
            let full = whole.get(&s.name).expect("a published name");
            prop_assert_eq!(full, &s.full_shape);
            prop_assert_eq!((s.rows, s.cols), t.shape());
            let (full_rows, full_cols) = (full[0], s.full_cols());
            // Split rows or columns by TP at the rank's index, or whole.
            prop_assert!(
                s.rows == full_rows || (s.rows * tp == full_rows && s.row0 == rank * s.rows)
            );
            prop_assert!(
                s.cols == full_cols || (s.cols * tp == full_cols && s.col0 == rank * s.cols)
            );
            prop_assert!(s.rows == full_rows || s.cols == full_cols);
        }
    }
    prop_assert_eq!(seen, whole.len());
    ranges.sort_unstable();
    prop_assert!(ranges.iter().all(|r| r.0 % ALIGN == 0));
    prop_assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0));
    prop_assert!(ranges.last().unwrap().1 <= plan.bytes);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn a_ranks_weights_are_each_tensor_once_in_disjoint_ranges(
        preset in prop::sample::select(vec!["tiny", "glm-5", "glm-5.2"]),
        tp_index in 0..SUPPORTED_TP.len(),
        rank_seed in 0usize..8,
        fp8 in any::<bool>(),
    ) {
        let tp = SUPPORTED_TP[tp_index];
        let format = if fp8 { WeightFormat::Fp8 } else { WeightFormat::Bf16 };
        check_plan(preset, tp, rank_seed % tp, format)?;
    }

    #[test]
    fn slots_follow_the_page_table_and_the_feed_moves_every_row_on(
        requests in prop::collection::vec((1u32..5, 0u32..900), 1..4),
        argmax_seed in any::<u32>(),
    ) {
        let page_tokens = 64;
        let batch = Batch {
            requests: requests
                .iter()
                .enumerate()
                .map(|(q, &(rows, first))| RequestInput {
                    tokens: (0..rows).collect(),
                    first_position: first,
                    // Enough pages for this step and the next, numbered apart per request.
                    pages: (0..(first + 2 * rows) / page_tokens + 1).map(|p| 100 * q as u32 + p).collect(),
                })
                .collect(),
            page_tokens,
            pages_per_request: 40,
        };
        let h = HostRows::new(&batch).unwrap();
        let argmax: Vec<i32> = (0..h.tokens.len() as i32).map(|i| i ^ argmax_seed as i32).collect();
        let next = h.fed(&argmax, &batch);
        for r in 0..h.tokens.len() {
            let q = h.row_request[r] as usize;
            let rows = requests[q].0 as i32;
            for (rows_of, p) in [(&h, h.positions[r]), (&next, next.positions[r])] {
                let page = batch.requests[q].pages[(p as u32 / page_tokens) as usize] as i32;
                prop_assert_eq!(rows_of.slots[r], page * page_tokens as i32 + p % page_tokens as i32);
            }
            prop_assert_eq!(next.positions[r], h.positions[r] + rows);
            let last = h.request_first[q] + rows - 1;
            prop_assert_eq!(next.tokens[r], argmax[last as usize]);
        }
    }
}
