//! The indexer on a GPU against the CPU reference, through the stage's task-list entry point: the
//! check matrix (caches x row sets x positions), each run's completion box, the poison check and
//! its negative control, the checkers' own negative controls, overlapped scoring launches and
//! their negative control, and the tiny preset and the variant switches; each for both scorers
//! (bf16 queries on the mma path, FP8 queries on wgmma).
//!
//! `cargo test -p indexer --release --test gpu -- --ignored --nocapture --test-threads 1`

mod support;

use device::{Args, Buffer, Device, Launch};
use indexer::gpu::{Fault, KernelConfig};
use indexer::reference::{IndexerDims, IndexerOptions, VectorFormat};
use mailbox::gpu::{DebugBound, Variant};
use model::numerics::RopeStyle;
use model::ModelConfig;
use support::{
    check_rows, check_runs_done, check_scores, check_stored, CacheKind, Inputs, LaunchBuffers,
    Launched, Request, Scene, Stage,
};

const POSITIONS: [u32; 4] = [8447, 131_071, 262_143, 524_287];
const KINDS: [CacheKind; 4] = [
    CacheKind::Random,
    CacheKind::Ties,
    CacheKind::Zeros,
    CacheKind::Recent,
];

/// Requests of a scene whose longest rows sit at `p`; SETS picks the launches' requests.
fn requests(p: u32) -> Vec<Request> {
    let r = |rows, last_position| Request {
        rows,
        last_position,
    };
    vec![
        // serving: one row a request
        r(1, p),
        r(1, p - p / 8),
        // mixed: different lengths (two under 2,048 keys) and row counts
        r(1, p),
        r(2, p / 2),
        r(1, 1500),
        r(3, 40),
        // draft chains
        r(2, p),
        r(4, p),
        r(8, p),
    ]
}

const SETS: [(&str, &[usize]); 5] = [
    ("serving", &[0, 1]),
    ("mixed", &[2, 3, 4, 5]),
    ("chain 2", &[6]),
    ("chain 4", &[7]),
    ("chain 8", &[8]),
];

fn dims(preset: &str) -> IndexerDims {
    IndexerDims::new(&ModelConfig::preset(preset).unwrap()).unwrap()
}

/// Debug mailbox waits: a wait that never ends gives up and reports instead of hanging the test.
fn config(preset: &str) -> KernelConfig {
    let cfg = ModelConfig::preset(preset).unwrap();
    KernelConfig {
        mailbox: Variant {
            debug: Some(DebugBound {
                poll_limit: 1 << 24,
                trap: false,
            }),
            ..Variant::default()
        },
        ..KernelConfig::new(dims(preset), &IndexerOptions::kernels(&cfg)).unwrap()
    }
}

/// The scorers of `preset`: the mma path (q bf16, keys widened to f16), and wgmma (q FP8, keys as
/// cached) where the preset's shape allows it (GLM-5's, not tiny's).
fn methods(preset: &str) -> Vec<(&'static str, KernelConfig)> {
    let base = config(preset);
    let wgmma = KernelConfig {
        query: VectorFormat::Fp8,
        ..base
    };
    let mut out = vec![("f16", base)];
    if wgmma.check().is_ok() {
        out.push(("wgmma", wgmma));
    }
    out
}

fn stage(config: KernelConfig) -> Stage {
    let dev = Device::open(0).expect("these tests need a GPU");
    Stage::new(dev, config).unwrap_or_else(|e| panic!("{e}"))
}

/// One launch of `set` over `scene` with fresh inputs; keys and queries checked, scores returned
/// with the launch for the score check.
fn launch(
    stage: &Stage,
    scene: &Scene,
    set: &[usize],
    read: &Buffer<u8>,
    write: &Buffer<u8>,
    seed: u64,
) -> Result<(Launched, Inputs), String> {
    let plan = stage.plan(scene, set).map_err(|e| e.to_string())?;
    let inputs = Inputs::random(&scene.dims, plan.rows.len(), seed);
    let launched = stage
        .launch(scene, &plan, &inputs, read, write)
        .map_err(|e| e.to_string())?;
    check_rows(&stage.config, &launched, &inputs)?;
    check_runs_done(&launched)?;
    Ok((launched, inputs))
}

struct Line {
    method: &'static str,
    position: u32,
    kind: CacheKind,
    set: &'static str,
    rows: usize,
    keys: u64,
    result: Result<f64, String>,
}

#[test]
#[ignore = "needs a GPU"]
fn check_matrix() {
    let mut lines = Vec::new();
    for (method, config) in methods("glm-5") {
        check_method(method, stage(config), &mut lines);
    }
    report(&lines);
}

