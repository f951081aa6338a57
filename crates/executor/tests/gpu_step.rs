//! The step's machinery on a GPU.
//!
//! * Synthetic weights made on the device equal the CPU's rule bit for bit (codes, scales, packed
//!   layout): every tensor at the tiny preset (TP 1 FP8, and a bf16 rank of TP 2), and samples of
//!   a whole glm-5.2 TP 8 rank made on one GPU (about 99 GB with the step: an H200); where the
//!   rank is refused for its size (before anything is allocated), its first 40 layers and the head
//!   instead, as `mono step --layers 40` makes them on an 80 GB card.
//! * The captured step (the epoch node, the front half of every full-indexer layer, a stand-in
//!   tail that writes an argmax from the rows' tokens and positions, the greedy feed) replays bit
//!   for bit: two runs give equal digests, replays give the eager step's front-half outputs, every
//!   launch's lists equal the reference select of its own scores, and the fed tokens, positions
//!   and slots follow the CPU twin of the feed over the replays. Negative control: front halves
//!   whose select tasks skip their wait change the digests, and the comparison names the launch
//!   and the tensor.
//! * The whole tiny step (every launch, the tail, the greedy feed) replayed for 16 greedy steps at
//!   1 and 4 rows a request, 1 and 3 requests, equals the same steps run launch by launch bit for
//!   bit, and those follow the CPU reference stepped over the same rows and the device's own top-k
//!   lists and routed experts: every layer's rows and the logits within tolerance, picks their
//!   argmax, lists the select of their own scores, and a pick, list or route other than the
//!   reference's own only at a near-tie the measured error explains; its negative control plans
//!   the launches at the first step's positions.
//!
//! `cargo test -p executor --release --test gpu_step -- --ignored --nocapture --test-threads 1`

use std::time::Instant;

use device::{Args, Device, Kernel, KernelSource, Launch, Module, Stream};
use executor::fused::front::FrontGraph;
use executor::fused::front_gpu::{FrontFault, FrontKernel};
use executor::step::graph::{Output, StepLaunch};
use executor::step::scene::{FrontScene, SceneRequest};
use executor::step::weights::check::{expected, first_difference};
use executor::step::weights::generate::RESERVE_BYTES;
use executor::step::weights::{DeviceWeights, WeightKernels, WeightPlan};
use executor::step::{
    compare, Comparison, Dump, Feed, FeedKernel, HostRows, StepError, StepFrame, StepGraph,
    StepInputs,
};
use mailbox::gpu::{DebugBound, Variant};
use model::weights::SyntheticRule;
use model::{ModelConfig, WeightFormat};
use select::reference::{select_rows, RowPages, Rows};

fn gpu() -> Device {
    Device::open(0).expect("a GPU")
}

/// Checks `names` (every tensor when empty) of `weights` against the CPU; returns how many.
fn check_tensors(weights: &DeviceWeights, names: &[&str]) -> usize {
    let tensors: Vec<_> = if names.is_empty() {
        weights.plan.tensors.iter().collect()
    } else {
        names.iter().map(|n| weights.tensor(n).unwrap()).collect()
    };
    for t in &tensors {
        let got = weights.read(t).unwrap();
        let want = expected(weights.seed, t).unwrap();
        if let Some(d) = first_difference(t, &got, &want) {
            panic!("GPU synthetic weights differ from the CPU's: {d}");
        }
    }
    tensors.len()
}

fn generate(
    dev: &Device,
    cfg: &ModelConfig,
    tp: usize,
    rank: usize,
    f: WeightFormat,
) -> DeviceWeights {
    try_generate(dev, cfg, tp, rank, f).unwrap_or_else(|e| panic!("{e}"))
}

/// The weights, or the generator's error (a rank too large for the device is refused before
/// anything is allocated).
fn try_generate(
    dev: &Device,
    cfg: &ModelConfig,
    tp: usize,
    rank: usize,
    f: WeightFormat,
) -> Result<DeviceWeights, StepError> {
    let kernels = WeightKernels::build(dev).unwrap();
    let plan = WeightPlan::new(cfg, tp, rank, f).unwrap();
    let mut reports = 0;
    let w = DeviceWeights::generate(dev, &kernels, plan, 11, &mut |p| {
        reports += 1;
        assert!(p.bytes_done <= p.bytes && p.tensors_done <= p.tensors);
    })?;
    assert!(
        reports >= 2,
        "progress is reported at the start and the end"
    );
    Ok(w)
}

