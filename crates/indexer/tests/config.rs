//! The scorers' config checks: which scorer each target builds, what they refuse before any
//! compile, and the LDS the wgmma scorer asks for.

use indexer::gpu::{KernelConfig, RING};
use indexer::reference::{IndexerDims, IndexerOptions, VectorFormat};
use model::ModelConfig;

fn wgmma(preset: &str) -> KernelConfig {
    let cfg = ModelConfig::preset(preset).unwrap();
    let dims = IndexerDims::new(&cfg).unwrap();
    let config = KernelConfig::new(dims, &IndexerOptions::deepseek(&cfg)).unwrap();
    assert!(config.wgmma(), "FP8 queries score on wgmma");
    config
}

#[test]
fn wgmma_takes_glm5_fp8_queries_only() {
    assert!(wgmma("glm-5").check().is_ok());
    let tiny = wgmma("tiny").check().unwrap_err().to_string();
    assert!(tiny.contains("32 heads x 128"), "{tiny}");
    let bf16 = KernelConfig {
        query: VectorFormat::Bf16,
        ..wgmma("glm-5")
    };
    assert!(!bf16.wgmma() && bf16.check().is_ok());
    let one_slot = KernelConfig {
        ring: 1,
        ..wgmma("glm-5")
    };
    assert!(one_slot.check().unwrap_err().to_string().contains("2 to 4"));
}

/// A CTA's two run teams must fit a SM (H200: 228 KiB, 1 KiB of it reserved per CTA) at every ring
/// the check allows, the default among them; the first ring past them neither passes the check
/// nor fits. The mma path fits too.
#[test]
fn every_allowed_ring_leaves_room_for_two_runs_a_cta() {
    let config = wgmma("glm-5");
    assert_eq!(config.ring, RING);
    let fits = |c: &KernelConfig| c.score_lds_bytes() + 1024 <= 228 * 1024;
    let mut allowed = 0;
    for ring in 1..=8 {
        let c = KernelConfig { ring, ..config };
        if c.check().is_ok() {
            assert!(fits(&c), "ring {ring}: {} B", c.score_lds_bytes());
            allowed = ring;
        }
    }
    assert!(allowed >= RING, "the default ring {RING} is allowed");
    let more = KernelConfig {
        ring: allowed + 1,
        ..config
    };
    assert!(
        !fits(&more) && more.check().is_err(),
        "ring {}",
        allowed + 1
    );
    let mma = KernelConfig {
        query: VectorFormat::Bf16,
        ..config
    };
    assert!(fits(&mma), "{} B", mma.score_lds_bytes());
}

/// A run's task carries its own group and request, and its first pages' physical ids in order,
/// zero past the run's end.
#[test]
fn run_tasks_carry_their_group_request_and_first_pages() {
    use indexer::gpu::{RunTask, TASK_PAGES};
    use indexer::layout::{Limits, Row, ScorePlan};
    use model::paging::PageTable;
    // Request 0: 3 pages (a run shorter than TASK_PAGES); request 1: 40 pages, shuffled ids.
    let long: Vec<u32> = (0..40).map(|i| 1000 + (i * 7) % 40).collect();
    let table = PageTable::new(&[vec![9, 4, 6], long.clone()]).unwrap();
    let rows = [
        Row {
            request: 0,
            position: 150,
        },
        Row {
            request: 1,
            position: 2559,
        },
    ];
    let plan = ScorePlan::new(&rows, &table, Limits::default()).unwrap();
    let tasks = RunTask::of(&plan, &table);
    assert_eq!(tasks.len(), plan.runs.len());
    for (task, run) in tasks.iter().zip(&plan.runs) {
        let group = plan.groups[run.group as usize];
        assert_eq!((task.run, task.group), (*run, group));
        assert_eq!(task.request, plan.requests[group.request as usize]);
        let pages = table.pages(group.request as usize);
        for (i, &id) in task.first_pages.iter().enumerate() {
            let want = if (i as u32) < run.n_pages {
                pages[(run.first_page as usize) + i]
            } else {
                0
            };
            assert_eq!(id, want, "run {run:?}, page {i}");
        }
    }
    assert!(plan.runs.iter().any(|r| r.n_pages < TASK_PAGES));
}

/// Each target's production scorer: wgmma with FP8 queries only at GLM-5's shape on sm_90a, the
/// mma path with bf16 queries (the reference's `IndexerOptions::kernels`) everywhere else; shapes
/// no scorer builds for are refused, naming what was asked.
#[test]
fn production_picks_each_targets_scorer_and_refuses_other_shapes() {
    let glm5 = ModelConfig::preset("glm-5").unwrap();
    let tiny = ModelConfig::preset("tiny").unwrap();
    assert!(KernelConfig::production(&glm5, "sm_90a").unwrap().wgmma());
    for (cfg, target) in [
        (&glm5, "gfx950"),
        (&glm5, "host"),
        (&tiny, "sm_90a"),
        (&tiny, "host"),
    ] {
        let config = KernelConfig::production(cfg, target).unwrap();
        assert!(!config.wgmma(), "{target}");
        assert_eq!(config.options(), IndexerOptions::kernels(cfg), "{target}");
    }
    let with = |heads: usize, head_dim: usize| {
        let mut cfg = tiny.clone();
        cfg.index_n_heads = heads;
        cfg.index_head_dim = head_dim;
        cfg.qk_rope_head_dim = head_dim.min(32);
        KernelConfig::production(&cfg, "sm_90a").map(|c| c.wgmma())
    };
    for (heads, head_dim) in [(1, 64), (4, 64), (16, 128), (32, 64), (32, 128)] {
        assert!(with(heads, head_dim).is_ok(), "{heads} x {head_dim}");
    }
    let wide = with(8, 256).unwrap_err().to_string();
    assert!(wide.contains("64 or 128") && wide.contains("256"), "{wide}");
    let narrow = with(8, 32).unwrap_err().to_string();
    assert!(narrow.contains("asked for 32"), "{narrow}");
    let many = with(64, 128).unwrap_err().to_string();
    assert!(
        many.contains("at most 32 heads") && many.contains("64"),
        "{many}"
    );
}

/// At GLM-5's shape on sm_90a the production build is the wgmma one: DeepSeek's options (FP8
/// queries) at the default ring, its source and defines exactly those; the fused kernel's stage
/// for every target sets `IDX_WGMMA` to `MONO_NVIDIA` there, and the mma path at tiny's shape.
#[test]
fn glm5_on_sm90a_keeps_its_wgmma_build() {
    let glm5 = ModelConfig::preset("glm-5").unwrap();
    let dims = IndexerDims::new(&glm5).unwrap();
    let before = KernelConfig::new(dims, &IndexerOptions::deepseek(&glm5)).unwrap();
    let now = KernelConfig::production(&glm5, "sm_90a").unwrap();
    assert_eq!(now, before);
    assert_eq!(now.source().text(), before.source().text());
    assert_eq!(now.source().defines(), before.source().defines());
    let mut stage = before.stage_kernel();
    stage
        .defines
        .insert("IDX_WGMMA".into(), "MONO_NVIDIA".into());
    assert_eq!(indexer::gpu::stage_kernel().defines, stage.defines);
    let tiny = ModelConfig::preset("tiny").unwrap();
    let mma = KernelConfig::production(&tiny, "sm_90a")
        .unwrap()
        .stage_kernel();
    assert_eq!(
        indexer::gpu::stage_kernel_for(&tiny).unwrap().defines,
        mma.defines
    );
}
