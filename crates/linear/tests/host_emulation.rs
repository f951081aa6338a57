//! The linear task's own source (`kernels/linear.hip`, `lin_task.h`, the workspace's
//! `kernels/ops/linear.h`) run on CPU threads through the host stand-in of the prelude
//! (`kernels/host/prelude.h`) and a driver (`tests/host/`): one launch of several matrices
//! (FP8 and bf16, plain and gate/up, 1 / 4 / 9 / 16 rows, N not a multiple of the tile, zeros and
//! outliers, every epilogue, and a matrix whose x is the y of the one before it, so it must wait
//! for it), checked against the reference by `check::check`; then the negative controls, which
//! must fail: two scale blocks swapped, a task (a range of columns) dropped. The RMSNorm prologue
//! (`FLAG_RMSNORM`): a probe kernel (`kernels/norm_probe.hip`) stages x by it beside the
//! norm task's function, which must agree bit for bit (and the function with the f64 reference to
//! a bf16 unit), and a matrix staged so is checked against the reference on those bits; without
//! the flag both checks must fail. Short rows (`LinMatrix::with_short_rows`): x rows shorter than
//! k with NaN after them give the reference's outputs for zeros there, and NaN read as whole rows
//! (the control). This runs the
//! portable path of the tile (the lanes' own FMAs), not the mma.sync path the H200 runs
//! (tests/gpu.rs), but the same layout, partition, sums over groups, epilogues and hand-offs.
//! Needs g++ with C++20, so ignored:
//! `cargo test --release -p linear --test host_emulation -- --ignored --nocapture`

use device::host::build_driver;
use linear::cases::{Finish, Pattern, Problem};
use linear::check::check;
use linear::gpu::{decode_y, flags, source, LinMatrix, FLAG_RMSNORM};
use linear::layout::{lds_bytes, place, LaunchPlan, MatrixPlan};
use mailbox::gpu::{DebugBound, Variant};
use model::weights::packed::{PackedWeight, Pairing};
use model::WeightFormat;
use std::path::{Path, PathBuf};
use std::process::Command;

mod norm_probe;
use norm_probe::{check_probe, NormSource};

/// The launcher around the stage's entry (`tests/host/driver.cpp`).
const DRIVER: &str = include_str!("host/driver.cpp");

/// Four groups of 32: a small CTA, so that the emulated threads stay few.
const THREADS: u32 = 128;
const CTAS: u32 = 3;
const NONE: u64 = u64::MAX;

/// The driver (`tests/host/driver.cpp`) around the stage's own source and defines, with polls
/// bounded so that a wrong wait reports instead of hanging.
fn compile(dir: &Path) -> PathBuf {
    let variant = Variant {
        debug: Some(DebugBound {
            poll_limit: 200_000_000,
            trap: false,
        }),
        ..Variant::default()
    };
    let exe = dir.join("linear_host");
    build_driver(&source(THREADS, variant), ("driver.cpp", DRIVER), &exe)
        .unwrap_or_else(|e| panic!("{e}"));
    exe
}

/// A launch's device memory as one byte arena; pointers become offsets into it.
#[derive(Default)]
struct Arena {
    bytes: Vec<u8>,
}

impl Arena {
    fn put(&mut self, data: &[u8]) -> u64 {
        let at = self.bytes.len().next_multiple_of(16);
        self.bytes.resize(at, 0);
        self.bytes.extend_from_slice(data);
        at as u64
    }
}

fn as_bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// A matrix of the launch: its problem, its packed weight, where its y lives.
struct Placed {
    problem: Problem,
    matrix: LinMatrix,
    /// The matrix before it whose y is this one's x.
    after: Option<usize>,
}

fn put_matrix(arena: &mut Arena, p: &Problem, w: &PackedWeight, x: Option<u64>) -> LinMatrix {
    let out_bytes = if p.out_f32() { 4 } else { 2 };
    let x = x.unwrap_or_else(|| arena.put(&as_bytes(&p.x)));
    LinMatrix {
        w: arena.put(&w.bytes),
        scales: if w.scales.is_empty() {
            NONE
        } else {
            arena.put(&as_bytes(&w.scales))
        },
        x,
        y: arena.put(&vec![0xff; p.rows * p.n * out_bytes]),
        residual: arena.put(&as_bytes(&p.residual)),
        row_scale: arena.put(&as_bytes(&p.row_scale)),
        k: p.k as u32,
        n: p.n as u32,
        tiles: w.layout.tiles() as u32,
        rows: p.rows as u32,
        x_stride: p.k as u32,
        y_stride: p.n as u32,
        flags: flags(p),
        ..LinMatrix::default()
    }
}

