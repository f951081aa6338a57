//! The MoE half's fused launch on the host: its task graph at a GLM-5.2 TP-8 rank's shapes (1, 4
//! and 16 rows over 132 CTAs) passes the placement's rules and the hand-off rules, and the
//! hand-off check fails when a wait is taken away (a pair task that does not wait on its slot's
//! box or on one of its gang's other members, a combine that does not wait on the gangs); the
//! generated source holds both stages' decoders. The kernel itself runs in `crates/moe/tests/host_emulation.rs` (CPU threads) and
//! `tests/gpu_moe.rs` (the H200).

use executor::fused::moe::{moe_source, MoeBuild, MoeGraph, MoeGraphError};
use executor::fused::CtaShape;
use linear::layout::{KIND_EXPERT_PAIR, PAIR_PEERS_AFTER, PAIR_PEERS_BEFORE};
use mailbox::layout::BoxRange;
use mailbox::Task;
use model::{ModelConfig, WeightFormat};
use moe::layout::{MoeStart, KIND_COMBINE, KIND_ROUTE};

fn graph(rows: usize) -> MoeGraph {
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let build = MoeBuild { ctas: 132, tp: 8 };
    MoeGraph::new(&cfg, rows, WeightFormat::Fp8, build, &MoeStart::default()).unwrap()
}

#[test]
fn rank_shapes_place_and_hand_off() {
    for rows in [1, 4, 16] {
        let g = graph(rows);
        let tasks: Vec<Task> = g.placement.placement().tasks().map(|(_, t)| *t).collect();
        let count = |kind| tasks.iter().filter(|t| t.kind == kind).count();
        assert_eq!(count(KIND_ROUTE), 1);
        assert_eq!(g.plan.experts.len(), (rows * 8).min(256));
        assert!(count(KIND_COMBINE) >= 1);
        eprintln!(
            "{rows} rows: {} tasks, {} slots, {} boxes",
            tasks.len(),
            g.plan.experts.len(),
            g.plan.end_box
        );
    }
}

/// `g`'s placement with the first task of `kind` matching `pick` rewritten by `change`.
fn without_wait(
    g: &MoeGraph,
    pick: &dyn Fn(&Task) -> bool,
    change: &dyn Fn(&Task) -> Vec<BoxRange>,
) -> Result<(), MoeGraphError> {
    let mut placement = g.placement.placement().clone();
    let task = placement
        .lists_mut()
        .iter_mut()
        .flatten()
        .find(|t| pick(t))
        .unwrap();
    *task = Task::new(task.kind, task.order, task.out, &change(task), task.args).unwrap();
    g.check_handoff(&placement)
}

#[test]
fn a_missing_wait_fails_the_hand_off_check() {
    let g = graph(4);
    let pair = |t: &Task| t.kind == KIND_EXPERT_PAIR;
    let err = without_wait(&g, &pair, &|t| t.inputs()[1..].to_vec()).unwrap_err();
    eprintln!("{err}");
    // The first member of a gang, without one of its peers (the last line after it), or any.
    let peer_gone = |t: &Task| {
        let mut inputs = t.inputs().to_vec();
        inputs[PAIR_PEERS_AFTER].len -= mailbox::layout::BOXES_PER_LINE;
        inputs
    };
    let err = without_wait(&g, &pair, &peer_gone).unwrap_err();
    eprintln!("{err}");
    let err = without_wait(&g, &pair, &|t| t.inputs()[..PAIR_PEERS_BEFORE].to_vec()).unwrap_err();
    eprintln!("{err}");
    let combine = |t: &Task| t.kind == KIND_COMBINE;
    let err = without_wait(&g, &combine, &|t| t.inputs()[..2].to_vec()).unwrap_err();
    eprintln!("{err}");
    g.check_handoff(g.placement.placement()).unwrap();
}

#[test]
fn the_source_switches_over_both_stages() {
    let shape = CtaShape::for_target("sm_90a").unwrap();
    let source = moe_source(shape, Default::default()).unwrap();
    let text = source.flatten().unwrap();
    for needle in [
        "case MBX_STAGE_LINEAR: return lin_decode(",
        "case MBX_STAGE_MOE: return moe_decode(",
        "lin_args a0, moe_args a1",
    ] {
        assert!(text.contains(needle), "{needle}");
    }
}

/// The MoE part after a part that produces its input rows (two tasks a line each, standing in for
/// the attention half): one checked launch, its tasks waiting on the producers where they read x,
/// the hand-off rules holding, its output ready on the combine's boxes.
#[test]
fn the_moe_part_composes_after_its_producer() {
    use executor::fused::graph::{Handoff, LaunchGraph};
    use executor::fused::moe::{check_moe_handoff, moe_part};
    use moe::layout::MoeShape;
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let shape = MoeShape::new(&cfg, 8, 4, WeightFormat::Fp8).unwrap();
    let mut g = LaunchGraph::new(132).unwrap();
    let done = g.completion("attn_done", 2).unwrap();
    let rows = g.arena("hidden", 2 * 4 * 6144).unwrap();
    for i in 0..2 {
        let (rank, cta) = (g.rank(), g.next_cta());
        let kind = Task::kind_of(mailbox::Stage::Synthetic, 1);
        let t = Task::new(kind, rank, done.line(i).unwrap(), &[], [0; 3]).unwrap();
        g.push(cta, t).unwrap();
    }
    let x = Handoff {
        data: rows,
        ready: done.all(),
    };
    let (out, part) = moe_part(&mut g, &shape, x, x).unwrap();
    assert_eq!(out.ready, part.plan.combine);
    assert_eq!(part.first_matrix, 0);
    let launch = g.finish().unwrap();
    check_moe_handoff(&part.plan, launch.placement.placement()).unwrap();
    let readers = launch
        .placement
        .placement()
        .tasks()
        .filter(|(_, t)| t.inputs().contains(&done.all()))
        .count();
    // The router's tasks, the shared gate/up's and every pair task (a line each) read x.
    let expected = part.plan.router.len / 16
        + part.plan.shared_gate_up.len / 16
        + part.plan.experts.iter().map(|r| r.len / 16).sum::<u32>();
    assert_eq!(readers as u32, expected);
    assert!(launch.arena.get("moe_out").is_some());
}
