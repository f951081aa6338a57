//! Layer launches (`fused::layer::LayerPlan`) planned for every launch kind at glm-5.2 TP8 (1 and
//! 4 rows, 8K and 128K contexts) and at the tiny preset, each checked three ways: the placement
//! rule (`LaunchGraph::finish`), the data dependencies through the arena (`check_dependencies`,
//! with negative controls: a query task or a Slots task without its wait is caught), and the MoE
//! part's own hand-offs; the step slices sit at the same offsets in every launch.

use executor::fused::front::FrontRequest;
use executor::fused::layer::check::{check_dependencies, DependencyError};
use executor::fused::layer::source::launch_kind;
use executor::fused::layer::{LaunchAt, LayerBuild, LayerPlan, StepDims, StepSlices};
use executor::fused::moe::check_moe_handoff;
use executor::fused::LaunchGraph;
use executor::step::check::lists::{check_lists, reference_lists, FrontOutputs};
use executor::step::check::without_cross_wait;
use mailbox::Stage;
use mla::layout::MlaKind;
use model::paging::pages_through;
use model::traffic::LaunchKind;
use model::{CacheFormat, ModelConfig, WeightFormat};
use proptest::prelude::*;

const CTAS: u32 = 132;

fn build(cfg: &ModelConfig, tp: usize, cache: CacheFormat) -> LayerBuild {
    LayerBuild {
        ctas: CTAS,
        tp,
        rank: 0,
        weights: WeightFormat::Fp8,
        cache,
        cache_pages: 8192,
        step: StepDims::new(cfg, 16, 4, 4096),
        union: 128,
        choice: executor::step::layer::step::split_choice(cfg),
    }
}

/// Requests of `rows` rows each at `contexts`, on consecutive pages.
fn requests(contexts: &[u32], rows: u32) -> Vec<FrontRequest> {
    let mut next = 0;
    contexts
        .iter()
        .map(|&context| {
            let pages = pages_through(context + rows - 1);
            let r = FrontRequest {
                context,
                rows,
                pages: (next..next + pages).collect(),
            };
            next += pages;
            r
        })
        .collect()
}

/// One launch of each kind of `cfg` (layer 0 apart: it has the embedding), and the tail.
fn one_of_each(cfg: &ModelConfig) -> Vec<LaunchAt> {
    let mut seen: Vec<(LaunchKind, bool)> = Vec::new();
    (0..cfg.num_hidden_layers)
        .map(LaunchAt::Layer)
        .chain([LaunchAt::Tail])
        .filter(|&at| {
            let key = (launch_kind(cfg, at).unwrap(), at == LaunchAt::Layer(0));
            let new = !seen.contains(&key);
            seen.push(key);
            new
        })
        .collect()
}

/// Every check of a planned launch.
fn check(cfg: &ModelConfig, p: &LayerPlan) {
    let placement = p.launch.placement.placement();
    check_dependencies(p, placement).unwrap_or_else(|e| panic!("{:?}: {e}", p.at));
    if let Some(moe) = &p.moe {
        check_moe_handoff(&moe.plan, placement).unwrap();
    }
    assert_eq!(p.matrices.len() as u32, p.launch.matrices);
    let stages: Vec<Stage> = placement
        .tasks()
        .map(|(_, t)| mailbox::Stage::from_bits(t.stage_bits()).unwrap())
        .fold(Vec::new(), |mut v, s| {
            if !v.contains(&s) {
                v.push(s);
            }
            v
        });
    for s in &stages {
        assert!(p.stages.contains(s), "{:?}: a {s:?} task", p.at);
    }
    match p.at {
        LaunchAt::Layer(i) => {
            let want = p.slices.rows_of(p.slices.hidden_out(i), p.rows);
            assert_eq!(p.out.data, want, "layer {i} writes the residual stream");
            let a = &p.attention.as_ref().unwrap().arena;
            assert_eq!(a.hidden, p.slices.hidden_in(i).offset);
            assert_eq!(
                [a.positions, a.new_slots, a.inv_freq, a.slot_lists],
                [
                    p.slices.positions.offset,
                    p.slices.new_slots.offset,
                    p.slices.inv_freq.offset,
                    p.slices.slot_lists.offset
                ]
            );
            let moe = p.kind == LaunchKind::MoeFull || p.kind == LaunchKind::MoeShared;
            assert_eq!(p.banks.len(), if moe { 2 } else { 0 });
            if moe {
                assert_eq!(p.banks[1].tensors.len(), cfg.n_routed_experts);
            }
        }
        LaunchAt::Tail => assert_eq!(p.matrices.len(), 1),
    }
}

