//! Builds every layer launch kind's fused kernel (`fused::layer::layer_source`) for both targets
//! without a GPU, at glm-5.2 TP8 (FP8 records), and reports registers, spills and shared memory:
//! the 512-thread CTA caps registers at 128, so the spills printed are the launch's. With
//! MONO_REQUIRE_COMPILERS=1 (CI) a missing compiler fails instead of skipping.

use device::Compiler;
use executor::fused::layer::{layer_source, LayerBuild, StepDims};
use executor::fused::CtaShape;
use mailbox::gpu::Variant;
use mla::layout::SplitChoice;
use model::traffic::LaunchKind;
use model::{CacheFormat, ModelConfig, WeightFormat};

fn builds(compiler: &dyn Compiler) {
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let shape = CtaShape::for_target(compiler.target()).unwrap();
    // A split holds up to 128 slots in sm_90a's 227 KB of LDS, 64 in gfx950's 160 KB.
    let union = if shape.shared_bytes >= 200 * 1024 {
        128
    } else {
        64
    };
    let build = LayerBuild {
        ctas: 132,
        tp: 8,
        rank: 0,
        weights: WeightFormat::Fp8,
        cache: CacheFormat::Fp8,
        cache_pages: 4096,
        step: StepDims::new(&cfg, 16, 4, 4096),
        union,
        choice: SplitChoice::MEASURED_FASTEST,
    };
    for kind in [
        LaunchKind::DenseFull,
        LaunchKind::DenseShared,
        LaunchKind::MoeFull,
        LaunchKind::MoeShared,
        LaunchKind::Tail,
    ] {
        let src = layer_source(&cfg, &build, shape, kind, Variant::default())
            .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        let start = std::time::Instant::now();
        let compiled = compiler
            .compile(&src)
            .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        for r in &compiled.resources {
            eprintln!(
                "{} {kind:?} ({:.1} s): {r:?}",
                compiler.target(),
                start.elapsed().as_secs_f64()
            );
        }
    }
}

fn compiler(target: &str) -> Option<Box<dyn Compiler>> {
    device::optional_compiler(target).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_layer_kind_builds_for_sm90a() {
    if let Some(c) = compiler("sm_90a") {
        builds(c.as_ref());
    }
}

#[test]
fn every_layer_kind_builds_for_gfx950() {
    if let Some(c) = compiler("gfx950") {
        builds(c.as_ref());
    }
}
