//! The MoE launch's own source (`kernels/moe.hip`, `moe_task.h`, the linear stage's `lin_task.h`
//! and the workspace's `kernels/ops/linear.h`) run on CPU threads through the host stand-in of the
//! prelude (`kernels/host/prelude.h`) and a driver (`tests/host/`), at the tiny config's shapes:
//! random rows (FP8 and bf16 weights, 1 to 16 rows; 64 experts, 8 a row), rows that all choose the
//! same experts (by the bias alone), rows with disjoint experts, exact router ties, every expert
//! tied (16 rows), and group-limited routing, each checked by `check::check` with the measured
//! error printed, and the route task's outputs bit for bit from its input
//! (`check::check_route_exact`). Then the negative controls, which must fail: a tie of every expert
//! broken to a higher one, a routed weight one ulp off (within the reference check's tolerance), a
//! slot scale for a row that did not choose the slot, two scale blocks of a chosen expert swapped
//! (on the emulated device), one expert dropped from a row, and the bias used in the weights as
//! well as the choice. This runs the portable path of the linear tile, not the mma.sync path of the
//! H200 (tests/gpu.rs). Needs g++ with C++20, so ignored:
//! `cargo test --release -p moe --test host_emulation -- --ignored --nocapture`

use model::{ModelConfig, WeightFormat};
use moe::check::{
    check, check_output, check_route_exact, check_routes, DeviceResult, Measured, Oracle,
};
use moe::layout::{lds_bytes, place, MoePlan, MoeShape, MoeStart};
use moe::memory::{Alter, MoeMemory};
use moe::problem::{MoeProblem, Pattern};
use moe::reference::{weigh, Routing};
use std::path::{Path, PathBuf};
use std::process::Command;

const KERNELS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
const LINEAR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../linear/kernels");
const HOST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/host");
/// The host prelude, found before the real one; then the ops layer beside the real one.
const HOST_PRELUDE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels/host");
const OPS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels");
const MAILBOX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../mailbox/kernels");

/// Four groups of 32: a small CTA, so that the emulated threads stay few.
const THREADS: u32 = 128;
const CTAS: u32 = 4;

