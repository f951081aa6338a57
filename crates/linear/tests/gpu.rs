//! The linear task on the GPU at a GLM-5.2 TP-8 rank's shapes (`linear::shapes`): 1, 4 and 16
//! rows (lm_head 1 and 4), each matrix split over every SM, checked by `check::check` (the
//! contract of the host emulation) with the measured error printed; outliers on q_a; an expert's
//! gate/up and its down in one launch, the down waiting on the gate/up's boxes; nine experts and
//! the router in one launch, placed by bytes; the same tile streaming through registers (too
//! little shared memory for its ring) and, in a build that sends every range through the ring,
//! through the ring; and the negative controls, which must fail: two scale blocks swapped (also
//! through the ring), a task (a column range) dropped. The RMSNorm prologue (`FLAG_RMSNORM`)
//! staged by a probe kernel (`kernels/norm_probe.hip`) beside the norm task's function: bit
//! for bit the same, and not with the flag cleared.
//! `cargo test --release -p linear --test gpu -- --ignored --nocapture`

use device::Device;
use linear::cases::{Pattern, Problem};
use linear::check::check;
use linear::gpu::{source, DevicePlan, DeviceProblem, LinearKernel};
use linear::layout::{lds_bytes, place, place_weighted, MatrixPlan};
use linear::shapes::rank_matrices;
use mailbox::gpu::Variant;
use mailbox::Tags;

mod norm_probe;

const THREADS: u32 = 512;

fn problem(i: usize, pattern: Pattern, rows: usize, seed: u64) -> Problem {
    let m = rank_matrices("glm-5.2", 8).unwrap()[i];
    let mut p = Problem::new(pattern, m.format, m.pairing, m.n, m.k, rows, m.finish, seed).unwrap();
    p.name = format!("{} {}", m.name, p.name);
    p
}

/// How a launch is set up.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Setup {
    /// Placed by bytes, all the shared memory a CTA can have (the tile's ring).
    Full,
    /// Placed by tiles (`place`), the least shared memory the matrices take (no room for a
    /// ring: the tile streams through registers).
    Least,
    /// As Full, less the last task of matrix 0 (a negative control).
    DropOne,
}

/// Runs `problems` (with their packed weights) as one launch over every SM; `after[m]` is the
/// matrix whose y is m's x. Returns each y.
fn run(
    dev: &Device,
    kernel: &LinearKernel,
    problems: &[(Problem, model::weights::packed::PackedWeight, Option<usize>)],
    setup: Setup,
) -> Vec<Vec<f32>> {
    let least = problems
        .iter()
        .map(|(p, _, _)| lds_bytes(THREADS, p.k, p.rows).unwrap())
        .max()
        .unwrap();
    let lds = if setup == Setup::Least {
        least
    } else {
        least.max(kernel.lds_budget(dev).unwrap())
    };
    let mut bufs: Vec<DeviceProblem> = Vec::new();
    for (p, w, after) in problems {
        let mut b = DeviceProblem::upload(dev, p, w).unwrap();
        if let Some(a) = after {
            b.matrix.x = bufs[*a].y.device_ptr();
        }
        b.poison(dev.stream()).unwrap();
        bufs.push(b);
    }
    let plans: Vec<MatrixPlan> = problems
        .iter()
        .map(|(_, w, after)| MatrixPlan {
            tiles: w.layout.tiles() as u32,
            after: *after,
        })
        .collect();
    let ctas = dev.info().multiprocessors;
    let mut plan = if setup == Setup::Least {
        place(&plans, ctas).unwrap()
    } else {
        let tile_bytes: Vec<u64> = problems
            .iter()
            .map(|(_, w, _)| ((w.bytes.len() + 4 * w.scales.len()) / w.layout.tiles()) as u64)
            .collect();
        place_weighted(&plans, &tile_bytes, ctas).unwrap()
    };
    if setup == Setup::DropOne {
        let (cta, _, _) = *plan.tasks[0].last().unwrap();
        let list = &mut plan.placement.lists_mut()[cta as usize];
        let at = list.iter().position(|t| t.args[0] == 0).unwrap();
        list.remove(at);
    }
    let mats: Vec<_> = bufs.iter().map(|b| b.matrix).collect();
    let on_device = DevicePlan::new(dev, kernel, &plan, &mats, lds).unwrap();
    let stream = dev.stream();
    on_device
        .launch(stream, kernel, Tags::new(1).unwrap(), 0)
        .unwrap();
    stream.sync().unwrap();
    bufs.iter().map(|b| b.read_y().unwrap()).collect()
}