fn check_method(method: &'static str, stage: Stage, lines: &mut Vec<Line>) {
    for (pi, &p) in POSITIONS.iter().enumerate() {
        for (ki, &kind) in KINDS.iter().enumerate() {
            let scene = Scene::new(dims("glm-5"), requests(p), kind, (pi * 10 + ki) as u64);
            let read = stage.dev.upload(&scene.bytes).unwrap();
            // Key tasks store elsewhere: the poisoned new slots stay in what the scorers read.
            let write = stage.dev.alloc_zeroed::<u8>(scene.bytes.len()).unwrap();
            let mut launches = Vec::new();
            for (si, (name, set)) in SETS.iter().enumerate() {
                let outcome = launch(&stage, &scene, set, &read, &write, si as u64)
                    .and_then(|(l, inputs)| Ok((check_scores(&scene, &l)?, l, inputs)));
                let (rows, keys, result) = match outcome {
                    Ok((stats, l, inputs)) => {
                        let line = (l.plan.rows.len(), stats.keys, Ok(stats.worst));
                        launches.push((l, inputs));
                        line
                    }
                    Err(e) => (0, 0, Err(e)),
                };
                lines.push(Line {
                    method,
                    position: p,
                    kind,
                    set: name,
                    rows,
                    keys,
                    result,
                });
            }
            let written = write.download().unwrap();
            for (l, _) in &launches {
                if let Err(e) = check_stored(&scene, l, &written) {
                    lines.push(failure(method, p, kind, "cache store", e));
                }
            }
            // The same chain with the store going into the cache the scorers read, as in a real
            // step: the scores must be the same bits.
            if let Some((chain, inputs)) = launches.iter().find(|(l, _)| l.plan.rows.len() == 8) {
                let aliased = stage
                    .launch(&scene, &chain.plan, inputs, &read, &read)
                    .map_err(|e| e.to_string())
                    .and_then(|l| {
                        if l.scores
                            .iter()
                            .map(|s| s.to_bits())
                            .eq(chain.scores.iter().map(|s| s.to_bits()))
                        {
                            Ok(0.0)
                        } else {
                            Err("scores differ when the store goes into the read cache".to_string())
                        }
                    });
                lines.push(Line {
                    method,
                    position: p,
                    kind,
                    set: "chain 8 aliased",
                    rows: 8,
                    keys: 0,
                    result: aliased,
                });
            }
        }
    }
}

fn report(lines: &[Line]) {
    println!("\nindexer check matrix (GLM-5 shapes): error = max |gpu - ref| / max |ref| per row, bound 1e-4");
    println!(
        "{:>6} {:>8} {:>7} {:>16} {:>5} {:>10} {:>10}  result",
        "method", "position", "cache", "rows", "n", "keys", "error"
    );
    let mut failed = 0;
    for l in lines {
        let (error, verdict) = match &l.result {
            Ok(e) => (format!("{e:.2e}"), "ok".to_string()),
            Err(e) => {
                failed += 1;
                ("-".to_string(), format!("FAILED: {e}"))
            }
        };
        println!(
            "{:>6} {:>8} {:>7} {:>16} {:>5} {:>10} {:>10}  {verdict}",
            l.method,
            l.position,
            format!("{:?}", l.kind),
            l.set,
            l.rows,
            l.keys,
            error
        );
    }
    assert_eq!(failed, 0, "{failed} lines of the check matrix failed");
}

fn failure(
    method: &'static str,
    position: u32,
    kind: CacheKind,
    set: &'static str,
    e: String,
) -> Line {
    Line {
        method,
        position,
        kind,
        set,
        rows: 0,
        keys: 0,
        result: Err(e),
    }
}

/// Poison check, negative control: scorers that patch only their own group's new keys read the
/// earlier group's new keys of an 8-row chain from the poisoned cache, and the score check fails;
/// the same scene passes with the real scorer.
#[test]
#[ignore = "needs a GPU"]
fn patching_only_the_groups_own_keys_fails_the_poison_check() {
    let scene = Scene::new(dims("glm-5"), requests(8447), CacheKind::Random, 99);
    let chain = SETS[4].1;
    for ((method, config), patch_group_only) in methods("glm-5")
        .into_iter()
        .flat_map(|m| [(m, false), (m, true)])
    {
        let stage = stage(KernelConfig {
            fault: patch_group_only.then_some(Fault::PatchGroupOnly),
            ..config
        });
        let read = stage.dev.upload(&scene.bytes).unwrap();
        let write = stage.dev.alloc_zeroed::<u8>(scene.bytes.len()).unwrap();
        let (launched, _) = launch(&stage, &scene, chain, &read, &write, 7).unwrap();
        let verdict = check_scores(&scene, &launched);
        println!("{method}, patch group only = {patch_group_only}: {verdict:?}");
        assert_eq!(verdict.is_err(), patch_group_only, "{verdict:?}");
    }
}

