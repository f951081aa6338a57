//! The MoE launch on the GPU at a GLM-5.2 TP-8 rank's shapes (256 experts of 6144 -> 2 x 256 ->
//! 6144, top 8, the router bf16 with fp32 logits), the standalone entry over every SM: random rows
//! at 1, 4 and 16 rows (FP8) and 4 rows (bf16), rows that all choose the same experts, rows with
//! disjoint experts, exact router ties (4 and 16 rows), every expert tied (16 rows); each checked
//! by `check::check` (the contract of the host emulation) with the measured error printed, and run
//! twice to show the output is the same bit for bit. Then the negative control on the device, which
//! must fail: two scale blocks of a chosen expert swapped. `cargo test --release -p moe --test gpu
//! -- --ignored --nocapture`

use device::Device;
use mailbox::gpu::Variant;
use mailbox::Tags;
use model::{ModelConfig, WeightFormat};
use moe::check::{check, DeviceResult, Measured, Oracle};
use moe::gpu::{DeviceMoe, MoeKernel};
use moe::layout::{lds_bytes, place, MoeShape, MoeStart};
use moe::memory::{Alter, MoeMemory};
use moe::problem::{MoeProblem, Pattern};
use moe::reference::Routing;

const THREADS: u32 = 512;

fn problem(pattern: Pattern, format: WeightFormat, rows: usize, seed: u64) -> MoeProblem {
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let shape = MoeShape::new(&cfg, 8, rows, format).unwrap();
    MoeProblem::new(shape, Routing::new(&cfg), pattern, seed).unwrap()
}

/// Two launches of `p` (tags 1 and 2 of one step); the results of each.
fn run(
    dev: &Device,
    kernel: &MoeKernel,
    p: &MoeProblem,
    alter: Option<Alter>,
) -> (DeviceResult, DeviceResult) {
    let plan = place(&p.shape, dev.info().multiprocessors, &MoeStart::default()).unwrap();
    let lds = kernel
        .lds_budget(dev, lds_bytes(&p.shape, THREADS).unwrap())
        .unwrap();
    let mem = MoeMemory::new(p, alter).unwrap();
    let d = DeviceMoe::new(dev, kernel, p, &mem, &plan, lds).unwrap();
    let stream = dev.stream();
    let tags = Tags::new(2).unwrap();
    d.launch(stream, kernel, tags, 0).unwrap();
    stream.sync().unwrap();
    let first = d.read(&mem).unwrap();
    d.launch(stream, kernel, tags, 1).unwrap();
    stream.sync().unwrap();
    (first, d.read(&mem).unwrap())
}

fn print(p: &MoeProblem, m: &Measured) {
    eprintln!(
        "{}: {} distinct experts, {} tied rows, weights within {:.2e} (relative), outputs {} of {} exact, max error {:.2e} x (rms + |residual|)",
        p.name, m.distinct, m.tied_rows, m.max_weight_error, m.exact, m.outputs, m.max_output_error
    );
}

#[test]
#[ignore = "needs a GPU"]
fn rank_shapes_match_the_reference() {
    use Pattern::*;
    use WeightFormat::*;
    let dev = Device::open(0).unwrap();
    let kernel = MoeKernel::build(&dev, THREADS, Variant::default()).unwrap();
    let mut failures = Vec::new();
    for (pattern, format, rows, seed) in [
        (Random, Fp8, 1, 1),
        (Random, Fp8, 4, 2),
        (Random, Fp8, 16, 3),
        (Random, Bf16, 4, 4),
        (SameExperts, Fp8, 16, 5),
        (DisjointExperts, Fp8, 4, 6),
        (Ties, Fp8, 4, 7),
        (Ties, Fp8, 16, 8),
        (AllEqual, Fp8, 16, 9),
    ] {
        let p = problem(pattern, format, rows, seed);
        let (first, second) = run(&dev, &kernel, &p, None);
        let mut oracle = Oracle::new(&p).unwrap();
        match check(&p, &mut oracle, &first) {
            Ok(m) => print(&p, &m),
            Err(e) => {
                eprintln!("FAILED {e}");
                failures.push(p.name.clone());
            }
        }
        if first.out != second.out {
            eprintln!("FAILED {}: a second launch gave another output", p.name);
            failures.push(p.name.clone());
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
#[ignore = "needs a GPU"]
fn swapped_scale_blocks_fail() {
    let dev = Device::open(0).unwrap();
    let kernel = MoeKernel::build(&dev, THREADS, Variant::default()).unwrap();
    let p = problem(Pattern::Random, WeightFormat::Fp8, 1, 1);
    let mut oracle = Oracle::new(&p).unwrap();
    let target = oracle.routes[0][0].expert;
    let swap: Alter = &|e, gate_up, down| {
        if e == target {
            for s in [&mut down.scales, &mut gate_up.scales] {
                if let Some(other) = moe::check::most_different_scale(s) {
                    s.swap(0, other);
                    return;
                }
            }
            panic!("expert {e}'s scale blocks are all equal");
        }
    };
    let (dev_result, _) = run(&dev, &kernel, &p, Some(swap));
    let err = check(&p, &mut oracle, &dev_result).expect_err("swapped scale blocks passed");
    eprintln!("swapped scales: {err}");
}
