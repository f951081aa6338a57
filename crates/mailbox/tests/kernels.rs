//! Every kernel file compiles for both targets, in every build variant the tests use, with no GPU:
//! gfx950 through clang, sm_90a through NVRTC. A missing compiler fails the test (never a skip).

use device::{optional_compiler, Compiler};
use mailbox::gpu::{source, DebugBound, Variant, KERNEL_FILES};
use mailbox::trace::traced;

fn variants() -> Vec<Variant> {
    let debug = |trap| {
        Some(DebugBound {
            poll_limit: 1 << 20,
            trap,
        })
    };
    vec![
        Variant::default(),
        Variant {
            poll_acquire: true,
            ..Variant::default()
        },
        Variant {
            debug: debug(true),
            ..Variant::default()
        },
        Variant {
            debug: debug(false),
            epoch_clear: false,
            ..Variant::default()
        },
    ]
}

/// Compiles every file in every variant and prints what the compiler reports per kernel. No
/// production build may spill (a spill in a poll loop is latency on every hand-off); debug builds may.
fn compile_all(compiler: &dyn Compiler) {
    for file in KERNEL_FILES {
        // With no defines at all: every shape define has a default.
        let mut builds = vec![("default defines".to_string(), source(file), true)];
        for v in variants() {
            builds.push((format!("{v:?}"), v.apply(source(file)), v.debug.is_none()));
        }
        // The task loop's trace stamps are production code too.
        let trace = traced(Variant::default().apply(source(file)));
        builds.push(("traced".to_string(), trace, true));
        for (what, src, production) in builds {
            let compiled = compiler
                .compile(&src)
                .unwrap_or_else(|e| panic!("{} ({what}) for {}: {e}", file.0, compiler.target()));
            for r in &compiled.resources {
                println!("{} {} ({what}): {r:?}", compiler.target(), file.0);
                let target = compiler.target();
                assert!(
                    !production || r.spills == 0,
                    "{target} {} ({what}) spills",
                    r.kernel
                );
            }
        }
    }
}

#[test]
fn kernels_compile_for_gfx950() {
    if let Some(clang) = optional_compiler("gfx950").unwrap_or_else(|e| panic!("{e}")) {
        compile_all(clang.as_ref());
    }
}

#[test]
fn kernels_compile_for_sm90a() {
    if let Some(nvrtc) = optional_compiler("sm_90a").unwrap_or_else(|e| panic!("{e}")) {
        compile_all(nvrtc.as_ref());
    }
}

#[test]
fn compile_errors_are_reported_not_hidden() {
    // Negative control: the checks above would notice a broken header.
    let Some(clang) = optional_compiler("gfx950").unwrap_or_else(|e| panic!("{e}")) else {
        return;
    };
    let broken = source(KERNEL_FILES[0])
        .define("MBX_DEBUG", "1")
        .define("MBX_POLL_LIMIT", "(");
    assert!(clang.compile(&broken).is_err());
}