/// The checkers themselves fail on wrong results: a score's bits flipped, a published key code
/// off by a few steps, a published query element moved, a run's completion box of another launch.
#[test]
#[ignore = "needs a GPU"]
fn checkers_catch_corrupted_results() {
    let stage = stage(config("glm-5"));
    let scene = Scene::new(dims("glm-5"), requests(8447), CacheKind::Random, 5);
    let read = stage.dev.upload(&scene.bytes).unwrap();
    let write = stage.dev.alloc_zeroed::<u8>(scene.bytes.len()).unwrap();
    let (launched, inputs) = launch(&stage, &scene, SETS[3].1, &read, &write, 3).unwrap();
    check_scores(&scene, &launched).unwrap();

    let mut flipped = launched.clone();
    let t = 1234;
    flipped.scores[t] = f32::from_bits(flipped.scores[t].to_bits() ^ 0x0040_0000);
    assert!(
        check_scores(&scene, &flipped).is_err(),
        "a flipped score passed"
    );

    let mut bad_key = launched.clone();
    bad_key.keys[0].values[5] += 64.0;
    assert!(
        check_rows(&stage.config, &bad_key, &inputs).is_err(),
        "a wrong key passed"
    );

    let mut bad_query = launched.clone();
    bad_query.queries[1].q[77] += 0.25;
    assert!(
        check_rows(&stage.config, &bad_query, &inputs).is_err(),
        "a wrong query passed"
    );

    check_runs_done(&launched).unwrap();
    let mut stale = launched.clone();
    stale.run_tags[1] = launched.tag - 1;
    assert!(
        check_runs_done(&stale).is_err(),
        "a stale completion box passed"
    );
}

/// Other shapes and switches: the tiny preset (8 heads of 64: a half-empty head tile, a narrower
/// key), and GLM-5 with half-split rope and no Hadamard rotation.
#[test]
#[ignore = "needs a GPU"]
fn tiny_preset_and_variant_switches() {
    let cfg = ModelConfig::preset("glm-5").unwrap();
    let variant = |base: KernelConfig| KernelConfig {
        rope: RopeStyle::HalfSplit,
        hadamard: false,
        ..base
    };
    assert_ne!(
        variant(config("glm-5")).options(),
        IndexerOptions::kernels(&cfg)
    );
    let glm5 = methods("glm-5");
    let tiny = methods("tiny");
    assert_eq!(
        (glm5.len(), tiny.len()),
        (2, 1),
        "wgmma takes GLM-5's shape only"
    );
    let mut cases: Vec<(String, KernelConfig)> = tiny
        .into_iter()
        .map(|(method, config)| (format!("tiny {method}"), config))
        .collect();
    cases.extend(glm5.into_iter().map(|(method, config)| {
        (
            format!("glm-5 {method} half-split, no Hadamard"),
            variant(config),
        )
    }));
    for (name, config) in cases {
        let stage = stage(config);
        for p in [700, 8447] {
            let scene = Scene::new(config.dims, requests(p), CacheKind::Random, u64::from(p));
            let read = stage.dev.upload(&scene.bytes).unwrap();
            let write = stage.dev.alloc_zeroed::<u8>(scene.bytes.len()).unwrap();
            for (set_name, set) in SETS {
                let (launched, _) = launch(&stage, &scene, set, &read, &write, 1)
                    .unwrap_or_else(|e| panic!("{name} at {p}, {set_name}: {e}"));
                let stats = check_scores(&scene, &launched)
                    .unwrap_or_else(|e| panic!("{name} at {p}, {set_name}: {e}"));
                println!("{name} at {p}, {set_name}: error {:.2e}", stats.worst);
            }
        }
    }
}

/// Between two overlapped scoring launches: lets the next launch in at its start, waits for the
/// one before, then copies the scores a block of words at a time, lingering between its loads and
/// its stores, so that a next launch that does not wait writes into what it copies.
const READER_SOURCE: &str = r#"
#include "prelude.h"
MONO_KERNEL void read_slowly(const u32* from, u32* to, u32 words, u64 linger_ns) {
  mono_release_next();
  mono_wait_prior();
  for (u32 i = mono_thread(); i < words; i += mono_block_dim()) {
    const u32 v = from[i];
    const u64 until = mono_timer_ns() + linger_ns;
    while (mono_timer_ns() < until) {
    }
    to[i] = v;
  }
}
"#;

