//! Builds every kernel source of the crate for both targets without a GPU: the production one (the
//! kernel table's), and GLM-5's and the tiny preset's shapes with each scorer, variant switch and
//! fault. With MONO_REQUIRE_COMPILERS=1 (CI) a missing compiler fails instead of skipping.

use device::{Compiler, KernelSource};
use indexer::gpu::{sources, Fault, KernelConfig};
use indexer::reference::{IndexerDims, IndexerOptions};
use model::numerics::RopeStyle;
use model::ModelConfig;

/// The compiler for `target`, or None when it is missing: a skipped check, counted in the run's
/// summary (a failure instead under MONO_REQUIRE_COMPILERS=1).
fn compiler(target: &str) -> Option<Box<dyn Compiler>> {
    device::optional_compiler(target).unwrap_or_else(|e| panic!("{e}"))
}

/// Each preset with its variant switches and faults; with `wgmma` (NVIDIA only) also the wgmma
/// scorer where the shape allows it, traced and not.
fn configs(wgmma: bool) -> Vec<KernelConfig> {
    let mut out = Vec::new();
    for preset in ["glm-5", "tiny"] {
        let cfg = ModelConfig::preset(preset).unwrap();
        let dims = IndexerDims::new(&cfg).unwrap();
        let mut options = vec![IndexerOptions::kernels(&cfg)];
        let fp8 = KernelConfig::new(dims, &IndexerOptions::deepseek(&cfg)).unwrap();
        if wgmma && fp8.check().is_ok() {
            options.push(IndexerOptions::deepseek(&cfg));
            out.push(KernelConfig { trace: true, ..fp8 });
        }
        for opts in options {
            let base = KernelConfig::new(dims, &opts).unwrap();
            out.push(base);
            for fault in [Fault::PatchGroupOnly, Fault::SkipPriorWait] {
                out.push(KernelConfig {
                    rope: RopeStyle::HalfSplit,
                    hadamard: false,
                    fault: Some(fault),
                    ..base
                });
            }
        }
    }
    out
}

/// ptxas says so when it must serialise wgmma (accumulators touched while in flight): slow.
fn wgmma_serialised(log: &str) -> bool {
    log.contains("wgmma")
}

fn builds_everything(compiler: &dyn Compiler) {
    let mut built = Vec::new();
    for source in sources().into_iter().chain(
        configs(compiler.target().starts_with("sm_"))
            .iter()
            .map(KernelConfig::source),
    ) {
        let compiled = compiler
            .compile(&source)
            .unwrap_or_else(|e| panic!("{} for {}: {e}", source.name(), compiler.target()));
        assert!(
            !wgmma_serialised(&compiled.log),
            "{} for {}: {}",
            source.name(),
            compiler.target(),
            compiled.log
        );
        for r in compiled.resources {
            eprintln!(
                "{} {}: {} registers, {} B shared, {} B spilled, {} B stack",
                compiler.target(),
                r.kernel,
                r.registers,
                r.shared_bytes,
                r.spills,
                r.scratch_bytes
            );
            // No local memory (an indexed register array or a spill would land there). AMD's
            // `spills` also counts SGPRs parked in VGPR lanes, which cost no memory.
            assert_eq!(
                r.scratch_bytes,
                0,
                "{} uses stack/scratch on {}",
                r.kernel,
                compiler.target()
            );
            if compiler.target().starts_with("sm_") {
                assert_eq!(r.spills, 0, "{} spills on {}", r.kernel, compiler.target());
                // The fused shape: 512 threads, one CTA a SM, 128 registers a thread.
                assert!(
                    r.registers <= 128,
                    "{} needs {} registers",
                    r.kernel,
                    r.registers
                );
            }
            built.push(r.kernel);
        }
    }
    built.sort();
    built.dedup();
    assert_eq!(built, ["indexer_tasks"]);
}

#[test]
fn kernels_build_for_sm90a() {
    if let Some(c) = compiler("sm_90a") {
        builds_everything(c.as_ref());
    }
}

#[test]
fn kernels_build_for_gfx950() {
    if let Some(c) = compiler("gfx950") {
        builds_everything(c.as_ref());
    }
}

/// The negative control of the serialisation check: a kernel that adds to an accumulator while
/// its wgmma is in flight must be caught by it.
#[test]
fn a_wgmma_touched_in_flight_is_caught() {
    let Some(c) = compiler("sm_90a") else {
        return;
    };
    let body = r#"
#include "prelude.h"
MONO_KERNEL void touched(float* out, u64 b) {
  const u32 a[4] = {1, 2, 3, 4};
  float d[16] = {};
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
  for (int k = 0; k < 2; ++k) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
      "%10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0; }"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1u));
    d[0] += 1.0f;
  }
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  for (int i = 0; i < 16; ++i) out[i] = d[i];
}
"#;
    let source = KernelSource::new("touched.hip", body);
    let compiled = c.compile(&source).unwrap_or_else(|e| panic!("{e}"));
    assert!(wgmma_serialised(&compiled.log), "{}", compiled.log);
}
