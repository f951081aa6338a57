//! Builds the MLA kernels for both targets without a GPU, at the shapes the tests and benchmarks
//! launch (GLM-5 at 8 and 64 heads a rank, FP8 and bf16 records, the debug build with bounded
//! polls, the trace build), and reports registers, spills and shared memory. With MONO_REQUIRE_COMPILERS=1 (CI) a
//! missing compiler fails instead of skipping.

use device::Compiler;
use mailbox::gpu::{DebugBound, Variant};
use mla::gpu::{traced_source, CTA_THREADS};
use mla::layout::AttendShape;
use mla::CacheLayout;
use model::{CacheFormat, ModelConfig};

/// The compiler for `target`, or None when it is missing: a skipped check, counted in the run's
/// summary (a failure instead under MONO_REQUIRE_COMPILERS=1).
fn compiler(target: &str) -> Option<Box<dyn Compiler>> {
    device::optional_compiler(target).unwrap_or_else(|e| panic!("{e}"))
}

fn builds(compiler: &dyn Compiler) {
    let cfg = ModelConfig::preset("glm-5").unwrap();
    let debug = Variant {
        debug: Some(DebugBound {
            poll_limit: 1 << 20,
            trap: false,
        }),
        ..Variant::default()
    };
    for (format, heads, union, variant, trace) in [
        (CacheFormat::Fp8, 8, 128, Variant::default(), false),
        (CacheFormat::Fp8, 64, 128, Variant::default(), false),
        (CacheFormat::Bf16, 8, 128, Variant::default(), false),
        (CacheFormat::Fp8, 8, 128, debug, false),
        (CacheFormat::Fp8, 8, 128, Variant::default(), true),
    ] {
        let shape =
            AttendShape::new(CacheLayout::new(&cfg, format).unwrap(), heads, union).unwrap();
        let compiled = compiler
            .compile(&traced_source(&shape, CTA_THREADS, variant, trace))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut names: Vec<_> = compiled
            .resources
            .iter()
            .map(|r| r.kernel.clone())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["mla_publish_slots", "mla_tasks"],
            "{}",
            compiler.target()
        );
        for r in &compiled.resources {
            eprintln!(
                "{} {format:?} {heads} heads{}, {} B LDS: {r:?}",
                compiler.target(),
                if trace { " (trace)" } else { "" },
                shape.lds_bytes()
            );
        }
    }
}

#[test]
fn kernels_build_for_sm90a() {
    if let Some(c) = compiler("sm_90a") {
        builds(c.as_ref());
    }
}

#[test]
fn kernels_build_for_gfx950() {
    if let Some(c) = compiler("gfx950") {
        builds(c.as_ref());
    }
}
