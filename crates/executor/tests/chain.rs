//! The longest chain of hand-offs that `mono info` reports, on the launches the executor plans:
//! `ValidPlacement::hand_offs` (one pass in rank order) against a fixpoint over the placement's
//! edges in any order, which needs no ranks at all.

use executor::fused::layer::LaunchAt;
use executor::info_chain::{kind_chains, ChainRequest};
use mailbox::{Task, ValidPlacement};
use model::{CacheFormat, ModelConfig};
use std::collections::HashMap;

#[path = "support/plan_request.rs"]
mod plan_request;
use plan_request::request;

fn reference_hand_offs(p: &ValidPlacement) -> u32 {
    fixpoint(p, true)
}

/// Each task's hand-offs before it ends, relaxed until nothing moves: after the task before it on
/// its CTA (no hand-off), one after each writer of a box it waits on that is not a gang peer, and
/// one after each peer's own start (unless `peers` is false: the negative control). The longest is
/// the chain.
fn fixpoint(p: &ValidPlacement, peers: bool) -> u32 {
    let lists = p.placement().lists();
    let mut writer: HashMap<u64, (usize, usize)> = HashMap::new();
    for (c, list) in lists.iter().enumerate() {
        for (i, t) in list.iter().enumerate() {
            for b in t.out.boxes() {
                writer.insert(b, (c, i));
            }
        }
    }
    let waited = |t: &Task| -> Vec<(usize, usize)> {
        t.inputs()
            .iter()
            .flat_map(|r| r.boxes())
            .filter_map(|b| writer.get(&b).copied())
            .collect()
    };
    let mut start: Vec<Vec<u32>> = lists.iter().map(|l| vec![0; l.len()]).collect();
    let mut end = start.clone();
    loop {
        let mut moved = false;
        for (c, list) in lists.iter().enumerate() {
            for (i, t) in list.iter().enumerate() {
                let mut s = if i > 0 { end[c][i - 1] } else { 0 };
                let mut e = 0;
                for (wc, wi) in waited(t) {
                    if lists[wc][wi].order == t.order {
                        if peers {
                            e = e.max(start[wc][wi] + 1);
                        }
                    } else {
                        s = s.max(end[wc][wi] + 1);
                    }
                }
                let e = e.max(s);
                if s != start[c][i] || e != end[c][i] {
                    start[c][i] = s;
                    end[c][i] = e;
                    moved = true;
                }
            }
        }
        if !moved {
            break;
        }
    }
    end.iter().flatten().copied().max().unwrap_or(0)
}

fn check_every_kind(req: &ChainRequest) {
    let chains = kind_chains(req).unwrap();
    assert!(chains.iter().any(|c| c.at == LaunchAt::Tail), "{chains:?}");
    for c in &chains {
        let placement = executor::info_chain::planned(req, c.at).unwrap();
        let want = reference_hand_offs(&placement);
        assert_eq!(c.hand_offs, want, "{:?} at {:?}", c.kind, c.at);
        assert!(c.hand_offs > 0, "{:?}: a layer hands work on", c.kind);
    }
}

#[test]
fn glm_5_2_tp8_chains_match_the_fixpoint() {
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    for rows in [1, 4] {
        check_every_kind(&request(&cfg, 8, rows, 132, CacheFormat::Fp8));
    }
}

#[test]
fn tiny_chains_match_the_fixpoint() {
    let cfg = ModelConfig::preset("tiny").unwrap();
    for rows in [1, 4] {
        check_every_kind(&request(&cfg, 1, rows, 16, CacheFormat::Bf16));
    }
}

#[test]
fn the_comparison_fails_without_the_peers_rule() {
    // Negative control: a count that forgets that gang peers (a routed expert's members) hand
    // over to each other differs from the reference on some launch the executor plans. (Leaving
    // out the CTA's order changes no count of these plans: their longest chains run through
    // boxes. `crates/mailbox/tests/chain.rs` has a placement where it matters.)
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let mut differs = false;
    for rows in [1, 4] {
        let req = request(&cfg, 8, rows, 132, CacheFormat::Fp8);
        for c in kind_chains(&req).unwrap() {
            let placement = executor::info_chain::planned(&req, c.at).unwrap();
            differs |= fixpoint(&placement, false) != c.hand_offs;
        }
    }
    assert!(
        differs,
        "without the peers' hand-off every count still agreed"
    );
}
