//! Builds the device crate's kernels for both targets without a GPU, and shows the module cache.
//! With MONO_REQUIRE_COMPILERS=1 (set by CI) a missing compiler fails instead of skipping.

use device::{optional_compiler, Compiler, ModuleCache};

fn nvrtc() -> Option<Box<dyn Compiler>> {
    optional_compiler("sm_90a").unwrap_or_else(|e| panic!("{e}"))
}

fn clang() -> Option<Box<dyn Compiler>> {
    optional_compiler("gfx950").unwrap_or_else(|e| panic!("{e}"))
}

fn builds_every_probe(compiler: &dyn Compiler, expected: &[&str]) {
    let mut names = Vec::new();
    for source in device::probes::sources() {
        let compiled = compiler.compile(&source).unwrap_or_else(|e| panic!("{e}"));
        assert!(!compiled.image.is_empty());
        if compiled.resources.is_empty() {
            eprintln!(
                "{}: no resource report in the log:\n{}",
                source.name(),
                compiled.log
            );
        }
        names.extend(compiled.resources.into_iter().map(|r| r.kernel));
    }
    names.sort();
    assert_eq!(names, expected, "resource report for {}", compiler.target());
}

const PROBES: [&str; 10] = [
    "bump",
    "copy_16b",
    "e4m3_all_codes",
    "encode_f32",
    "page_chain_init",
    "page_chase",
    "page_sweep",
    "read_chain4",
    "read_chain8",
    "shared_sum",
];

#[test]
fn probes_build_for_sm90a() {
    if let Some(c) = nvrtc() {
        builds_every_probe(c.as_ref(), &PROBES);
    }
}

#[test]
fn probes_build_for_gfx950() {
    if let Some(c) = clang() {
        builds_every_probe(c.as_ref(), &PROBES);
    }
}

#[test]
fn compile_errors_carry_the_log() {
    let Some(c) = nvrtc().or_else(clang) else {
        return;
    };
    let bad = device::KernelSource::new(
        "bad.hip",
        "#include \"prelude.h\"\nMONO_KERNEL void k() { undefined_name; }\n",
    );
    let err = c.compile(&bad).unwrap_err().to_string();
    assert!(
        err.contains("undefined_name") && err.contains("bad.hip"),
        "{err}"
    );
}

#[test]
fn second_build_comes_from_the_cache() {
    let Some(c) = nvrtc().or_else(clang) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("mono-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = ModuleCache::at(&dir);
    let source = device::probes::copy_source();
    let (first, cold) = cache.build(&source, c.as_ref()).unwrap();
    let (second, warm) = cache.build(&source, c.as_ref()).unwrap();
    eprintln!(
        "{}: cold build {:.1} ms, cached {:.2} ms",
        c.target(),
        cold.millis,
        warm.millis
    );
    assert!(!cold.cached && warm.cached);
    assert_eq!(first.image, second.image);
    assert_eq!(first.resources, second.resources);
    // A different define is a different module.
    let (_, other) = cache
        .build(&source.clone().define("MONO_SOFT_FP8", 1), c.as_ref())
        .unwrap();
    assert!(!other.cached && other.key != cold.key);
    let _ = std::fs::remove_dir_all(&dir);
}