/// Scoring launches that overlap the kernel before them (`IndexerKernels::set_overlapping`, as
/// the bench's wgmma-pdl times them): score cache A, a slow reader copies the scores, score cache
/// B (A with every scale doubled). The second scorer starts during the reader but must not write
/// until the reader is done: the copy must hold A's scores and the buffer B's, bit for bit as
/// plain launches give them. Negative control: scorers that skip the wait write into the copy.
#[test]
#[ignore = "needs a GPU"]
fn overlapped_scoring_waits_for_the_kernel_before() {
    let scene = Scene::new(dims("glm-5"), requests(131_071), CacheKind::Random, 17);
    let mut doubled = scene.bytes.clone();
    for page in 0..(doubled.len() as u64 / scene.cache.page_bytes()) as u32 {
        for slot in 0..model::paging::PAGE_TOKENS {
            let at = scene.cache.scale_offset(page, slot) as usize;
            let scale = f32::from_le_bytes(doubled[at..at + 4].try_into().unwrap());
            doubled[at..at + 4].copy_from_slice(&(2.0 * scale).to_le_bytes());
        }
    }
    for ((method, config), skip_prior_wait) in methods("glm-5")
        .into_iter()
        .flat_map(|m| [(m, false), (m, true)])
    {
        let mut stage = stage(KernelConfig {
            fault: skip_prior_wait.then_some(Fault::SkipPriorWait),
            ..config
        });
        let verdict = score_around_a_reader(&mut stage, &scene, &doubled);
        println!("{method}, skip the wait = {skip_prior_wait}: {verdict:?}");
        let overlaps = stage.dev.info().backend == "CUDA";
        if !skip_prior_wait || overlaps {
            assert_eq!(verdict.is_err(), skip_prior_wait, "{method}: {verdict:?}");
        }
    }
}

fn score_around_a_reader(stage: &mut Stage, scene: &Scene, doubled: &[u8]) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| e.to_string();
    let dev = &stage.dev;
    let module = dev
        .build(&device::KernelSource::new("reader.hip", READER_SOURCE))
        .map_err(|e| fail(&e))?;
    let reader = module.kernel("read_slowly").map_err(|e| fail(&e))?;
    let plan = stage.plan(scene, SETS[3].1).map_err(|e| fail(&e))?;
    let inputs = Inputs::random(&scene.dims, plan.rows.len(), 3);
    let buffers = LaunchBuffers::new(stage, scene, &plan, &inputs).map_err(|e| fail(&e))?;
    let a = dev.upload(&scene.bytes).map_err(|e| fail(&e))?;
    let b = dev.upload(doubled).map_err(|e| fail(&e))?;
    let copy = dev
        .alloc_zeroed::<u32>(buffers.scores.len())
        .map_err(|e| fail(&e))?;
    let stream = dev.new_stream().map_err(|e| fail(&e))?;
    let bits = |scores: &[f32]| scores.iter().map(|s| s.to_bits()).collect::<Vec<u32>>();
    stage
        .publish(&stream, &buffers, &a, &a)
        .map_err(|e| fail(&e))?;
    let mut plain = Vec::new();
    for cache in [&a, &b] {
        stage
            .kernels
            .score(&stream, &buffers.stage(stage, cache, cache))
            .map_err(|e| fail(&e))?;
        stream.sync().map_err(|e| fail(&e))?;
        plain.push(bits(&buffers.scores.download().map_err(|e| fail(&e))?));
    }
    if plain[0] == plain[1] {
        return Err("caches A and B gave the same scores: the check could not fail".into());
    }
    buffers.scores.zero().map_err(|e| fail(&e))?;
    stage.kernels.set_overlapping(true);
    let read = Args::new()
        .buf(&buffers.scores)
        .buf(&copy)
        .u32(buffers.scores.len() as u32)
        .u64(200);
    let run = stage
        .kernels
        .score(&stream, &buffers.stage(stage, &a, &a))
        .and_then(|()| Ok(stream.launch(&reader, Launch::new(1, 1024), &read)?))
        .and_then(|()| stage.kernels.score(&stream, &buffers.stage(stage, &b, &b)))
        .and_then(|()| Ok(stream.sync()?));
    stage.kernels.set_overlapping(false);
    run.map_err(|e| fail(&e))?;
    let copied = copy.download().map_err(|e| fail(&e))?;
    let last = bits(&buffers.scores.download().map_err(|e| fail(&e))?);
    let differ = |got: &[u32], want: &[u32]| got.iter().zip(want).filter(|(g, w)| g != w).count();
    match (differ(&copied, &plain[0]), differ(&last, &plain[1])) {
        (0, 0) => Ok(()),
        (c, l) => Err(format!(
            "{c} words of the reader's copy differ from cache A's scores, {l} of the last scores from cache B's"
        )),
    }
}