fn run(
    exe: &Path,
    plan: &LaunchPlan,
    mats: &[LinMatrix],
    arena: &Arena,
) -> Result<Vec<u8>, String> {
    let table = plan.placement.table();
    let mut input: Vec<u8> = Vec::new();
    for w in [
        CTAS,
        table.tasks.len() as u32,
        mats.len() as u32,
        plan.boxes,
        arena.bytes.len() as u32,
    ] {
        input.extend(w.to_le_bytes());
    }
    input.extend(as_bytes(&table.tasks));
    input.extend(as_bytes(&table.offsets));
    input.extend(as_bytes(mats));
    input.extend(&arena.bytes);
    let (i, o) = (exe.with_extension("input"), exe.with_extension("output"));
    std::fs::write(&i, input).unwrap();
    let out = Command::new(exe).arg(&i).arg(&o).output().unwrap();
    if !out.status.success() {
        return Err(format!(
            "driver status {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(std::fs::read(&o).unwrap())
}

fn problems() -> Vec<(Problem, Option<usize>)> {
    use Finish::*;
    use Pairing::*;
    use Pattern::*;
    use WeightFormat::*;
    let p = |pattern, format, pairing, n, k, rows, finish, seed| {
        Problem::new(pattern, format, pairing, n, k, rows, finish, seed).unwrap()
    };
    vec![
        (p(Random, Fp8, Plain, 200, 512, 1, Rounded, 1), None),
        (
            p(Random, Fp8, Plain, 200, 384, 4, RowScaleResidual, 2),
            None,
        ),
        (p(Random, Fp8, Plain, 64, 256, 16, Fp32, 3), None),
        (p(Random, Bf16, Plain, 136, 256, 16, Rounded, 4), None),
        (p(Random, Bf16, GateUp, 100, 256, 4, Rounded, 5), None),
        (p(Random, Fp8, GateUp, 72, 384, 9, Rounded, 6), None),
        (p(Zeros, Fp8, Plain, 48, 256, 4, Residual, 7), None),
        (p(Outliers, Fp8, Plain, 160, 512, 4, Rounded, 8), None),
        (p(Outliers, Bf16, Plain, 40, 256, 1, Fp32, 9), None),
        (p(Random, Fp8, GateUp, 128, 512, 4, Rounded, 10), None),
        // x is the y of the gate/up before it: 128 SwiGLU columns.
        (p(Random, Fp8, Plain, 100, 128, 4, Residual, 11), Some(9)),
    ]
}

/// Builds the launch: every matrix's weight from `packed` (altered by the negative controls).
fn build(problems: &[(Problem, Option<usize>)], packed: &[PackedWeight]) -> (Arena, Vec<Placed>) {
    let mut arena = Arena::default();
    let mut placed: Vec<Placed> = Vec::new();
    for ((p, after), w) in problems.iter().zip(packed) {
        let x = after.map(|a| placed[a].matrix.y);
        let matrix = put_matrix(&mut arena, p, w, x);
        placed.push(Placed {
            problem: p.clone(),
            matrix,
            after: *after,
        });
    }
    (arena, placed)
}

/// Each matrix's check, with a chained matrix's x taken from the device's y of its producer.
fn check_all(placed: &[Placed], out: &[u8]) -> Vec<Result<linear::check::Measured, String>> {
    let ys: Vec<Vec<f32>> = placed
        .iter()
        .map(|m| {
            let p = &m.problem;
            let bytes = p.rows * p.n * if p.out_f32() { 4 } else { 2 };
            let at = m.matrix.y as usize;
            decode_y(&out[at..at + bytes], p.out_f32())
        })
        .collect();
    placed
        .iter()
        .zip(&ys)
        .map(|(m, y)| {
            let mut p = m.problem.clone();
            if let Some(a) = m.after {
                p.x = ys[a].iter().map(|v| (v.to_bits() >> 16) as u16).collect();
            }
            check(&p, y)
        })
        .collect()
}

#[test]
#[ignore = "slow; needs g++ with C++20"]
fn kernel_source_on_cpu_threads_matches_the_reference() {
    let dir = std::env::temp_dir().join(format!("linear-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let problems = problems();
    // Every problem's tiles fit a CTA's LDS (the emulated CTA has the most a launch may ask for).
    for (p, _) in &problems {
        lds_bytes(THREADS, p.k, p.rows).unwrap();
    }
    let exe = compile(&dir);
    let packed: Vec<PackedWeight> = problems.iter().map(|(p, _)| p.packed().unwrap()).collect();
    let plans: Vec<MatrixPlan> = problems
        .iter()
        .zip(&packed)
        .map(|((_, after), w)| MatrixPlan {
            tiles: w.layout.tiles() as u32,
            after: *after,
        })
        .collect();
    let plan = place(&plans, CTAS).unwrap();

    let (arena, placed) = build(&problems, &packed);
    let mats: Vec<LinMatrix> = placed.iter().map(|m| m.matrix).collect();
    let out = run(&exe, &plan, &mats, &arena).unwrap();
    let mut failures = Vec::new();
    for (m, verdict) in placed.iter().zip(check_all(&placed, &out)) {
        match verdict {
            Ok(v) => eprintln!(
                "{}: {} outputs, {} off the reference's rounding (at most {} bf16 steps), fp32 error {:.2e} x sum|xw|",
                m.problem.name, v.outputs, v.off_reference, v.max_steps, v.max_sum_error
            ),
            Err(e) => {
                eprintln!("FAILED {e}");
                failures.push(m.problem.name.clone());
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");

    // Negative control 1: two scale blocks of matrix 1 swapped (they differ) must fail its check.
    let mut swapped = packed.clone();
    let scales = &mut swapped[1].scales;
    let other = (1..scales.len()).find(|&i| scales[i] != scales[0]).unwrap();
    scales.swap(0, other);
    let (arena, placed) = build(&problems, &swapped);
    let out = run(&exe, &plan, &mats_of(&placed), &arena).unwrap();
    let verdicts = check_all(&placed, &out);
    assert!(verdicts[1].is_err(), "swapped scales passed the check");
    eprintln!("swapped scales: {}", verdicts[1].as_ref().unwrap_err());

    // Negative control 2: the last task of matrix 0 dropped: its columns are never written.
    let mut dropped = plan.clone();
    let (cta, _, _) = *plan.tasks[0].last().unwrap();
    let list = &mut dropped.placement.lists_mut()[cta as usize];
    let at = list.iter().position(|t| t.args[0] == 0).unwrap();
    list.remove(at);
    let (arena, placed) = build(&problems, &packed);
    let out = run(&exe, &dropped, &mats_of(&placed), &arena).unwrap();
    let verdicts = check_all(&placed, &out);
    assert!(
        verdicts[0].is_err(),
        "a dropped column range passed the check"
    );
    eprintln!("dropped task: {}", verdicts[0].as_ref().unwrap_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The launch of one matrix over the CTAs.
fn alone(w: &PackedWeight) -> LaunchPlan {
    let tiles = w.layout.tiles() as u32;
    place(&[MatrixPlan { tiles, after: None }], CTAS).unwrap()
}

fn mats_of(placed: &[Placed]) -> Vec<LinMatrix> {
    placed.iter().map(|m| m.matrix).collect()
}

/// The probe's driver on CPU threads.
const PROBE_DRIVER: &str = include_str!("host/norm_probe.cpp");

fn compile_probe(dir: &Path) -> PathBuf {
    let source = linear::gpu::norm_probe_source(THREADS);
    let exe = dir.join("norm_probe");
    build_driver(&source, ("norm_probe.cpp", PROBE_DRIVER), &exe).unwrap_or_else(|e| panic!("{e}"));
    exe
}

/// The probe on `s` with the matrix's `flags`: the norm function's rows `[rows][n]` and the staged
/// x `[rows][k]`.
fn run_probe(exe: &Path, s: &NormSource, flags: u32) -> (Vec<u16>, Vec<u16>) {
    let mut input = Vec::new();
    for w in [s.rows, s.n, s.k0, s.k, flags as usize] {
        input.extend((w as u32).to_le_bytes());
    }
    input.extend(s.eps.to_le_bytes());
    input.extend(as_bytes(&s.x));
    input.extend(as_bytes(&s.weight));
    let (i, o) = (exe.with_extension("input"), exe.with_extension("output"));
    std::fs::write(&i, input).unwrap();
    let out = Command::new(exe).arg(&i).arg(&o).output().unwrap();
    assert!(
        out.status.success(),
        "probe: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let words: Vec<u16> = std::fs::read(&o)
        .unwrap()
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    let (normed, staged) = words.split_at(s.rows * s.n);
    (normed.to_vec(), staged.to_vec())
}

#[test]
#[ignore = "slow; needs g++ with C++20"]
fn rmsnorm_prologue_stages_the_norm_tasks_bits_on_cpu_threads() {
    let dir = std::env::temp_dir().join(format!("linear-norm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let probe = compile_probe(&dir);
    let sources = norm_probe::cases();
    for s in &sources {
        let (normed, staged) = run_probe(&probe, s, FLAG_RMSNORM);
        check_probe(s, &normed, &staged).unwrap();
        eprintln!("{}: staged = the norm's bits", s.describe());
        // Negative control: without the flag the tile stages the rows un-normed.
        let (normed, staged) = run_probe(&probe, s, 0);
        let e = check_probe(s, &normed, &staged).unwrap_err();
        eprintln!("prologue off: {e}");
    }

    // A matrix through the whole tile on the norm's output: its x is the source rows' k-range,
    // normed by the prologue; checked against the reference on the norm task's bits.
    let exe = compile(&dir);
    let s = &sources[0];
    let mut p = Problem::new(
        Pattern::Random,
        WeightFormat::Fp8,
        Pairing::Plain,
        200,
        s.k,
        s.rows,
        Finish::Residual,
        24,
    )
    .unwrap();
    let (normed, _) = run_probe(&probe, s, FLAG_RMSNORM);
    p.x = (0..s.rows)
        .flat_map(|r| normed[r * s.n + s.k0..r * s.n + s.k0 + s.k].to_vec())
        .collect();
    let w = p.packed().unwrap();
    let plan = alone(&w);
    let run_normed = |prologue: bool| {
        let mut arena = Arena::default();
        let rows = arena.put(&as_bytes(&s.x));
        let weight = arena.put(&as_bytes(&s.weight));
        let mut m = put_matrix(&mut arena, &p, &w, Some(rows + 2 * s.k0 as u64));
        m.x_stride = s.n as u32;
        if prologue {
            m = m
                .with_rmsnorm(weight, s.n as u32, s.k0 as u32, s.eps)
                .unwrap();
        }
        let out = run(&exe, &plan, &[m], &arena).unwrap();
        let at = m.y as usize;
        check(&p, &decode_y(&out[at..at + p.rows * p.n * 2], false))
    };
    let v = run_normed(true).unwrap();
    eprintln!(
        "normed {}: {} outputs, {} off the reference's rounding",
        p.name, v.outputs, v.off_reference
    );
    // Negative control: the same matrix without the prologue reads the rows un-normed.
    let e = run_normed(false).unwrap_err();
    eprintln!("prologue off: {e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "slow; needs g++ with C++20"]
fn short_rows_stage_zeros_past_their_end_on_cpu_threads() {
    let dir = std::env::temp_dir().join(format!("linear-short-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = compile(&dir);
    // W_UK's shape at GLM-5 width: rows of 192 elements in a k-range of 256, the rest of each row
    // (and the bytes after the last) NaN in the arena. The reference's x is zero there.
    let (len, k, rows) = (192, 256, 4);
    let mut p = Problem::new(
        Pattern::Random,
        WeightFormat::Bf16,
        Pairing::Plain,
        72,
        k,
        rows,
        Finish::Rounded,
        25,
    )
    .unwrap();
    let nan = 0xffffu16;
    let device_x: Vec<u16> = (0..rows * k)
        .map(|i| if i % k < len { p.x[i] } else { nan })
        .collect();
    for (i, v) in p.x.iter_mut().enumerate() {
        if i % k >= len {
            *v = 0;
        }
    }
    let w = p.packed().unwrap();
    let plan = alone(&w);
    let run_short = |short: bool| {
        let mut arena = Arena::default();
        let x = arena.put(&as_bytes(&device_x));
        let mut m = put_matrix(&mut arena, &p, &w, Some(x));
        if short {
            m = m.with_short_rows(len as u32).unwrap();
        }
        let out = run(&exe, &plan, &[m], &arena).unwrap();
        let at = m.y as usize;
        check(&p, &decode_y(&out[at..at + p.rows * p.n * 2], false))
    };
    let v = run_short(true).unwrap();
    eprintln!(
        "short rows {}: {} outputs, {} off the reference's rounding",
        p.name, v.outputs, v.off_reference
    );
    // Negative control: read as whole rows, the NaN past them reaches every output.
    let e = run_short(false).unwrap_err();
    eprintln!("whole rows: {e}");
    let m = LinMatrix {
        k: k as u32,
        ..LinMatrix::default()
    };
    assert!(m.with_short_rows(100).is_err() && m.with_short_rows(256).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