#[test]
fn every_kind_plans_and_checks_at_glm_5_2_tp8() {
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let b = build(&cfg, 8, CacheFormat::Fp8);
    let launches = one_of_each(&cfg);
    let kinds: Vec<LaunchKind> = launches
        .iter()
        .map(|&at| launch_kind(&cfg, at).unwrap())
        .collect();
    for k in [
        LaunchKind::DenseFull,
        LaunchKind::MoeFull,
        LaunchKind::MoeShared,
        LaunchKind::Tail,
    ] {
        assert!(kinds.contains(&k), "glm-5.2 has a {k:?} launch");
    }
    for context in [8192, 131072] {
        for rows in [1, 4] {
            let reqs = requests(&[context], rows);
            let mut slices: Option<StepSlices> = None;
            for &at in &launches {
                let p = LayerPlan::plan(&cfg, at, &reqs, &b)
                    .unwrap_or_else(|e| panic!("{at:?} at {context} x {rows}: {e}"));
                check(&cfg, &p);
                let first = *slices.get_or_insert(p.slices);
                assert_eq!(p.slices, first, "{at:?}: the step slices moved");
                let s = p.slices;
                let fields = [
                    s.tokens,
                    s.positions,
                    s.new_slots,
                    s.inv_freq,
                    s.page_table,
                    s.slot_lists,
                    s.hidden[0],
                    s.hidden[1],
                ];
                for (i, (name, field)) in StepSlices::NAMES.iter().zip(fields).enumerate() {
                    assert_eq!(p.launch.arena.slices[i], (name.to_string(), field));
                }
            }
        }
    }
}

/// The tiny preset plans every kind with its own indexer (8 heads of 64, k = 16: the plan takes
/// any widths; whether the indexer's kernels build for them is `layer_source`'s matter), and so
/// does the same model with GLM-5's indexer widths and k (32 x 128, 2048).
#[test]
fn every_kind_plans_and_checks_at_the_tiny_preset() {
    let tiny = ModelConfig::preset("tiny").unwrap();
    let b = build(&tiny, 1, CacheFormat::Bf16);
    for at in one_of_each(&tiny) {
        for reqs in [requests(&[40, 100], 2), requests(&[3], 1)] {
            let p = LayerPlan::plan(&tiny, at, &reqs, &b).unwrap_or_else(|e| panic!("{at:?}: {e}"));
            check(&tiny, &p);
        }
    }
    let wide = wide_tiny();
    let b = build(&wide, 1, CacheFormat::Bf16);
    for at in one_of_each(&wide) {
        for reqs in [requests(&[40], 1), requests(&[40, 3000], 4)] {
            let p = LayerPlan::plan(&wide, at, &reqs, &b).unwrap_or_else(|e| panic!("{at:?}: {e}"));
            check(&wide, &p);
        }
    }
}

/// The tiny preset with GLM-5's indexer widths and k.
fn wide_tiny() -> ModelConfig {
    ModelConfig {
        index_n_heads: 32,
        index_head_dim: 128,
        index_topk: 2048,
        ..ModelConfig::preset("tiny").unwrap()
    }
}

/// A launch whose plan lost one task's waits (`step::check::without_cross_wait`, which the
/// placement rule alone still passes: a task that waits on less breaks no rule of boxes) is
/// refused by the dependency checker, naming the reader.
#[test]
fn a_task_missing_its_wait_is_caught() {
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let b = build(&cfg, 8, CacheFormat::Fp8);
    let at = one_of_each(&cfg)
        .into_iter()
        .find(|&at| launch_kind(&cfg, at).unwrap() == LaunchKind::MoeFull)
        .unwrap();
    let p = LayerPlan::plan(&cfg, at, &requests(&[8192], 4), &b).unwrap();
    check_dependencies(&p, p.launch.placement.placement()).unwrap();
    // The query task: each key task shares its CTA with one of the wk tasks it waits on, so
    // only part of its wait crosses CTAs; the query's producers (wq_b, the gates) run elsewhere.
    let query = indexer::layout::TaskKind::Query.kind();
    let slots = MlaKind::Slots.kind();
    for (what, kind) in [("an index query task", query), ("a Slots task", slots)] {
        let mut broken = p.clone();
        let removed = without_cross_wait(&mut broken, kind).unwrap();
        assert_eq!(removed.kind, kind);
        match check_dependencies(&broken, broken.launch.placement.placement()) {
            Err(DependencyError::Missed { reader_kind, .. }) => assert_eq!(reader_kind, kind),
            other => panic!("{what} without its wait ({removed}): {other:?}"),
        }
    }
}

