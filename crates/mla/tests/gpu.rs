//! The MLA attention tasks on a GPU at GLM-5 shapes (8 heads a rank at TP8, k = 2048, FP8 and
//! bf16 records) against the reference (`attend_latent`): the cache write byte for byte, the
//! latent-space outputs within a stated tolerance, on random and adversarial scenes, with negative
//! controls that must fail, and bitwise-equal outputs over 100 graph replays.
//! `cargo test --release -p mla --test gpu -- --ignored --nocapture` on a GPU machine.

mod support;

use device::Device;
use model::CacheFormat;
use sha2::{Digest, Sha256};
use support::{kernel, shape, Adversary, Attend, GpuScene, Pick, Request, Scene, PLAIN};

/// Largest relative L2 error of a (row, head) output against the f64 reference. The kernel rounds
/// the keys (an FP8 latent times its scale) and the softmax weights to bf16 for the MMAs, and the
/// output to bf16; the queries here spread the scores over about +-4, so a few keys carry a
/// row's weight and their rounding passes almost undiluted to the output (measured 6e-3 to 1.1e-2
/// over the scenes; the negative controls land near 1).
const TOLERANCE: f64 = 3e-2;
const TOPK: usize = 2048;

fn run(
    dev: &Device,
    scene: &Scene,
    slots: Option<&[i32]>,
    scale: Option<f32>,
) -> (Vec<u16>, Vec<u8>, f64) {
    let k = kernel(dev, scene.shape, true, false).unwrap();
    let g = GpuScene::new(dev, k, scene, slots, scale).unwrap();
    let stream = dev.stream();
    g.enqueue(stream, TOPK as u32, Attend::Tasks).unwrap();
    stream.sync().unwrap();
    let diag = g.diag.download().unwrap();
    assert_eq!(diag[0], 0, "a wait gave up: {diag:?}");
    let out = g.out.download().unwrap();
    let err = scene.error(&out);
    (out, g.cache.download().unwrap(), err)
}

fn open() -> Option<Device> {
    match Device::open(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

fn req(context: usize, rows: usize) -> Request {
    Request { context, rows }
}

#[test]
#[ignore = "needs a GPU"]
fn attention_matches_the_reference() {
    let Some(dev) = open() else { return };
    let many: Vec<Request> = [
        1, 2, 5, 100, 2047, 2048, 2049, 3000, 8192, 64, 17, 4096, 2100, 9, 30000, 1000,
    ]
    .iter()
    .map(|&c| req(c, 1))
    .collect();
    let cases: Vec<(&str, Vec<Request>, Pick, Adversary)> = vec![
        ("1 row 8K", vec![req(8192, 1)], Pick::Random, PLAIN),
        ("4 verify rows 8K", vec![req(8192, 4)], Pick::Random, PLAIN),
        (
            "16 requests of 1 row, lengths 1..30000",
            many,
            Pick::Random,
            PLAIN,
        ),
        ("one token", vec![req(1, 1)], Pick::Random, PLAIN),
        (
            "requests of 4 rows, 10 and 5000",
            vec![req(10, 4), req(5000, 4)],
            Pick::Random,
            PLAIN,
        ),
        (
            "every slot the same position",
            vec![req(3000, 2)],
            Pick::SamePosition,
            PLAIN,
        ),
        (
            "every token the same",
            vec![req(4000, 1)],
            Pick::Random,
            Adversary {
                outlier: 0.0,
                equal_tokens: true,
            },
        ),
        (
            "score outlier 1e4",
            vec![req(6000, 2)],
            Pick::Random,
            Adversary {
                outlier: 1e4,
                equal_tokens: false,
            },
        ),
    ];
    let mut failures = Vec::new();
    for format in [CacheFormat::Fp8, CacheFormat::Bf16] {
        for (i, (name, requests, pick, adv)) in cases.iter().enumerate() {
            let scene =
                Scene::new(shape(format, 8), TOPK, requests, *pick, *adv, i as u64).unwrap();
            let (_, cache, err) = run(&dev, &scene, None, None);
            let written = cache == scene.cache_after;
            eprintln!("{format:?} {name}: error {err:.2e} (tolerance {TOLERANCE:e}), cache write exact: {written}");
            if err >= TOLERANCE || !written {
                failures.push(format!("{format:?} {name}"));
            }
        }
    }
    // Other head counts a rank (TP4, TP2, TP1 at GLM-5 width), one row and a verify group.
    for heads in [16, 32, 64] {
        let scene = Scene::new(
            shape(CacheFormat::Fp8, heads),
            TOPK,
            &[req(3000, 1), req(2500, 4)],
            Pick::Random,
            PLAIN,
            99,
        )
        .unwrap();
        let (_, _, err) = run(&dev, &scene, None, None);
        eprintln!("Fp8 {heads} heads: error {err:.2e}");
        if err >= TOLERANCE {
            failures.push(format!("{heads} heads"));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
#[ignore = "needs a GPU"]
fn negative_controls_fail() {
    let Some(dev) = open() else { return };
    let scene = Scene::new(
        shape(CacheFormat::Fp8, 8),
        TOPK,
        &[req(8192, 4)],
        Pick::Random,
        PLAIN,
        7,
    )
    .unwrap();
    let (_, _, base) = run(&dev, &scene, None, None);
    // Slots shifted by one: each row's list read one position later.
    let shifted: Vec<i32> = scene
        .slots
        .iter()
        .map(|&s| if s > 0 { s - 1 } else { s })
        .collect();
    let (_, _, shifted_err) = run(&dev, &scene, Some(&shifted), None);
    // FlashMLA's default scale, 1/sqrt(576), instead of 1/sqrt(qk_head_dim).
    let (_, _, scale_err) = run(&dev, &scene, None, Some(1.0 / 576f32.sqrt()));
    eprintln!("controls: right {base:.2e}, slots shifted {shifted_err:.2e}, scale 1/sqrt(576) {scale_err:.2e} (tolerance {TOLERANCE:e})");
    assert!(base < TOLERANCE);
    assert!(shifted_err > TOLERANCE, "the shifted slots passed");
    assert!(scale_err > TOLERANCE, "the wrong scale passed");
}

#[test]
#[ignore = "needs a GPU"]
fn replays_are_bitwise_equal() {
    let Some(dev) = open() else { return };
    let scene = Scene::new(
        shape(CacheFormat::Fp8, 8),
        TOPK,
        &[req(8192, 4), req(3000, 1)],
        Pick::Random,
        PLAIN,
        11,
    )
    .unwrap();
    let k = kernel(&dev, scene.shape, false, false).unwrap();
    let g = GpuScene::new(&dev, k, &scene, None, None).unwrap();
    let stream = dev.new_stream().unwrap();
    let graph = g.graph(&stream, TOPK as u32, Attend::Tasks).unwrap();
    let mut digests = std::collections::BTreeSet::new();
    for _ in 0..100 {
        g.out.zero().unwrap();
        graph.launch(&stream).unwrap();
        stream.sync().unwrap();
        let out = g.out.download().unwrap();
        let bytes: Vec<u8> = out.iter().flat_map(|v| v.to_le_bytes()).collect();
        digests.insert(format!("{:x}", Sha256::digest(&bytes)));
    }
    let err = scene.error(&g.out.download().unwrap());
    eprintln!(
        "100 replays: {} distinct SHA-256 {:?}, error {err:.2e}",
        digests.len(),
        digests
    );
    assert_eq!(digests.len(), 1);
    assert!(err < TOLERANCE);
}
