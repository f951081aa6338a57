//! The linear task on the GPU at a GLM-5.2 TP-8 rank's shapes (`linear::shapes`): 1, 4 and 16
//! rows (lm_head 1 and 4), each matrix split over every SM, checked by `check::check` (the
//! contract of the host emulation) with the measured error printed; outliers on q_a; an expert's
//! gate/up and its down in one launch, the down waiting on the gate/up's boxes; and the negative
//! controls, which must fail: two scale blocks swapped, a task (a column range) dropped.
//! `cargo test --release -p linear --test gpu -- --ignored --nocapture`

use device::Device;
use linear::cases::{Pattern, Problem};
use linear::check::check;
use linear::gpu::{DevicePlan, DeviceProblem, LinearKernel};
use linear::layout::{lds_bytes, place, MatrixPlan};
use linear::shapes::rank_matrices;
use mailbox::gpu::Variant;
use mailbox::Tags;

const THREADS: u32 = 512;

fn problem(i: usize, pattern: Pattern, rows: usize, seed: u64) -> Problem {
    let m = rank_matrices("glm-5.2", 8).unwrap()[i];
    let mut p = Problem::new(pattern, m.format, m.pairing, m.n, m.k, rows, m.finish, seed).unwrap();
    p.name = format!("{} {}", m.name, p.name);
    p
}

/// Runs `problems` (with their packed weights) as one launch over every SM; `after[m]` is the
/// matrix whose y is m's x. `drop` removes the last task of matrix 0. Returns each y.
fn run(
    dev: &Device,
    kernel: &LinearKernel,
    problems: &[(Problem, model::weights::packed::PackedWeight, Option<usize>)],
    drop: bool,
) -> Vec<Vec<f32>> {
    let lds = problems
        .iter()
        .map(|(p, _, _)| lds_bytes(THREADS, p.k, p.rows).unwrap())
        .max()
        .unwrap();
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
    let mut plan = place(&plans, dev.info().multiprocessors).unwrap();
    if drop {
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
        let y = run(&dev, &kernel, &[(p.clone(), w, None)], false);
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
            false,
        );
        report(&gu, &y[0]).unwrap();
        down.x = y[0].iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        report(&down, &y[1]).unwrap();
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
    let y = run(&dev, &kernel, &[(p.clone(), w, None)], false);
    let err = check(&p, &y[0]).expect_err("swapped scales passed");
    eprintln!("swapped scales: {err}");
    let w = p.packed().unwrap();
    let y = run(&dev, &kernel, &[(p.clone(), w, None)], true);
    let err = check(&p, &y[0]).expect_err("a dropped column range passed");
    eprintln!("dropped task: {err}");
}