/// Tensors of a glm-5.2 TP 8 rank checked whole against the CPU: each form, element type and
/// split (replicated, rows, columns, gate/up pairs, routed and shared experts, vectors).
const GLM52_SAMPLES: [&str; 15] = [
    "model.layers.0.self_attn.q_a_proj.weight",
    "model.layers.10.self_attn.q_b_proj.weight",
    "model.layers.10.self_attn.kv_b_proj.weight",
    "model.layers.10.self_attn.o_proj.weight",
    "model.layers.1.mlp.gate_proj.weight",
    "model.layers.1.mlp.down_proj.weight",
    "model.layers.40.mlp.experts.200.up_proj.weight",
    "model.layers.77.mlp.experts.255.down_proj.weight",
    "model.layers.5.mlp.shared_experts.gate_proj.weight",
    "model.layers.3.mlp.gate.weight",
    "model.layers.3.mlp.gate.e_score_correction_bias",
    "model.layers.0.self_attn.indexer.weights_proj.weight",
    "model.layers.0.self_attn.indexer.k_norm.bias",
    "model.layers.60.input_layernorm.weight",
    "model.norm.weight",
];

/// The samples name tensors of the rank (checked without a GPU, so a misnamed sample shows here).
#[test]
fn the_glm52_samples_are_tensors_of_the_rank() {
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let plan = WeightPlan::new(&cfg, 8, 3, WeightFormat::Fp8).unwrap();
    for name in GLM52_SAMPLES {
        assert!(
            plan.get(name).is_some(),
            "{name} is not a tensor of glm-5.2 TP 8 rank 3"
        );
    }
}

#[test]
#[ignore = "needs a GPU"]
fn synthetic_weights_on_the_gpu_equal_the_cpu_rule() {
    let dev = gpu();
    let tiny = ModelConfig::preset("tiny").unwrap();
    for (tp, rank, format) in [(1, 0, WeightFormat::Fp8), (2, 1, WeightFormat::Bf16)] {
        let w = generate(&dev, &tiny, tp, rank, format);
        let n = check_tensors(&w, &[]);
        println!("tiny TP {tp} rank {rank} {format:?}: all {n} tensors equal the CPU's");
    }

    // Where the generator refuses the whole rank for its size (an 80 GB card), the first 40
    // layers and the head, as `mono step --layers 40` makes them, and the samples they hold.
    let whole = ModelConfig::preset("glm-5.2").unwrap();
    let started = Instant::now();
    let (w, label) = match try_generate(&dev, &whole, 8, 3, WeightFormat::Fp8) {
        Ok(w) => (w, "glm-5.2"),
        Err(e @ StepError::Memory { .. }) => {
            println!("the whole rank refused ({e}): its first 40 layers instead");
            let first = whole.first_layers(40).unwrap();
            let w = generate(&dev, &first, 8, 3, WeightFormat::Fp8);
            (w, "glm-5.2's first 40 layers")
        }
        Err(e) => panic!("{e}"),
    };
    let secs = started.elapsed().as_secs_f64();
    let samples: Vec<&str> = GLM52_SAMPLES
        .into_iter()
        .filter(|name| w.plan.get(name).is_some())
        .collect();
    assert!(
        samples.len() >= 10,
        "{label} holds {samples:?} of the samples"
    );
    let n = check_tensors(&w, &samples);
    // The embedding is too large to remake on the CPU whole: rows from its start and end.
    let embed = w.tensor("model.embed_tokens.weight").unwrap();
    let rule = SyntheticRule::new(11, &embed.name, &embed.sources[0].full_shape);
    let cols = embed.sources[0].cols;
    for row in [0usize, 77_777, embed.sources[0].rows - 1] {
        let at = embed.offset + row * cols * 2;
        let got = w.arena.download_range(at..at + cols * 2).unwrap();
        let want: Vec<u8> = (0..cols as u64)
            .flat_map(|c| {
                ((rule.value(row as u64 * cols as u64 + c).to_bits() >> 16) as u16).to_le_bytes()
            })
            .collect();
        assert!(got == want, "embedding row {row} differs from the CPU's");
    }
    println!(
        "{label} TP 8 rank 3 FP8: {:.2} GB in {} tensors made in {secs:.1} s; {n} sampled tensors and 3 embedding rows equal the CPU's",
        w.plan.bytes as f64 / 1e9,
        w.plan.tensors.len()
    );
    drop(w);

    // A rank that cannot fit is refused before any allocation.
    let glm5 = ModelConfig::preset("glm-5").unwrap();
    let plan = WeightPlan::new(&glm5, 1, 0, WeightFormat::Fp8).unwrap();
    let kernels = WeightKernels::build(&dev).unwrap();
    match DeviceWeights::generate(&dev, &kernels, plan, 1, &mut |_| {
        panic!("no progress when refused")
    }) {
        Err(e @ StepError::Memory { .. }) => println!("glm-5 TP 1 refused: {e}"),
        Err(e) => panic!("expected the memory error, got {e}"),
        Ok(_) => panic!("glm-5 TP 1 does not fit one GPU (with {RESERVE_BYTES} bytes to spare)"),
    }
}

