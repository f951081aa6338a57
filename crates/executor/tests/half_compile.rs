//! Builds the attention half's fused kernel for both targets without a GPU, at the builds the GPU
//! test and bench launch (GLM-5 at 8 and 64 heads a rank, FP8 and bf16 records, the half-split
//! rope control, the debug build with bounded polls, the trace build), and reports registers,
//! spills and shared memory. With MONO_REQUIRE_COMPILERS=1 (CI) a missing compiler fails instead
//! of skipping.

use device::Compiler;
use executor::fused::attention::{half_source, HalfDims};
use executor::fused::CtaShape;
use mailbox::gpu::{DebugBound, Variant};
use model::numerics::RopeStyle;
use model::{CacheFormat, ModelConfig};

fn builds(compiler: &dyn Compiler) {
    let cfg = ModelConfig::preset("glm-5").unwrap();
    let shape = CtaShape::for_target(compiler.target()).unwrap();
    let debug = Variant {
        debug: Some(DebugBound {
            poll_limit: 1 << 26,
            trap: false,
        }),
        ..Variant::default()
    };
    for (tp, format, style, variant, trace) in [
        (
            8,
            CacheFormat::Fp8,
            RopeStyle::Interleaved,
            Variant::default(),
            false,
        ),
        (
            8,
            CacheFormat::Fp8,
            RopeStyle::Interleaved,
            Variant::default(),
            true,
        ),
        (8, CacheFormat::Fp8, RopeStyle::Interleaved, debug, false),
        (8, CacheFormat::Fp8, RopeStyle::HalfSplit, debug, false),
        (8, CacheFormat::Bf16, RopeStyle::Interleaved, debug, false),
        (1, CacheFormat::Fp8, RopeStyle::Interleaved, debug, false),
    ] {
        let d = HalfDims::new(&cfg, tp, format).unwrap();
        // A split holds up to 128 slots in sm_90a's 227 KB of LDS, 64 in gfx950's 160 KB.
        let union = if shape.shared_bytes >= 200 * 1024 {
            128
        } else {
            64
        };
        let attend = d.attend_shape(union).unwrap();
        let mut src = half_source(shape, &attend, style, variant).unwrap();
        if trace {
            src = mailbox::trace::traced(src);
        }
        let start = std::time::Instant::now();
        let compiled = compiler.compile(&src).unwrap_or_else(|e| panic!("{e}"));
        for r in &compiled.resources {
            eprintln!(
                "{} {} heads {format:?} {style:?}{}{} ({:.1} s): {r:?}",
                compiler.target(),
                d.heads,
                if variant.debug.is_some() {
                    " debug"
                } else {
                    ""
                },
                if trace { " trace" } else { "" },
                start.elapsed().as_secs_f64()
            );
        }
    }
}

fn compiler(target: &str) -> Option<Box<dyn Compiler>> {
    device::optional_compiler(target).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_attention_half_builds_for_sm90a() {
    if let Some(c) = compiler("sm_90a") {
        builds(c.as_ref());
    }
}

#[test]
fn the_attention_half_builds_for_gfx950() {
    if let Some(c) = compiler("gfx950") {
        builds(c.as_ref());
    }
}
