//! Where the executor puts the attention's splits in the launches it plans: every CTA holds as
//! many as any other, give or take one. Every split of a launch waits on the same slot lists and
//! queries, so a CTA that holds two runs its second a whole split after the others end, and the
//! combines wait on all of them. Placed by task count alone, five CTAs of a glm-5.2 TP8
//! full-indexer launch at 4 rows would hold two (CTAs with fewer earlier tasks than the rest,
//! though all of those end before the splits' inputs arrive).

use executor::fused::layer::LaunchAt;
use executor::info_chain::{kind_chains, planned, ChainRequest};
use mailbox::Task;
use mla::layout::MlaKind;
use model::{CacheFormat, ModelConfig};

#[path = "support/plan_request.rs"]
mod plan_request;
use plan_request::request;

fn splits_on(list: &[Task]) -> usize {
    list.iter()
        .filter(|t| t.kind == MlaKind::Split.kind())
        .count()
}

/// None where every CTA holds as many splits as any other, give or take one; else the CTAs that
/// hold the most and the fewest.
fn uneven_splits(lists: &[Vec<Task>]) -> Option<String> {
    let counts: Vec<usize> = lists.iter().map(|l| splits_on(l)).collect();
    let most = (0..counts.len()).max_by_key(|&c| counts[c])?;
    let fewest = (0..counts.len()).min_by_key(|&c| counts[c])?;
    (counts[most] > counts[fewest] + 1).then(|| {
        format!(
            "CTA {most} holds {} splits, CTA {fewest} {}",
            counts[most], counts[fewest]
        )
    })
}

/// Each layer kind's first launch, with its placement's task lists.
fn layer_launches(req: &ChainRequest) -> Vec<(LaunchAt, Vec<Vec<Task>>)> {
    kind_chains(req)
        .unwrap()
        .into_iter()
        .filter(|c| c.at != LaunchAt::Tail)
        .map(|c| {
            let p = planned(req, c.at).unwrap();
            (c.at, p.placement().lists().to_vec())
        })
        .collect()
}

fn check_spread(req: &ChainRequest) {
    let launches = layer_launches(req);
    assert!(!launches.is_empty());
    for (at, lists) in launches {
        let splits: usize = lists.iter().map(|l| splits_on(l)).sum();
        assert!(splits > 0, "{at:?}: a layer launch attends");
        if let Some(why) = uneven_splits(&lists) {
            panic!(
                "{at:?}, {} rows on {} CTAs, {splits} splits: {why}",
                req.load.rows_per_request, req.ctas
            );
        }
    }
}

#[test]
fn glm_5_2_tp8_splits_spread_over_the_grid() {
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    for rows in [1, 4, 16] {
        check_spread(&request(&cfg, 8, rows, 132, CacheFormat::Fp8));
    }
    // More splits than CTAs (4 rows: 128 splits on 60): two or three a CTA, none with four.
    check_spread(&request(&cfg, 8, 4, 60, CacheFormat::Fp8));
}

#[test]
fn tiny_splits_spread_over_the_grid() {
    let cfg = ModelConfig::preset("tiny").unwrap();
    for (rows, ctas) in [(1, 16), (4, 16), (1, 4), (4, 12)] {
        check_spread(&request(&cfg, 1, rows, ctas, CacheFormat::Bf16));
    }
}

#[test]
fn a_second_split_on_one_cta_is_caught() {
    // Negative control: a planned launch with one split moved onto a CTA that already holds one,
    // which leaves a CTA with none.
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let req = request(&cfg, 8, 4, 132, CacheFormat::Fp8);
    let (at, mut lists) = layer_launches(&req).remove(0);
    assert!(uneven_splits(&lists).is_none(), "{at:?} as planned");
    let holders: Vec<usize> = (0..lists.len())
        .filter(|&c| splits_on(&lists[c]) == 1)
        .collect();
    let (from, to) = (holders[0], holders[1]);
    let i = lists[from]
        .iter()
        .position(|t| t.kind == MlaKind::Split.kind())
        .unwrap();
    let split = lists[from].remove(i);
    lists[to].push(split);
    let why = uneven_splits(&lists).expect("a CTA with two splits beside one with none");
    assert!(why.contains("holds 2 splits"), "{why}");
}