/// A stand-in for the tail: each row's "argmax" a hash of its token and position.
struct ToyTail<'a> {
    kernel: &'a Kernel,
    inputs: &'a StepInputs,
    vocab: u32,
}

const TOY_TAIL: &str = r#"
#include "prelude.h"
MONO_KERNEL void toy_tail(const i32* tokens, const i32* positions, i32* argmax, u32 rows, u32 vocab) {
  const u32 r = mono_block() * mono_block_dim() + mono_thread();
  if (r >= rows) return;
  u64 z = ((u64)(u32)tokens[r] << 32) ^ (u64)(u32)positions[r];
  z = (z ^ (z >> 29)) * 0xBF58476D1CE4E5B9ull;
  argmax[r] = (i32)((z ^ (z >> 32)) % vocab);
}
"#;

fn toy_argmax(tokens: &[i32], positions: &[i32], vocab: u32) -> Vec<i32> {
    tokens
        .iter()
        .zip(positions)
        .map(|(&t, &p)| {
            let mut z = ((t as u32 as u64) << 32) ^ (p as u32 as u64);
            z = (z ^ (z >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            ((z ^ (z >> 32)) % vocab as u64) as i32
        })
        .collect()
}

impl StepLaunch for ToyTail<'_> {
    fn name(&self) -> String {
        "toy tail".into()
    }
    fn kind(&self) -> String {
        "toy tail".into()
    }
    fn enqueue(&self, stream: &Stream) -> Result<(), StepError> {
        let rows = self.inputs.rows() as u32;
        let args = Args::new()
            .buf(&self.inputs.tokens)
            .buf(&self.inputs.positions)
            .buf(&self.inputs.argmax)
            .u32(rows)
            .u32(self.vocab);
        Ok(stream.launch(
            self.kernel,
            Launch::new(1, rows.next_multiple_of(32)),
            &args,
        )?)
    }
    fn outputs(&self) -> Vec<Output<'_>> {
        vec![Output::new("argmax", &self.inputs.argmax)]
    }
}

fn variant() -> Variant {
    Variant {
        debug: Some(DebugBound {
            poll_limit: 1 << 24,
            trap: false,
        }),
        ..Variant::default()
    }
}

