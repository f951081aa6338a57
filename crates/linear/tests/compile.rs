//! Builds the linear entry for both targets without a GPU, in the fused CTA shape (512 threads)
//! and the host emulation's (128), with and without the mailbox's debug bound, and prints
//! registers, spills and shared memory; and with the tile's measurement knobs set; and the RMSNorm
//! prologue's probe. With MONO_REQUIRE_COMPILERS=1 (CI) a missing compiler
//! fails instead of skipping.

use device::Compiler;
use linear::gpu::source;
use mailbox::gpu::{DebugBound, Variant};

/// The compiler for `target`, or None when it is missing: a skipped check, counted in the run's
/// summary (a failure instead under MONO_REQUIRE_COMPILERS=1).
fn compiler(target: &str) -> Option<Box<dyn Compiler>> {
    device::optional_compiler(target).unwrap_or_else(|e| panic!("{e}"))
}

fn builds(compiler: &dyn Compiler) {
    let debug = Variant {
        debug: Some(DebugBound {
            poll_limit: 1 << 20,
            trap: false,
        }),
        ..Variant::default()
    };
    for (threads, variant) in [(512, Variant::default()), (128, debug)] {
        let compiled = compiler
            .compile(&source(threads, variant))
            .unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<_> = compiled
            .resources
            .iter()
            .map(|r| r.kernel.as_str())
            .collect();
        assert_eq!(names, ["linear_tasks"], "{}", compiler.target());
        for r in &compiled.resources {
            eprintln!("{} {threads} threads: {r:?}", compiler.target());
        }
    }
}

#[test]
fn kernels_build_for_sm90a() {
    if let Some(c) = compiler("sm_90a") {
        builds(c.as_ref());
    }
}

/// The tile's measurement knobs (the bench's `LIN_BENCH_DEFINES`, `LIN_BENCH_STAMPS`) still build.
#[test]
fn measurement_builds_for_sm90a() {
    if let Some(c) = compiler("sm_90a") {
        let src = mailbox::trace::traced(source(512, Variant::default()))
            .define("LIN_STAMPS", 1)
            .define("LIN_STAMP_BUF", 1u64 << 40);
        let compiled = c.compile(&src).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("sm_90a with stamps: {:?}", compiled.resources);
    }
}

#[test]
fn kernels_build_for_gfx950() {
    if let Some(c) = compiler("gfx950") {
        builds(c.as_ref());
    }
}

/// The RMSNorm prologue's probe (`kernels/norm_probe.hip`) builds for both targets.
#[test]
fn the_norm_probe_builds_for_both_targets() {
    for target in ["sm_90a", "gfx950"] {
        if let Some(c) = compiler(target) {
            let compiled = c
                .compile(&linear::gpu::norm_probe_source(512))
                .unwrap_or_else(|e| panic!("{e}"));
            eprintln!("{target} probe: {:?}", compiled.resources);
        }
    }
}
