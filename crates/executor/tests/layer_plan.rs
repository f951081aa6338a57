//! Layer launches planned at glm-5.2 TP8 and the tiny preset.

use executor::fused::front::FrontRequest;
use executor::fused::layer::{LaunchAt, LayerBuild, LayerPlan, StepDims};
use mla::layout::SplitChoice;
use model::paging::pages_through;
use model::traffic::LaunchKind;
use model::{CacheFormat, ModelConfig, WeightFormat};

fn build(cfg: &ModelConfig, tp: usize, cache_pages: u32, pages_per_request: u32) -> LayerBuild {
    LayerBuild {
        ctas: 132,
        tp,
        rank: 0,
        weights: WeightFormat::Fp8,
        cache: CacheFormat::Fp8,
        cache_pages,
        step: StepDims::new(cfg, 16, 4, pages_per_request),
        union: 128,
        choice: SplitChoice::MEASURED_FASTEST,
    }
}

fn request(context: u32, rows: u32, first_page: u32) -> FrontRequest {
    let pages = pages_through(context + rows - 1);
    FrontRequest {
        context,
        rows,
        pages: (first_page..first_page + pages).collect(),
    }
}

#[test]
fn every_kind_plans_at_glm_5_2_tp8() {
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let layers = cfg.layer_plan().unwrap();
    for context in [8192, 131072] {
        for rows in [1, 4] {
            let reqs = [request(context, rows, 0)];
            let b = build(&cfg, 8, 4096, 4096);
            let mut seen = Vec::new();
            for at in (0..layers.len())
                .map(LaunchAt::Layer)
                .chain([LaunchAt::Tail])
            {
                let kind = executor::fused::layer::source::launch_kind(&cfg, at).unwrap();
                if seen.contains(&(kind, matches!(at, LaunchAt::Layer(0)))) {
                    continue;
                }
                seen.push((kind, matches!(at, LaunchAt::Layer(0))));
                let p =
                    LayerPlan::plan(&cfg, at, &reqs, &b).unwrap_or_else(|e| panic!("{at:?}: {e}"));
                eprintln!(
                    "{at:?} {kind:?}: {} tasks, {} matrices, arena {} B",
                    p.launch.placement.placement().tasks().count(),
                    p.matrices.len(),
                    p.launch.arena.bytes
                );
            }
            assert!(seen.iter().any(|(k, _)| *k == LaunchKind::MoeShared));
        }
    }
}