/// Whether every front launch's lists equal the reference select of its own scores.
fn lists_match(graph: &StepGraph, fronts: &[FrontGraph]) -> bool {
    fronts.iter().zip(graph.launches()).all(|(fg, launch)| {
        let out = launch.outputs();
        let words = |i: usize| -> Vec<[u8; 4]> {
            out[i]
                .data
                .bytes()
                .unwrap()
                .chunks_exact(4)
                .map(|b| [b[0], b[1], b[2], b[3]])
                .collect()
        };
        let scores: Vec<f32> = words(0).into_iter().map(f32::from_le_bytes).collect();
        let lists: Vec<i32> = words(1).into_iter().map(i32::from_le_bytes).collect();
        let requests = fg.row_requests();
        let rows = Rows {
            scores: &scores,
            stride: fg.plan.stride as usize,
            lens: &fg.lens,
        };
        let want = select_rows(
            &rows,
            fg.top,
            Some(&RowPages {
                table: &fg.pages,
                requests: &requests,
            }),
        )
        .unwrap();
        lists == want
    })
}

struct Run {
    eager: Dump,
    after: Dump,
    lists_ok: bool,
}

/// Builds the step, runs it once directly and `replays` times from the graph, checking the fed
/// inputs against the CPU twin after each.
fn run_step(dev: &Device, cfg: &ModelConfig, kernel: &FrontKernel, replays: u32) -> Run {
    let requests = [
        SceneRequest {
            context: 8000,
            rows: 4,
        },
        SceneRequest {
            context: 3000,
            rows: 1,
        },
    ];
    let vocab = cfg.vocab_size as u32;
    let scene = FrontScene::new(dev, cfg, kernel, &requests, 5).unwrap();
    let batch = scene.batch(5, cfg.vocab_size);
    let inputs = StepInputs::new(dev, &batch).unwrap();
    let toy_module: Module = dev
        .build(&KernelSource::new("toy_tail.hip", TOY_TAIL))
        .unwrap();
    let toy_kernel = toy_module.kernel("toy_tail").unwrap();
    let feed_kernel = FeedKernel::build(dev).unwrap();
    let fronts = scene.launch_count();
    let frame = StepFrame::new(dev, fronts + 1, scene.scratch_boxes()).unwrap();
    let mut launches = scene.launches(dev, kernel, &frame, 0).unwrap();
    launches.push(Box::new(ToyTail {
        kernel: &toy_kernel,
        inputs: &inputs,
        vocab,
    }));
    let feed = Feed {
        kernel: &feed_kernel,
        inputs: &inputs,
    };
    let mut graph = StepGraph::new(dev, frame, launches, Some(feed), variant()).unwrap();
    let mut host = HostRows::new(&batch).unwrap();
    let advance = |host: &mut HostRows| {
        let argmax = toy_argmax(&host.tokens, &host.positions, vocab);
        *host = host.fed(&argmax, &batch);
    };
    let eager = match graph.dump_step() {
        Ok(d) => d,
        Err(e) => panic!("the eager step: {e}"),
    };
    advance(&mut host);
    assert_eq!(
        inputs.read().unwrap(),
        host,
        "the fed inputs after the eager step"
    );
    graph.capture().unwrap();
    for step in 1..=replays {
        graph.replay(1).unwrap();
        advance(&mut host);
        assert_eq!(
            inputs.read().unwrap(),
            host,
            "the fed inputs after replay {step}"
        );
    }
    assert_eq!(
        graph.frame().epoch().unwrap(),
        1 + replays,
        "one epoch a step"
    );
    let lists_ok = lists_match(&graph, scene.graphs());
    let after = graph.digest_now().unwrap();
    println!(
        "{} launches a step ({fronts} front halves, the toy tail) and the feed; {replays} replays; tokens now {:?}",
        graph.launches().len(),
        host.tokens
    );
    Run {
        eager,
        after,
        lists_ok,
    }
}

/// The front halves' entries of a dump.
fn fronts_of(d: &Dump) -> Dump {
    Dump {
        header: Vec::new(),
        launches: d
            .launches
            .iter()
            .filter(|l| l.name.ends_with("front half"))
            .cloned()
            .collect(),
    }
}