/// A full-indexer launch's lists against the reference select of its scores
/// (`step::check::lists`): the reference's own lists pass; one changed slot, and one row's best
/// score made its worst, are each caught at their row.
#[test]
fn selected_slots_are_checked_against_the_reference_select_of_the_scores() {
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let b = build(&cfg, 8, CacheFormat::Fp8);
    let at = one_of_each(&cfg)
        .into_iter()
        .find(|&at| launch_kind(&cfg, at).unwrap() == LaunchKind::MoeFull)
        .unwrap();
    let p = LayerPlan::plan(&cfg, at, &requests(&[8192, 3000], 2), &b).unwrap();
    let front = &p.index.as_ref().unwrap().front;
    let stride = front.plan.stride as usize;
    let mut scores = vec![f32::NEG_INFINITY; p.rows as usize * stride];
    for (r, &len) in front.lens.iter().enumerate() {
        for (i, s) in scores[r * stride..][..len as usize].iter_mut().enumerate() {
            let z = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ r as u64;
            *s = (z >> 40) as f32 / 1e4 - 800.0;
        }
    }
    let lists = reference_lists(&p, &scores).unwrap();
    let out = FrontOutputs { scores, lists };
    assert_eq!(check_lists(&p, &out).unwrap(), None);
    let k = cfg.index_topk;
    let mut slot = out.clone();
    slot.lists[3 * k + 5] = slot.lists[3 * k + 6];
    let m = check_lists(&p, &slot).unwrap().expect("a changed slot");
    assert_eq!((m.row, m.entry), (3, 5));
    let mut score = out.clone();
    let row = &mut score.scores[2 * stride..][..front.lens[2] as usize];
    let best = (0..row.len())
        .max_by(|&a, &c| row[a].total_cmp(&row[c]))
        .unwrap();
    row[best] = -1e4;
    let m = check_lists(&p, &score).unwrap().expect("a corrupted score");
    assert_eq!(m.row, 2, "{m}");
}

#[test]
fn the_step_slices_go_first_and_are_refused_later() {
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let dims = StepDims::new(&cfg, 4, 1, 64);
    let mut g = LaunchGraph::new(4).unwrap();
    g.arena("early", 8).unwrap();
    assert!(StepSlices::reserve(&mut g, dims).is_err());
    let mut g = LaunchGraph::new(4).unwrap();
    assert!(StepSlices::reserve(
        &mut g,
        StepDims {
            max_rows: 0,
            ..dims
        }
    )
    .is_err());
    assert!(StepSlices::reserve(&mut g, dims).is_ok());
}

