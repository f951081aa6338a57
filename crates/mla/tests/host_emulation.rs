//! The MLA kernels' own source (`kernels/mla.hip`, `mla_attn.h`, `mla_tile.h` and the headers they
//! include) run on CPU threads through the host stand-in of the prelude (`kernels/host/prelude.h`)
//! and its launcher (`kernels/host/launch.h`), at small shapes, against the reference
//! (`attend_latent`) at the GPU tests' tolerance, with the cache write compared byte for byte: one
//! row, four verify rows, two requests, padded (-1) slot lists, a score outlier of 1e4, every slot
//! the same position, FP8 records
//! at GLM-5 width and bf16 records at the tiny preset's; and a negative control (each row's slots
//! shifted by one) that must fail. This checks the device code itself (tasks, teams, tagged-pair
//! waits between CTAs, the matrix tiles' portable path) without a GPU, but not the NVIDIA matrix
//! instructions, the GPU's memory model or speed.
//! Needs g++ with C++20, so ignored:
//! `cargo test --release -p mla --test host_emulation -- --ignored --nocapture`

mod support;

use device::host::build_driver;
use mailbox::gpu::{DebugBound, Variant};
use mailbox::layout::ScratchLayout;
use mailbox::placement::Limits;
use mla::gpu::{check_standalone, source};
use mla::layout::{deal, AttendShape, MlaBoxes};
use mla::CacheLayout;
use model::{CacheFormat, ModelConfig};
use std::path::{Path, PathBuf};
use std::process::Command;
use support::{Adversary, Pick, Request, Scene, PLAIN};

/// The launcher around the stage's entry (`tests/host/driver.cpp`).
const DRIVER: &str = include_str!("host/driver.cpp");
/// The GPU tests' tolerance (tests/gpu.rs says why): the portable tiles round the same operands.
const TOLERANCE: f64 = 3e-2;
/// CTAs of an emulated launch.
const CTAS: u32 = 6;
const TOPK: usize = 256;

/// A build of the kernels: its shape, wave size and CTA size, and which cases it runs.
struct Build {
    name: &'static str,
    shape: AttendShape,
    wave: u32,
    threads: u32,
    all_cases: bool,
}

/// The driver (`tests/host/driver.cpp`) around the stage's own source and defines, built for `b`.
fn compile(b: &Build, dir: &Path) -> PathBuf {
    // The GPU build's defines, with polls bounded so that a wrong wait reports instead of hanging.
    let variant = Variant {
        debug: Some(DebugBound {
            poll_limit: 1 << 24,
            trap: false,
        }),
        ..Variant::default()
    };
    let src = source(&b.shape, b.threads, variant).define("MONO_WAVE", b.wave);
    let exe = dir.join(format!("mla_{}", b.name));
    build_driver(&src, ("driver.cpp", DRIVER), &exe).unwrap_or_else(|e| panic!("{e}"));
    exe
}

fn blob(input: &mut Vec<u8>, bytes: &[u8]) {
    input.extend((bytes.len() as u32).to_le_bytes());
    input.extend(bytes);
    input.resize(input.len().next_multiple_of(4), 0);
}

fn u16_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// One emulated launch of `scene` with the slot lists `slots`: its output and the cache after it.
fn launch(exe: &Path, scene: &Scene, slots: &[i32]) -> Result<(Vec<u16>, Vec<u8>), String> {
    let mut builder = ScratchLayout::builder();
    let boxes = MlaBoxes::add(&mut builder, "mla", &scene.plan).unwrap();
    let layout = builder.build();
    let placement = deal(scene.plan.tasks(&boxes, scene.plan.rows), CTAS);
    let limits = Limits {
        max_resident: CTAS,
        scratch_boxes: layout.boxes(),
    };
    check_standalone(&placement, &scene.plan, &boxes, limits).unwrap();
    let table = placement.table();
    let latent = scene.shape.cache.latent;
    let parts = scene.plan.partial_queries().max(1);
    let header = [
        placement.ctas(),
        scene.topk as u32,
        boxes.slots.offset(),
        boxes.slots.stride(),
        layout.boxes(),
        scene.plan.max_splits(),
        scene.scale.to_bits(),
    ];
    let mut input = Vec::new();
    blob(&mut input, &u32_bytes(&header));
    blob(&mut input, bytemuck::cast_slice(&table.tasks));
    blob(&mut input, &u32_bytes(&table.offsets));
    for v in [
        &scene.q_abs,
        &scene.q_pe,
        &scene.new_latent,
        &scene.new_rope,
    ] {
        blob(&mut input, &u16_bytes(v));
    }
    blob(&mut input, &u32_bytes(&scene.new_slots));
    blob(&mut input, &scene.cache_before);
    blob(&mut input, bytemuck::cast_slice(slots));
    let sizes = [
        (parts * latent) as u32,
        (parts * 2) as u32,
        scene.expected.len() as u32,
    ];
    blob(&mut input, &u32_bytes(&sizes));
    let (in_path, out_path) = (exe.with_extension("input"), exe.with_extension("output"));
    std::fs::write(&in_path, input).unwrap();
    let run = Command::new(exe)
        .arg(&in_path)
        .arg(&out_path)
        .output()
        .unwrap();
    let bytes = std::fs::read(&out_path).unwrap_or_default();
    let diag: Vec<u32> = bytes
        .chunks(4)
        .take(8)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    if !run.status.success() || diag.first() != Some(&0) {
        // launch.h: 3 is its stall watch, 1 a CTA that did not exit cleanly.
        let what = match run.status.code() {
            Some(3) => "no barrier passed in any CTA while it spun or slept for 30 s: a wait that never ends".to_string(),
            code => format!("status {code:?}"),
        };
        return Err(format!(
            "{what}, diagnostics {diag:?}: {}",
            String::from_utf8_lossy(&run.stderr)
        ));
    }
    let out_bytes = &bytes[32..32 + 2 * scene.expected.len()];
    let out = out_bytes
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    Ok((out, bytes[32 + out_bytes.len()..].to_vec()))
}