#[test]
#[ignore = "needs a GPU"]
fn the_captured_step_replays_bit_for_bit_and_feeds_greedy_tokens() {
    let dev = gpu();
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let kernel = FrontKernel::build(&dev, &cfg, variant(), None).unwrap();
    let a = run_step(&dev, &cfg, &kernel, 3);
    let b = run_step(&dev, &cfg, &kernel, 3);
    assert!(
        a.lists_ok && b.lists_ok,
        "lists against the reference select of their scores"
    );
    let two_runs = compare(&a.after, &b.after);
    assert!(
        matches!(two_runs, Comparison::Equal { .. }),
        "two runs: {two_runs}"
    );
    let replayed = compare(&fronts_of(&a.eager), &fronts_of(&a.after));
    assert!(
        matches!(replayed, Comparison::Equal { .. }),
        "replays against the eager step: {replayed}"
    );
    println!("two runs: {two_runs}; replays against the eager step's front halves: {replayed}");

    // Negative control: select tasks that do not wait for the scores.
    let faulty =
        FrontKernel::build(&dev, &cfg, variant(), Some(FrontFault::SelectSkipsWait)).unwrap();
    let f = run_step(&dev, &cfg, &faulty, 1);
    let caught = compare(&a.eager, &f.eager);
    println!("skipped waits against the real step: {caught}");
    match caught {
        Comparison::Differ { launch, tensor, .. } => {
            assert!(launch.1.ends_with("front half"), "{}", launch.1);
            assert_eq!(tensor.as_deref(), Some("top-k slots"));
        }
        Comparison::Equal { .. } => panic!("skipped waits were not caught by the digests"),
    }
}

#[path = "support/greedy.rs"]
mod greedy;

/// The greedy check's own negative controls, on the CPU: the reference's picks, logits, rows,
/// scores and lists pass it; one pick changed (its logits the reference's, so no error explains
/// it) is caught at that pick, over the free-running decoding and over the same rows; one list
/// with a listed key swapped for the row's lowest-scored one, and a finite score past a row's
/// position, are caught at that step, layer and row.
#[test]
fn the_greedy_check_catches_a_wrong_pick_list_or_score() {
    use greedy::{
        first_difference, over_the_same_rows, picks_of, reference_as_device, reference_greedy, Case,
    };
    let case = Case {
        contexts: vec![62, 5],
        rows: 2,
        steps: 3,
    };
    let want = reference_greedy(&case);
    let steps = reference_as_device(&case);
    assert_eq!(first_difference(&picks_of(&steps), &want), None);
    let same = over_the_same_rows(&case, &steps);
    assert!(
        same.passes() && same.flips.is_empty() && same.list_flips.is_empty(),
        "{}\n{}",
        same.summary(),
        same.details().join("\n")
    );
    assert_eq!(same.lists, 3 * 4 * 3, "3 full layers x 4 rows x 3 steps");
    assert_eq!(same.routes, 4 * 4 * 3, "4 MoE layers x 4 rows x 3 steps");

    let mut picked = steps.clone();
    picked[1].picks[2] = (picked[1].picks[2] + 1) % 2048;
    let free = first_difference(&picks_of(&picked), &want).expect("a changed pick");
    assert!(free.starts_with("step 1, row 2:"), "{free}");
    let same = over_the_same_rows(&case, &picked);
    assert!(!same.passes(), "{}", same.summary());
    assert!(
        matches!(same.flips.first(), Some(f) if (f.step, f.row) == (1, 2) && f.gap >= f.margin && !f.explained()),
        "{:?}",
        same.flips
    );

    // Row 0 of the first full layer at step 1: its last listed key swapped for its lowest-scored.
    let (layer, row, k) = (0, 0, 16);
    let mut listed = steps.clone();
    let front = listed[1].layers[layer].front.as_mut().unwrap();
    let stride = front.scores.len() / 4;
    let scores = &front.scores[row * stride..(row + 1) * stride];
    let lowest = (0..=63usize)
        .min_by(|&a, &b| scores[a].total_cmp(&scores[b]))
        .unwrap();
    // Request 0's pages are [1, 0]: position p < 64 is slot 64 + p.
    front.lists[row * k + k - 1] = 64 + lowest as i32;
    let same = over_the_same_rows(&case, &listed);
    assert!(!same.passes(), "{}", same.summary());
    assert!(
        matches!(same.list_flips.first(), Some(f) if (f.step, f.layer, f.row) == (1, layer, row) && f.device_only == vec![lowest as i32] && !f.explained()),
        "{:?}",
        same.list_flips
    );

    // Row 1 of the first MoE layer (2) at step 2: its last expert swapped for its lowest-scored.
    let mut routed = steps.clone();
    let route = routed[2].layers[2].route.as_mut().unwrap();
    let (experts, top) = (16, 4);
    let row_scores = &route.scores[experts..2 * experts];
    let lowest = (0..experts)
        .min_by(|&a, &b| row_scores[a].total_cmp(&row_scores[b]))
        .unwrap();
    route.experts[top + top - 1] = lowest as u32;
    let same = over_the_same_rows(&case, &routed);
    assert!(!same.passes(), "{}", same.summary());
    assert!(
        matches!(same.route_flips.first(), Some(f) if (f.step, f.layer, f.row) == (2, 2, 1) && f.device_only == vec![lowest as i32] && !f.explained()),
        "{:?}",
        same.route_flips
    );
    assert!(
        same.faults
            .iter()
            .any(|f| f.starts_with("step 2 layer 2 row 1: the device routes to")),
        "{:?}",
        same.faults
    );

    let mut past = steps;
    let front = past[2].layers[4].front.as_mut().unwrap();
    // Row 3 (request 1, position 5 + 2 x 2 + 1 = 10) scores position 11.
    front.scores[3 * stride + 11] = 0.5;
    let same = over_the_same_rows(&case, &past);
    assert!(!same.passes(), "{}", same.summary());
    assert!(
        same.faults
            .iter()
            .any(|f| f.starts_with("step 2 layer 4 row 3: a finite score at position 11")),
        "{:?}",
        same.faults
    );
}