#[test]
fn bad_batches_are_refused_by_name() {
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let b = build(&cfg, 8, CacheFormat::Fp8);
    let at = LaunchAt::Layer(3);
    let err = |reqs: &[FrontRequest]| LayerPlan::plan(&cfg, at, reqs, &b).unwrap_err().to_string();
    assert!(err(&requests(&[100], 17)).contains("rows"));
    assert!(err(&requests(&[1, 2, 3, 4, 5], 1)).contains("requests"));
    let mut wide = requests(&[100], 1);
    wide[0].pages = (0..5000).collect();
    assert!(err(&wide).contains("pages"));
    assert!(LayerPlan::plan(&cfg, LaunchAt::Layer(78), &requests(&[1], 1), &b).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// The step slices are disjoint, aligned, in their order, and a row's parts lie inside them.
    #[test]
    fn step_slices_are_disjoint_and_aligned(
        rows in 1u32..64,
        requests in 1u32..64,
        pages in 1u32..5000,
        row in 0u32..64,
    ) {
        let cfg = ModelConfig::preset("glm-5.2").unwrap();
        let requests = requests.min(rows);
        let dims = StepDims::new(&cfg, rows, requests, pages);
        let mut g = LaunchGraph::new(1).unwrap();
        let s = StepSlices::reserve(&mut g, dims).unwrap();
        let all = [s.tokens, s.positions, s.new_slots, s.inv_freq, s.page_table, s.slot_lists, s.hidden[0], s.hidden[1]];
        for w in all.windows(2) {
            prop_assert!(w[0].offset + w[0].bytes <= w[1].offset);
        }
        for x in all {
            prop_assert_eq!(x.offset % executor::fused::graph::ARENA_ALIGN, 0);
        }
        prop_assert_eq!(s.page_table.bytes, u64::from(requests) * u64::from(pages) * 4);
        prop_assert_eq!(s.hidden[0].bytes, u64::from(rows) * 6144 * 2);
        let row = row % rows;
        let list = s.slot_list(row);
        prop_assert!(list.offset >= s.slot_lists.offset);
        prop_assert!(list.offset + list.bytes <= s.slot_lists.offset + s.slot_lists.bytes);
        let some = s.rows_of(s.hidden[1], row + 1);
        prop_assert_eq!(some.bytes, u64::from(row + 1) * 6144 * 2);
        prop_assert_eq!(s.hidden_in(3), s.hidden_out(4));
        prop_assert_eq!(s.end(), s.hidden[1].offset + s.hidden[1].bytes);
    }

    /// Random batches of the tiny model with GLM-5's indexer: every launch plans, and its data
    /// dependencies hold.
    #[test]
    fn random_batches_plan_and_check(
        contexts in proptest::collection::vec(0u32..5000, 1..4),
        rows in 1u32..5,
    ) {
        let cfg = wide_tiny();
        let b = build(&cfg, 1, CacheFormat::Bf16);
        let reqs = requests(&contexts, rows);
        for at in one_of_each(&cfg) {
            let p = LayerPlan::plan(&cfg, at, &reqs, &b);
            let p = p.map_err(|e| TestCaseError::fail(format!("{at:?}: {e}")))?;
            check_dependencies(&p, p.launch.placement.placement())
                .map_err(|e| TestCaseError::fail(format!("{at:?}: {e}")))?;
        }
    }
}

/// Every kind's fused source generates (its stages' defines agree) at glm-5.2 TP8 and the tiny
/// preset, with the stages of the plan in the order of the kernel's arguments; compiling them is
/// `tests/layer_compile.rs`'s.
#[test]
fn every_kind_has_a_source_over_its_stages() {
    use executor::fused::layer::layer_source;
    use executor::fused::CtaShape;
    for (cfg, tp, cache) in [
        (ModelConfig::preset("glm-5.2").unwrap(), 8, CacheFormat::Fp8),
        (ModelConfig::preset("tiny").unwrap(), 1, CacheFormat::Bf16),
    ] {
        for target in ["sm_90a", "gfx950"] {
            let shape = CtaShape::for_target(target).unwrap();
            // A split holds up to 128 slots in sm_90a's 227 KB of LDS, 64 in gfx950's 160 KB.
            let union = if shape.shared_bytes >= 200 * 1024 {
                128
            } else {
                64
            };
            let b = LayerBuild {
                union,
                ..build(&cfg, tp, cache)
            };
            for at in one_of_each(&cfg) {
                let kind = launch_kind(&cfg, at).unwrap();
                let src = layer_source(&cfg, &b, shape, kind, Default::default())
                    .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
                let p = LayerPlan::plan(&cfg, at, &requests(&[100], 1), &b).unwrap();
                let args: Vec<&str> = p
                    .stages
                    .iter()
                    .map(|s| match s {
                        Stage::Indexer => "idx_args",
                        Stage::Select => "sel_args",
                        Stage::Mla => "mla_args",
                        Stage::Linear => "lin_args",
                        Stage::Moe => "moe_args",
                        Stage::Head => "head_args",
                        Stage::Synthetic => "none",
                    })
                    .collect();
                let want = format!(
                    "mono_layer(mbx_launch l, {})",
                    args.iter()
                        .enumerate()
                        .map(|(i, a)| format!("{a} a{i}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                assert!(src.text().contains(&want), "{kind:?}: {want}");
            }
        }
    }
}

/// The kernel table builds each layer kind's kernel (the tail's is the head's, `fused_head`).
#[test]
fn the_kernel_table_holds_every_layer_kind() {
    let paths: Vec<String> = executor::kernels::registry()
        .into_iter()
        .map(|e| e.path)
        .collect();
    for kind in ["dense_full", "dense_shared", "moe_full", "moe_shared"] {
        let path = format!("crates/executor/kernels/fused_layer_{kind}.hip");
        assert!(paths.contains(&path), "{path}");
    }
}

/// The CTAs of the tasks `holds` picks in `placement` hold no q_b or W_UK task of the launch's
/// attention half (which would run ahead of them, or wait behind them), nor with `rope` its q rope.
fn ctas_are_spared(
    p: &LayerPlan,
    placement: &mailbox::Placement,
    holds: impl Fn(&mailbox::Task) -> bool,
    rope: bool,
) -> Result<(), String> {
    use executor::fused::attention::HalfMatrix;
    let half = p.attention.as_ref().ok_or("no attention half")?;
    let heads = half.dims.heads;
    let matrix = |m: HalfMatrix| half.first_matrix + m.index(heads) as u32;
    let ahead: Vec<u32> = std::iter::once(matrix(HalfMatrix::QB))
        .chain((0..heads).map(|h| matrix(HalfMatrix::Uk(h))))
        .collect();
    for (cta, list) in placement.lists().iter().enumerate() {
        let Some(held) = list.iter().find(|t| holds(t)) else {
            continue;
        };
        for t in list {
            let linear = t.kind == linear::layout::KIND_TILES && ahead.contains(&t.args[0]);
            if linear || (rope && t.kind == MlaKind::RopeQ.kind()) {
                return Err(format!("CTA {cta} runs {t:?} beside {held:?}"));
            }
        }
    }
    Ok(())
}

/// The CTAs of the index key and query tasks hold no q_b, q rope or W_UK task.
fn key_ctas_are_spared(p: &LayerPlan, placement: &mailbox::Placement) -> Result<(), String> {
    use indexer::layout::TaskKind;
    let keys = [TaskKind::Key.kind(), TaskKind::Query.kind()];
    ctas_are_spared(p, placement, |t| keys.contains(&t.kind), true)
}

/// The CTAs of select's tasks hold no q_b or W_UK task.
fn select_ctas_are_spared(p: &LayerPlan, placement: &mailbox::Placement) -> Result<(), String> {
    let select = |t: &mailbox::Task| Stage::from_bits(t.stage_bits()) == Some(Stage::Select);
    ctas_are_spared(p, placement, select, false)
}

/// `lists` with the first q_b task moved to the front of the first CTA that holds a task `onto`
/// picks: a placement the sparing checks must refuse.
fn q_b_moved_onto(p: &LayerPlan, onto: impl Fn(&mailbox::Task) -> bool) -> mailbox::Placement {
    let mut lists = p.launch.placement.placement().lists().to_vec();
    let half = p.attention.as_ref().unwrap();
    let q_b = half.first_matrix
        + executor::fused::attention::HalfMatrix::QB.index(half.dims.heads) as u32;
    let is_q_b = |t: &mailbox::Task| t.kind == linear::layout::KIND_TILES && t.args[0] == q_b;
    let to = lists.iter().position(|l| l.iter().any(&onto)).unwrap();
    let from = lists.iter().position(|l| l.iter().any(is_q_b)).unwrap();
    let at = lists[from].iter().position(is_q_b).unwrap();
    let moved = lists[from].remove(at);
    lists[to].insert(0, moved);
    mailbox::Placement::new(lists)
}

/// Full-indexer launches keep their index key and query tasks' CTAs free of q_b, the q rope and
/// W_UK; the check's control: a q_b task moved onto the query's CTA is caught.
#[test]
fn index_key_and_query_ctas_are_spared() {
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let b = build(&cfg, 8, CacheFormat::Fp8);
    for rows in [1, 4] {
        let reqs = requests(&[8192], rows);
        for at in one_of_each(&cfg) {
            let p = LayerPlan::plan(&cfg, at, &reqs, &b).unwrap();
            if p.index.is_none() {
                continue;
            }
            let placement = p.launch.placement.placement();
            key_ctas_are_spared(&p, placement).unwrap_or_else(|e| panic!("{at:?} x {rows}: {e}"));
            let query = indexer::layout::TaskKind::Query.kind();
            let moved = q_b_moved_onto(&p, |t| t.kind == query);
            assert!(key_ctas_are_spared(&p, &moved).is_err());
        }
    }
}

/// Full-indexer launches keep q_b and W_UK off the CTAs of select's tasks at 8K and 128K, 1 and 4
/// rows (every such case leaves them a quarter of the grid): at 128K select's gangs end long
/// after the scores, and the q path behind them set the launch. The control: a q_b task moved
/// onto a select task's CTA is caught.
#[test]
fn select_ctas_take_no_q_b_or_w_uk() {
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let b = build(&cfg, 8, CacheFormat::Fp8);
    let select = |t: &mailbox::Task| Stage::from_bits(t.stage_bits()) == Some(Stage::Select);
    for context in [8192, 131072] {
        for rows in [1, 4] {
            let reqs = requests(&[context], rows);
            for at in one_of_each(&cfg) {
                let p = LayerPlan::plan(&cfg, at, &reqs, &b).unwrap();
                if p.index.is_none() {
                    continue;
                }
                let placement = p.launch.placement.placement();
                select_ctas_are_spared(&p, placement)
                    .unwrap_or_else(|e| panic!("{at:?} at {context} x {rows}: {e}"));
                assert!(select_ctas_are_spared(&p, &q_b_moved_onto(&p, select)).is_err());
            }
        }
    }
}
