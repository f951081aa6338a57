//! Builds the select stage's entry for both targets without a GPU, in the production build and at
//! the shapes the tests and benchmarks launch (production k over the longest rows, the tiny model's
//! k = 16, the debug build with bounded polls, the traced build, the hand-off's fault build), and
//! shows that a build the host did not shape is refused. With MONO_REQUIRE_COMPILERS=1 (CI) a
//! missing compiler fails instead of skipping.

use device::Compiler;
use mailbox::gpu::{DebugBound, Variant};
use model::Preset;
use select::gpu::{source, sources, Method, Shape, SELECT_HEADERS};
use select::layout::{TopK, MAX_ROW_KEYS, REG_MAX_ROW};

/// k of GLM-5, from its preset.
fn glm5() -> TopK {
    TopK::preset(Preset::Glm5).unwrap()
}

/// Every kind's task function sits behind the one entry.
const ENTRIES: [&str; 1] = ["select_tasks"];

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
    let mut all = sources();
    for (method, top, len, variant) in [
        (Method::MultiSlice, glm5(), MAX_ROW_KEYS, Variant::default()),
        (Method::OneCta, glm5(), MAX_ROW_KEYS, Variant::default()),
        (Method::MultiSlice, glm5(), 8192, debug),
        (Method::OneCta, TopK::new(16).unwrap(), 4096, debug),
        (Method::Registers, glm5(), 8192, Variant::default()),
        (Method::Registers, glm5(), REG_MAX_ROW, Variant::default()),
        (Method::Registers, TopK::new(16).unwrap(), 100, debug),
    ] {
        all.push(source(Shape::for_rows(method, top, len).unwrap(), variant));
    }
    // The traced build (SEL_TRACE) of the bench.
    let traced = Shape {
        trace: true,
        ..Shape::for_rows(Method::OneCta, glm5(), 8192).unwrap()
    };
    all.push(source(traced, Variant::default()));
    // The hand-off's negative control: tasks that skip their wait.
    let shape = Shape::for_rows(Method::Registers, glm5(), 8192).unwrap();
    all.push(source(shape, Variant::default()).define("SEL_FAULT", 1));
    for src in all {
        let compiled = compiler.compile(&src).unwrap_or_else(|e| panic!("{e}"));
        let mut names: Vec<_> = compiled
            .resources
            .iter()
            .map(|r| r.kernel.clone())
            .collect();
        names.sort();
        assert_eq!(names, ENTRIES, "{}", compiler.target());
        for r in &compiled.resources {
            eprintln!(
                "{} {:?} {:?}: {r:?}",
                compiler.target(),
                src.defines().get("SEL_SLICE_KEYS"),
                src.defines().get("SEL_REG_KEYS")
            );
        }
    }
    // A shape define left out is an error, not a default.
    let unshaped = mailbox::gpu::source(select::gpu::SELECT_HIP);
    let unshaped = SELECT_HEADERS
        .iter()
        .fold(unshaped, |src, &(name, text)| src.header(name, text));
    match compiler.compile(&unshaped) {
        Err(e) => assert!(e.to_string().contains("set by the host"), "{e}"),
        Ok(_) => panic!("an unshaped build compiled"),
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

/// A header in kernels/ that `SELECT_HEADERS` leaves out fails the builds above only where a
/// compiler is present (the host emulation reads kernels/ directly); this says so without one.
#[test]
fn every_header_in_kernels_is_registered() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".h"))
        .collect();
    on_disk.sort();
    let mut registered: Vec<&str> = SELECT_HEADERS.iter().map(|&(name, _)| name).collect();
    registered.sort();
    assert_eq!(on_disk, registered);
}
