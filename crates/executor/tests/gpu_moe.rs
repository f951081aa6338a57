//! The MoE half's fused launch (the generated kernel: linear and MoE stages in one switch) on the
//! GPU at a GLM-5.2 TP-8 rank's shapes, planned by `MoeGraph`: checked by `moe::check::check`
//! (the contract of the host emulation) with the measured error printed, and bit for bit the
//! output of the MoE crate's standalone entry on the same memory.
//! `cargo test --release -p executor --test gpu_moe -- --ignored --nocapture`

use device::Device;
use executor::fused::moe::{moe_source, MoeBuild, MoeGraph};
use executor::fused::{CtaShape, ENTRY};
use mailbox::Tags;
use model::{ModelConfig, WeightFormat};
use moe::check::{check, DeviceResult, Oracle};
use moe::gpu::{DeviceMoe, MoeKernel};
use moe::layout::{lds_bytes, MoeStart};
use moe::memory::MoeMemory;
use moe::problem::{MoeProblem, Pattern};
use moe::reference::Routing;

fn run(dev: &Device, kernel: &MoeKernel, g: &MoeGraph, p: &MoeProblem) -> DeviceResult {
    let lds = kernel
        .lds_budget(dev, lds_bytes(&g.shape, kernel.threads()).unwrap())
        .unwrap();
    let mem = MoeMemory::new(p, None).unwrap();
    let d = DeviceMoe::new(dev, kernel, p, &mem, &g.plan, lds).unwrap();
    d.launch(dev.stream(), kernel, Tags::new(1).unwrap(), 0)
        .unwrap();
    dev.stream().sync().unwrap();
    d.read(&mem).unwrap()
}

#[test]
#[ignore = "needs a GPU"]
fn fused_moe_half_matches_the_reference_and_the_standalone_entry() {
    let dev = Device::open(0).unwrap();
    let shape = CtaShape::for_device(dev.info()).unwrap();
    let source = moe_source(shape, Default::default()).unwrap();
    let fused = MoeKernel::from_source(&dev, &source, ENTRY, shape.threads).unwrap();
    let standalone = MoeKernel::build(&dev, shape.threads, Default::default()).unwrap();
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let build = MoeBuild {
        ctas: dev.info().multiprocessors,
        tp: 8,
    };
    for (pattern, format, rows, seed) in [
        (Pattern::Random, WeightFormat::Fp8, 1, 11),
        (Pattern::Ties, WeightFormat::Bf16, 4, 12),
    ] {
        let g = MoeGraph::new(&cfg, rows, format, build, &MoeStart::default()).unwrap();
        let p = MoeProblem::new(g.shape, Routing::new(&cfg), pattern, seed).unwrap();
        let got = run(&dev, &fused, &g, &p);
        let m = check(&p, &mut Oracle::new(&p).unwrap(), &got).unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "fused {}: {} distinct experts, weights within {:.2e}, outputs {} of {} exact, max error {:.2e} x (rms + |residual|)",
            p.name, m.distinct, m.max_weight_error, m.exact, m.outputs, m.max_output_error
        );
        let alone = run(&dev, &standalone, &g, &p);
        assert_eq!(
            got.out, alone.out,
            "{}: fused and standalone differ",
            p.name
        );
    }
}