fn report(p: &Problem, y: &[f32]) -> Result<(), String> {
    let m = check(p, y)?;
    eprintln!(
        "{}: {} outputs, {} off the reference's rounding (at most {} bf16 steps), fp32 error {:.2e} x sum|xw|",
        p.name, m.outputs, m.off_reference, m.max_steps, m.max_sum_error
    );
    Ok(())
}

#[test]
#[ignore = "needs a GPU"]
fn rank_shapes_match_the_reference() {
    let dev = Device::open(0).unwrap();
    let kernel = LinearKernel::build(&dev, THREADS, Variant::default()).unwrap();
    let mut failures = Vec::new();
    let n = rank_matrices("glm-5.2", 8).unwrap().len();
    let mut cases: Vec<(usize, Pattern, usize)> = Vec::new();
    for i in 0..n {
        let all_rows: &[usize] = if i == n - 1 { &[1, 4] } else { &[1, 4, 16] };
        cases.extend(all_rows.iter().map(|&r| (i, Pattern::Random, r)));
    }
    cases.push((0, Pattern::Outliers, 4));
    cases.push((1, Pattern::Zeros, 4));
    for (seed, &(i, pattern, rows)) in cases.iter().enumerate() {
        let p = problem(i, pattern, rows, seed as u64);
        let w = p.packed().unwrap();
        let y = run(&dev, &kernel, &[(p.clone(), w, None)], Setup::Full);
        if let Err(e) = report(&p, &y[0]) {
            eprintln!("FAILED {e}");
            failures.push(p.name.clone());
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
#[ignore = "needs a GPU"]
fn the_register_path_matches_too() {
    let dev = Device::open(0).unwrap();
    let kernel = LinearKernel::build(&dev, THREADS, Variant::default()).unwrap();
    let mut failures = Vec::new();
    // q_a, the expert down (+ row scale and residual), the router: FP8 and bf16, 1 and 4 rows.
    for (seed, (i, rows)) in [(0, 1), (3, 4), (4, 1)].into_iter().enumerate() {
        let p = problem(i, Pattern::Random, rows, 50 + seed as u64);
        let w = p.packed().unwrap();
        let y = run(&dev, &kernel, &[(p.clone(), w, None)], Setup::Least);
        if let Err(e) = report(&p, &y[0]) {
            eprintln!("FAILED {e}");
            failures.push(p.name.clone());
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
#[ignore = "needs a GPU"]
fn a_down_waits_for_its_gate_up() {
    let dev = Device::open(0).unwrap();
    let kernel = LinearKernel::build(&dev, THREADS, Variant::default()).unwrap();
    for rows in [1, 16] {
        let gu = problem(2, Pattern::Random, rows, 100 + rows as u64);
        let mut down = problem(3, Pattern::Random, rows, 200 + rows as u64);
        let (wg, wd) = (gu.packed().unwrap(), down.packed().unwrap());
        let y = run(
            &dev,
            &kernel,
            &[(gu.clone(), wg, None), (down.clone(), wd, Some(0))],
            Setup::Full,
        );
        report(&gu, &y[0]).unwrap();
        down.x = y[0].iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        report(&down, &y[1]).unwrap();
    }
}

#[test]
#[ignore = "needs a GPU"]
fn the_ring_path_matches_too() {
    // Every range through the copy engine's ring, however short (production keeps short ranges
    // in registers): FP8 with its scales through the ring, bf16, 1 and 4 rows, every epilogue.
    let dev = Device::open(0).unwrap();
    let src = source(THREADS, Variant::default()).define("LIN_RING_MIN_STEPS", 1);
    let kernel = LinearKernel::build_source(&dev, THREADS, src).unwrap();
    let mut failures = Vec::new();
    for (seed, (i, rows)) in [(0, 1), (1, 4), (2, 1), (3, 4), (4, 1)]
        .into_iter()
        .enumerate()
    {
        let p = problem(i, Pattern::Random, rows, 70 + seed as u64);
        let w = p.packed().unwrap();
        let y = run(&dev, &kernel, &[(p.clone(), w, None)], Setup::Full);
        if let Err(e) = report(&p, &y[0]) {
            eprintln!("FAILED {e}");
            failures.push(p.name.clone());
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
    let p = problem(0, Pattern::Random, 4, 7);
    let mut w = p.packed().unwrap();
    let other = (1..w.scales.len())
        .find(|&i| w.scales[i] != w.scales[0])
        .unwrap();
    w.scales.swap(0, other);
    let y = run(&dev, &kernel, &[(p.clone(), w, None)], Setup::Full);
    let err = check(&p, &y[0]).expect_err("swapped scales passed the ring");
    eprintln!("swapped scales, ring: {err}");
}

#[test]
#[ignore = "needs a GPU"]
fn nine_experts_and_the_router_in_one_launch() {
    let dev = Device::open(0).unwrap();
    let kernel = LinearKernel::build(&dev, THREADS, Variant::default()).unwrap();
    for rows in [1, 4] {
        // gate/up 0..9, the router, then down e after gate/up e.
        let mut problems = Vec::new();
        for e in 0..9 {
            let p = problem(2, Pattern::Random, rows, 300 + e);
            let w = p.packed().unwrap();
            problems.push((p, w, None));
        }
        let router = problem(4, Pattern::Random, rows, 310);
        let w = router.packed().unwrap();
        problems.push((router, w, None));
        for e in 0..9 {
            let p = problem(3, Pattern::Random, rows, 320 + e as u64);
            let w = p.packed().unwrap();
            problems.push((p, w, Some(e)));
        }
        let y = run(&dev, &kernel, &problems, Setup::Full);
        for (m, (p, _, after)) in problems.iter().enumerate() {
            let mut p = p.clone();
            if let Some(a) = after {
                p.x = y[*a].iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            }
            report(&p, &y[m]).unwrap();
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn negative_controls_fail() {
    let dev = Device::open(0).unwrap();
    let kernel = LinearKernel::build(&dev, THREADS, Variant::default()).unwrap();
    let p = problem(0, Pattern::Random, 4, 7);
    let mut w = p.packed().unwrap();
    let other = (1..w.scales.len())
        .find(|&i| w.scales[i] != w.scales[0])
        .unwrap();
    w.scales.swap(0, other);
    let y = run(&dev, &kernel, &[(p.clone(), w, None)], Setup::Full);
    let err = check(&p, &y[0]).expect_err("swapped scales passed");
    eprintln!("swapped scales: {err}");
    let w = p.packed().unwrap();
    let y = run(&dev, &kernel, &[(p.clone(), w, None)], Setup::DropOne);
    let err = check(&p, &y[0]).expect_err("a dropped column range passed");
    eprintln!("dropped task: {err}");
}

#[test]
#[ignore = "needs a GPU"]
fn rmsnorm_prologue_stages_the_norm_tasks_bits() {
    use device::{Args, Launch};
    use linear::gpu::FLAG_RMSNORM;
    let dev = Device::open(0).unwrap();
    let source = linear::gpu::norm_probe_source(THREADS);
    let module = dev.build(&source).unwrap();
    let kernel = module.kernel("lin_norm_probe").unwrap();
    for s in &norm_probe::cases() {
        let x = dev.upload(&s.x).unwrap();
        let weight = dev.upload(&s.weight).unwrap();
        let normed = dev.alloc_zeroed::<u16>(s.rows * s.n).unwrap();
        let staged = dev.alloc_zeroed::<u16>(s.rows * s.k).unwrap();
        let run = |prologue: bool| {
            let mut m = linear::gpu::LinMatrix {
                x: x.device_ptr() + 2 * s.k0 as u64,
                k: s.k as u32,
                rows: s.rows as u32,
                x_stride: s.n as u32,
                ..Default::default()
            }
            .with_rmsnorm(weight.device_ptr(), s.n as u32, s.k0 as u32, s.eps)
            .unwrap();
            if !prologue {
                m.flags &= !FLAG_RMSNORM;
            }
            let lds = linear::gpu::NORM_PROBE_SCRATCH + (s.rows * (s.k + 8) * 2) as u32;
            let args = Args::new().value(&m).buf(&normed).buf(&staged);
            dev.stream()
                .launch(&kernel, Launch::new(1, THREADS).shared(lds), &args)
                .unwrap();
            dev.stream().sync().unwrap();
            let (n, st) = (normed.download().unwrap(), staged.download().unwrap());
            norm_probe::check_probe(s, &n, &st)
        };
        run(true).unwrap();
        eprintln!("{}: staged = the norm's bits", s.describe());
        // Negative control: without the flag the tile stages the rows un-normed.
        let e = run(false).unwrap_err();
        eprintln!("prologue off: {e}");
    }
}