fn compile(dir: &Path, lds: u32) -> PathBuf {
    // The one line the host cannot take as written: dynamic shared memory becomes a static array.
    let hip = std::fs::read_to_string(format!("{KERNELS}/moe.hip")).unwrap();
    let dynamic = "extern __shared__ __attribute__((aligned(16))) u8 moe_lds[];";
    assert!(hip.contains(dynamic));
    let hip = hip.replace(dynamic, &format!("alignas(16) static u8 moe_lds[{lds}];"));
    std::fs::write(dir.join("moe.hip"), hip).unwrap();
    let exe = dir.join("moe_host");
    let out = Command::new("g++")
        .args(["-std=c++20", "-O2", "-pthread", "-w"])
        .arg(format!("-I{}", dir.display()))
        .arg(format!("-I{HOST}"))
        .arg(format!("-I{HOST_PRELUDE}"))
        .arg(format!("-I{KERNELS}"))
        .arg(format!("-I{LINEAR}"))
        .arg(format!("-I{MAILBOX}"))
        .arg(format!("-I{OPS}"))
        .arg(format!("-DMONO_CTA_THREADS={THREADS}"))
        .args([
            "-DMBX_DEBUG=1",
            "-DMBX_DEBUG_TRAP=0",
            "-DMBX_POLL_LIMIT=200000000u",
        ])
        .arg(format!("{HOST}/driver.cpp"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("g++: {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

fn as_bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// One emulated launch of `p` laid out as `mem`.
fn run(exe: &Path, p: &MoeProblem, mem: &MoeMemory, plan: &MoePlan) -> DeviceResult {
    let table = plan.placement.table();
    let (mats, banks, args) = mem.args(0, p);
    let mut input: Vec<u8> = Vec::new();
    for w in [
        CTAS,
        table.tasks.len() as u32,
        mats.len() as u32,
        banks.len() as u32,
        plan.end_box,
    ] {
        input.extend(w.to_le_bytes());
    }
    input.extend((mem.bytes.len() as u64).to_le_bytes());
    input.extend(as_bytes(&table.tasks));
    input.extend(as_bytes(&table.offsets));
    input.extend(as_bytes(&mats));
    input.extend(as_bytes(&banks));
    input.extend(as_bytes(std::slice::from_ref(&args)));
    input.extend(&mem.bytes);
    let dir = exe.parent().unwrap();
    let (i, o) = (dir.join("input"), dir.join("output"));
    std::fs::write(&i, input).unwrap();
    let out = Command::new(exe).arg(&i).arg(&o).output().unwrap();
    assert!(
        out.status.success(),
        "{}: driver status {:?}: {}",
        p.name,
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    mem.read(&std::fs::read(&o).unwrap())
}

fn tiny_shape(rows: usize, format: WeightFormat) -> (MoeShape, Routing) {
    let cfg = ModelConfig::preset("tiny").unwrap();
    (
        MoeShape::new(&cfg, 1, rows, format).unwrap(),
        Routing::new(&cfg),
    )
}

fn cases() -> Vec<MoeProblem> {
    use Pattern::*;
    use WeightFormat::*;
    let mut out = Vec::new();
    for (pattern, format, rows, seed) in [
        (Random, Fp8, 1, 1),
        (Random, Bf16, 4, 2),
        (Random, Fp8, 16, 3),
        (SameExperts, Fp8, 16, 4),
        (DisjointExperts, Bf16, 4, 5),
        (Ties, Fp8, 3, 6),
        (AllEqual, Fp8, 16, 8),
    ] {
        let (shape, routing) = tiny_shape(rows, format);
        out.push(MoeProblem::new(shape, routing, pattern, seed).unwrap());
    }
    // 64 experts, 8 a row, 16 rows: lanes past the wave's first expert each, and more scores than
    // the route's CTA takes in one batch of loads.
    let (mut shape, mut routing) = tiny_shape(16, Fp8);
    (shape.experts, shape.top_k, routing.top_k) = (64, 8, 8);
    out.push(MoeProblem::new(shape, routing, Random, 9).unwrap());
    // Group-limited routing: 4 groups of 4 experts, the best 2 kept.
    let (mut shape, mut routing) = tiny_shape(5, Fp8);
    (shape.n_group, shape.topk_group) = (4, 2);
    (routing.n_group, routing.topk_group) = (4, 2);
    out.push(MoeProblem::new(shape, routing, Random, 7).unwrap());
    out
}

fn print(p: &MoeProblem, m: &Measured) {
    eprintln!(
        "{}: {} distinct experts, {} tied rows, weights within {:.2e} (relative), outputs {} of {} exact, max error {:.2e} x (rms + |residual|)",
        p.name, m.distinct, m.tied_rows, m.max_weight_error, m.exact, m.outputs, m.max_output_error
    );
}

#[test]
#[ignore = "slow; needs g++ with C++20"]
fn kernel_source_on_cpu_threads_matches_the_reference() {
    let dir = std::env::temp_dir().join(format!("moe-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = cases();
    let lds = cases
        .iter()
        .map(|p| lds_bytes(&p.shape, THREADS).unwrap())
        .max()
        .unwrap();
    let exe = compile(&dir, lds);
    let mut failures = Vec::new();
    let mut results = Vec::new();
    for p in &cases {
        let plan = place(&p.shape, CTAS, &MoeStart::default()).unwrap();
        let mem = MoeMemory::new(p, None).unwrap();
        let dev = run(&exe, p, &mem, &plan);
        let mut oracle = Oracle::new(p).unwrap();
        match check(p, &mut oracle, &dev).and_then(|m| check_route_exact(p, &dev).map(|()| m)) {
            Ok(m) => print(p, &m),
            Err(e) => {
                eprintln!("FAILED {e}");
                failures.push(p.name.clone());
            }
        }
        results.push(dev);
    }
    assert!(failures.is_empty(), "{failures:?}");

    // 0. All experts tie: the next expert up in place of a row's last, which the tie margin
    // alone would let through.
    let at = cases
        .iter()
        .position(|p| p.pattern == Pattern::AllEqual)
        .unwrap();
    let (p, mut higher) = (&cases[at], results[at].clone());
    let k = p.shape.top_k;
    higher.row_experts[k - 1] = k as u32;
    let err = check_routes(p, &Oracle::new(p).unwrap(), &higher)
        .expect_err("a tie broken to the higher expert passed");
    eprintln!("tie to the higher expert: {err}");

    // 1. A routed weight one ulp off, within the reference check's tolerance: the route's own
    // arithmetic is held bit for bit.
    let mut off = results[0].clone();
    off.row_weights[0] = f32::from_bits(off.row_weights[0].to_bits() + 1);
    check_routes(&cases[0], &Oracle::new(&cases[0]).unwrap(), &off)
        .expect("a weight one ulp off is within the reference check's tolerance");
    let err = check_route_exact(&cases[0], &off).expect_err("a weight one ulp off passed");
    eprintln!("weight one ulp off: {err}");
    // 2. A slot's scale for a row that did not choose it.
    let at = results
        .iter()
        .position(|d| d.slot_scale.contains(&0.0))
        .unwrap();
    let mut stray = results[at].clone();
    let unchosen = stray.slot_scale.iter().position(|&w| w == 0.0).unwrap();
    stray.slot_scale[unchosen] = 0.5;
    let err = check_route_exact(&cases[at], &stray).expect_err("a stray slot scale passed");
    eprintln!("stray slot scale: {err}");

    // The controls on the first random FP8 case.
    let p = &cases[0];
    let plan = place(&p.shape, CTAS, &MoeStart::default()).unwrap();
    let mut oracle = Oracle::new(p).unwrap();
    let target = oracle.routes[0][0].expert;

    // 3. Two scale blocks that differ, of an expert row 0 chose, swapped (its down's, or its
    // gate/up's when the down's are all equal).
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
    let mem = MoeMemory::new(p, Some(swap)).unwrap();
    let dev = run(&exe, p, &mem, &plan);
    let err = check(p, &mut oracle, &dev).expect_err("swapped scale blocks passed");
    eprintln!("swapped scales: {err}");

    // The correct launch, for the checker-side controls.
    let mem = MoeMemory::new(p, None).unwrap();
    let dev = run(&exe, p, &mem, &plan);
    check(p, &mut oracle, &dev).unwrap();

    // 4. One expert dropped from row 0: its routes, and an output computed without it.
    let mut fewer = dev.clone();
    fewer.row_experts[0] = fewer.row_experts[1];
    let err = check_routes(p, &oracle, &fewer).expect_err("a dropped expert's routes passed");
    eprintln!("dropped expert (routes): {err}");
    let mut routes = oracle.routes.clone();
    routes[0].remove(0);
    let wrong = oracle.output(p, &routes).unwrap();
    let out: Vec<f32> = wrong
        .iter()
        .enumerate()
        .flat_map(|(r, y)| {
            let h = p.shape.hidden;
            y.iter().enumerate().map(move |(c, &v)| (r * h + c, v))
        })
        .map(|(at, v)| model::numerics::bf16_round(moe::problem::bf16_value(p.residual[at]) + v))
        .collect();
    let (routes, mut m) = check_routes(p, &oracle, &dev).unwrap();
    let err = check_output(p, &mut oracle, &routes, &out, &mut m)
        .expect_err("an output without one expert passed");
    eprintln!("dropped expert (output): {err}");

    // 5. The bias in the weights as well as the choice.
    let mut biased = dev.clone();
    for (r, s) in oracle.scores.iter().enumerate() {
        let with_bias: Vec<f32> = s.iter().zip(&p.bias).map(|(s, b)| s + b).collect();
        let k = p.shape.top_k;
        let chosen: Vec<usize> = dev.row_experts[r * k..(r + 1) * k]
            .iter()
            .map(|&e| e as usize)
            .collect();
        for (q, route) in weigh(&with_bias, &chosen, &p.routing).iter().enumerate() {
            biased.row_weights[r * k + q] = route.weight;
        }
    }
    let err = check(p, &mut oracle, &biased).expect_err("weights with the bias passed");
    eprintln!("bias in the weights: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}