/// The whole tiny step on the GPU (every layer's launch, the tail, the greedy feed), captured once
/// and replayed for 16 greedy steps with 1 and 4 rows a request and 1 and 3 requests (contexts
/// that cross page boundaries, one shorter than k). The replays equal the same steps run launch by
/// launch, bit for bit; those are checked against the CPU reference stepped over the same rows and
/// the same discrete choices (each full-indexer layer's top-k lists, each MoE layer's experts, as
/// the device made them): every layer's rows and every row's logits within the layers' tolerance
/// (relative L2 3e-2), every pick the argmax of the device's own logits, every list the select of
/// its launch's own scores, and every pick, list or route that is not the reference's own choice
/// a near-tie (the reference's gap between the two at most the device's measured error on them).
/// Without the shared choices, one near-tie at the 16th key (the indexer's FP8 scores) sends the
/// two to attend over different keys and cache different entries, and they part for good. The
/// free-running greedy decodings are compared beside it. Negative control: the launches planned at
/// the first step's positions fail that check, in every case.
#[test]
#[ignore = "needs a GPU"]
fn sixteen_replayed_greedy_steps_follow_the_reference_on_the_gpu() {
    use greedy::{device_greedy, over_the_same_rows, Case, Kernels, Planning, Steps};
    let dev = gpu();
    let mut kernels = Kernels::default();
    let mut failures = Vec::new();
    for (contexts, rows) in [
        (vec![50], 1),
        (vec![50], 4),
        (vec![50, 20, 3], 1),
        (vec![50, 20, 3], 4),
    ] {
        let case = Case {
            contexts,
            rows,
            steps: 16,
        };
        let started = Instant::now();
        match greedy::check(&dev, &mut kernels, &case) {
            Ok(line) => println!("{line} ({:.1} s)", started.elapsed().as_secs_f64()),
            Err(e) => {
                println!("FAILED {e}");
                failures.push(e);
            }
        }
        let old = device_greedy(
            &dev,
            &mut kernels,
            &case,
            Planning::FirstPositions,
            Steps::Inspected,
        );
        let same = over_the_same_rows(&case, &old);
        match same.passes() {
            false => println!(
                "  planned at the first step's positions: caught, {}",
                same.summary()
            ),
            true => {
                let e = format!(
                    "{}: launches planned at the first step's positions passed the check",
                    case.name()
                );
                println!("FAILED {e}");
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