fn req(context: usize, rows: usize) -> Request {
    Request { context, rows }
}

/// GLM-5's record widths (512 + 64) with FP8 records (their 656-byte records are whole 16-byte
/// pieces; the tiny preset's FP8 records are not), and the tiny preset's (256 + 32) in bf16, in
/// small CTAs of 32-lane waves; and the FP8 build in gfx950's fused CTA (8 waves of 64 lanes) on the verify rows.
fn builds() -> [Build; 3] {
    let glm = ModelConfig::preset("glm-5").unwrap();
    let tiny = ModelConfig::preset("tiny").unwrap();
    let fp8 = AttendShape::new(CacheLayout::new(&glm, CacheFormat::Fp8).unwrap(), 8, 128).unwrap();
    let bf16 =
        AttendShape::new(CacheLayout::new(&tiny, CacheFormat::Bf16).unwrap(), 8, 128).unwrap();
    [
        Build {
            name: "fp8",
            shape: fp8,
            wave: 32,
            threads: 128,
            all_cases: true,
        },
        Build {
            name: "bf16",
            shape: bf16,
            wave: 32,
            threads: 128,
            all_cases: true,
        },
        Build {
            name: "fp8-wave64",
            shape: fp8,
            wave: 64,
            threads: 512,
            all_cases: false,
        },
    ]
}

#[test]
#[ignore = "slow; needs g++ with C++20"]
fn kernel_source_on_cpu_threads_matches_the_reference() {
    let dir = std::env::temp_dir().join(format!("mla-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let outlier = Adversary {
        outlier: 1e4,
        equal_tokens: false,
    };
    let random = Pick::Random;
    let cases: [(&str, Vec<Request>, Pick, Adversary); 6] = [
        ("1 row", vec![req(700, 1)], random, PLAIN),
        ("4 verify rows", vec![req(500, 4)], random, PLAIN),
        ("2 requests", vec![req(40, 1), req(300, 4)], random, PLAIN),
        ("-1 padded slots", vec![req(90, 2)], random, PLAIN),
        ("score outlier 1e4", vec![req(400, 2)], random, outlier),
        (
            "every slot the same position",
            vec![req(300, 2)],
            Pick::SamePosition,
            PLAIN,
        ),
    ];
    let mut failures = Vec::new();
    let builds = builds();
    for b in &builds {
        let (name, exe) = (b.name, compile(b, &dir));
        for (i, (case, requests, pick, adv)) in cases.iter().enumerate() {
            if !b.all_cases && i != 1 {
                continue;
            }
            let scene = Scene::new(b.shape, TOPK, requests, *pick, *adv, i as u64).unwrap();
            let start = std::time::Instant::now();
            let result = launch(&exe, &scene, &scene.slots);
            let line = match &result {
                Ok((out, cache)) => {
                    let err = scene.error(out);
                    let written = *cache == scene.cache_after;
                    if err >= TOLERANCE || !written {
                        failures.push(format!("{name} {case}"));
                    }
                    format!(
                        "error {err:.2e} (tolerance {TOLERANCE:e}), cache write exact: {written}"
                    )
                }
                Err(e) => {
                    failures.push(format!("{name} {case}"));
                    e.clone()
                }
            };
            eprintln!(
                "{name} {case} ({} splits, {} combines, {:.1} s): {line}",
                scene.plan.splits(),
                scene.plan.combines(),
                start.elapsed().as_secs_f64()
            );
        }
    }
    // The negative control: each row's slots read one position later must miss the tolerance.
    let (name, shape) = (builds[0].name, builds[0].shape);
    let exe = dir.join(format!("mla_{name}"));
    let scene = Scene::new(shape, TOPK, &[req(500, 4)], Pick::Random, PLAIN, 7).unwrap();
    let shifted: Vec<i32> = scene
        .slots
        .iter()
        .map(|&s| if s > 0 { s - 1 } else { s })
        .collect();
    let (out, _) = launch(&exe, &scene, &shifted).unwrap();
    let shifted_err = scene.error(&out);
    eprintln!("{name} slots shifted by one: error {shifted_err:.2e} (must exceed {TOLERANCE:e})");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{failures:?}");
    assert!(shifted_err > TOLERANCE, "the shifted slots passed");
}
