//! The step's device side on the host backend (a device emulated on CPU threads from the kernels'
//! own source, `device::host`), at the tiny preset:
//!
//! * the weights every part of every layer reads, bound from one rank's synthetic weights on the
//!   device: the derived forms (W_UK\[h\]ᵀ padded and W_UV\[h\] of every head, the router's
//!   k-splits) equal those packed on the CPU from the reference model's own matrices; a rank
//!   missing one expert's tensor is refused, the error naming it;
//! * the caches of the reference's own prefill, placed through a shuffled page table;
//! * the whole step, every launch chained (embedding, full-indexer layers with select publishing
//!   in the launch, shared-indexer layers, dense MLP and MoE, the tail), each layer's rows against
//!   the reference step's (engine numerics, a bf16 MLA cache: the tiny FP8 record is not whole
//!   16-byte pieces) and the tail's tokens equal to the reference's; the tail alone from the
//!   reference's rows with the greedy feed; a launch bound to a wrong tensor refused by name.
//!
//! `MONO_BACKEND=cuda` runs them on a GPU instead. Needs g++ with C++20, so ignored:
//! `cargo test --release -p executor --test layer_host -- --ignored --nocapture`

use device::{BackendChoice, Device};
use executor::reference::{DecodeState, ReferenceModel, ReferenceOptions, Row};
use executor::step::layer::{CacheImages, MlpWeights, ModelWeights};
use executor::step::weights::{DeviceWeights, WeightPlan};
use mla::HeadLayout;
use model::paging::PageTable;
use model::weights::packed::{pack, Pairing, SourceWeight};
use model::weights::Synthetic;
use model::{CacheFormat, ModelConfig, WeightFormat};

const SEED: u64 = 5;

/// The host backend; `MONO_BACKEND=cuda` runs the same checks on a GPU.
fn host() -> Device {
    match std::env::var("MONO_BACKEND").as_deref() {
        Ok("cuda") => Device::open_with(0, BackendChoice::Cuda).expect("a GPU"),
        _ => Device::open_with(0, BackendChoice::Host).expect("the host backend"),
    }
}

fn weights(dev: &Device, cfg: &ModelConfig) -> DeviceWeights {
    let plan = WeightPlan::new(cfg, 1, 0, WeightFormat::Bf16).unwrap();
    DeviceWeights::from_host(dev, plan, SEED).unwrap()
}

fn reference(cfg: &ModelConfig) -> ReferenceModel {
    let source = Synthetic::new(cfg, SEED, WeightFormat::Bf16).unwrap();
    ReferenceModel::load(cfg, &source).unwrap()
}

fn bf16(v: &[f32]) -> Vec<u16> {
    // Synthetic bf16 weights are bf16-exact.
    v.iter().map(|x| (x.to_bits() >> 16) as u16).collect()
}

fn packed(rows: usize, cols: usize, values: &[f32]) -> Vec<u8> {
    let bits = bf16(values);
    pack(
        Pairing::Plain,
        &[SourceWeight::Bf16 {
            rows,
            cols,
            bits: &bits,
        }],
    )
    .unwrap()
    .bytes
}

#[test]
#[ignore = "needs g++ (host emulation)"]
fn every_layer_binds_and_the_derived_forms_equal_the_references() {
    let dev = host();
    let cfg = ModelConfig::preset("tiny").unwrap();
    let w = weights(&dev, &cfg);
    let bound = ModelWeights::bind(&dev, &cfg, &w).unwrap();
    let model = reference(&cfg);
    let forms = bound.forms.buffer.download().unwrap();
    let base = bound.forms.buffer.device_ptr();
    let at = |ptr: u64, len: usize| &forms[(ptr - base) as usize..(ptr - base) as usize + len];
    let heads = HeadLayout::new(&cfg);
    let (latent, nope) = (cfg.kv_lora_rank, cfg.qk_nope_head_dim);
    let uk_k = nope.next_multiple_of(128);
    let mut checked = 0;
    for (layer, lw) in bound.layers.iter().enumerate() {
        let kv_b = &model.layers[layer].mla.kv_b;
        for h in 0..heads.heads {
            let mut uk = vec![0f32; latent * uk_k];
            for (i, r) in heads.uk_rows(h).enumerate() {
                for c in 0..latent {
                    uk[c * uk_k + i] = kv_b.data()[r * latent + c];
                }
            }
            let want = packed(latent, uk_k, &uk);
            let m = lw.attention.matrices[3 + h];
            assert_eq!(at(m.w, want.len()), want, "layer {layer} W_UK[{h}]");
            let rows = heads.uv_rows(h);
            let uv = &kv_b.data()[rows.start * latent..rows.end * latent];
            let want = packed(cfg.v_head_dim, latent, uv);
            let m = lw.attention.matrices[3 + heads.heads + h];
            assert_eq!(at(m.w, want.len()), want, "layer {layer} W_UV[{h}]");
            checked += 2;
        }
        if let (MlpWeights::Moe(moe), executor::reference::MlpBlock::Moe(r)) =
            (&lw.mlp, &model.layers[layer].mlp)
        {
            let (e, hidden) = (cfg.n_routed_experts, cfg.hidden_size);
            let k = hidden / moe.router.len();
            for (s, split) in moe.router.iter().enumerate() {
                let values: Vec<f32> = (0..e)
                    .flat_map(|row| r.router.gate.data()[row * hidden + s * k..][..k].to_vec())
                    .collect();
                let want = packed(e, k, &values);
                assert_eq!(
                    at(split.w, want.len()),
                    want,
                    "layer {layer} router split {s}"
                );
                checked += 1;
            }
            assert_eq!(moe.gate_up.experts as usize, e);
        }
        assert_eq!(lw.indexer.is_some(), model.layers[layer].indexer.is_some());
    }
    eprintln!("{checked} derived forms equal the reference's packed matrices");

    // A rank without one expert's down projection is refused by name.
    let mut broken = w;
    let gone = "model.layers.3.mlp.experts.5.down_proj.weight";
    broken.plan.tensors.retain(|t| t.name != gone);
    let err = ModelWeights::bind(&dev, &cfg, &broken)
        .err()
        .expect("a missing tensor");
    assert!(err.to_string().contains(gone), "{err}");
}

#[test]
#[ignore = "needs g++ (host emulation)"]
fn the_references_prefill_lands_in_the_device_caches_through_the_page_table() {
    let dev = host();
    let cfg = ModelConfig::preset("tiny").unwrap();
    let model = reference(&cfg);
    let options = ReferenceOptions::engines(&cfg);
    let contexts = [70usize, 5];
    let mut state = DecodeState::new(&model, contexts.len(), options).unwrap();
    for (q, &n) in contexts.iter().enumerate() {
        let rows: Vec<Row> = (0..n)
            .map(|p| Row {
                request: q,
                token: ((p * 37 + q * 11) % cfg.vocab_size) as u32,
                position: p,
            })
            .collect();
        model.step(&mut state, &rows).unwrap();
    }
    // Request 0 on pages 3 and 0, request 1 on page 2 (page 1 unused).
    let table = PageTable::new(&[vec![3, 0], vec![2]]).unwrap();
    let images = CacheImages::from_reference(&cfg, CacheFormat::Fp8, &state, &table).unwrap();
    let caches = images.upload(&dev).unwrap();
    let record = images.mla.bytes_per_token();
    for (l, layer) in caches.layers.iter().enumerate() {
        let mla = layer.mla.download().unwrap();
        for (q, &n) in contexts.iter().enumerate() {
            let want = state.mla_bytes(q, l).unwrap();
            for t in 0..n {
                let slot = table.slot(q, t as u32).unwrap() as usize;
                assert_eq!(
                    &mla[slot * record..(slot + 1) * record],
                    &want[t * record..(t + 1) * record],
                    "layer {l}, request {q}, token {t}"
                );
            }
            if let (Some(keys), Some(cache)) = (state.index_keys(q, l), &layer.index_keys) {
                let cache = cache.download().unwrap();
                let (page, place) = table.locate(q, (n - 1) as u32).unwrap();
                let at = images.index.key_offset(page, place) as usize;
                let key = &keys[n - 1];
                assert_eq!(&cache[at..at + key.values.len()], key.codes().as_slice());
                let s = images.index.scale_offset(page, place) as usize;
                assert_eq!(cache[s..s + 4], key.scale.to_le_bytes());
            }
        }
        // The unused page stays zero.
        assert!(mla[64 * record..128 * record].iter().all(|&b| b == 0));
    }
    // A table too short for the cached tokens is refused.
    let short = PageTable::new(&[vec![0], vec![1]]).unwrap();
    let err = CacheImages::from_reference(&cfg, CacheFormat::Fp8, &state, &short).unwrap_err();
    assert!(err.to_string().contains("past its pages"), "{err}");
}

/// The reference's caches after `contexts[q]` tokens of request q, the step's next tokens.
struct Prefilled {
    state: DecodeState,
    next: Vec<u32>,
}

fn prefill(
    cfg: &ModelConfig,
    model: &ReferenceModel,
    contexts: &[usize],
    options: ReferenceOptions,
) -> Prefilled {
    let mut state = DecodeState::new(model, contexts.len(), options).unwrap();
    let token = |q: usize, p: usize| ((p * 37 + q * 11 + 5) % cfg.vocab_size) as u32;
    for (q, &n) in contexts.iter().enumerate() {
        let rows: Vec<Row> = (0..n)
            .map(|p| Row {
                request: q,
                token: token(q, p),
                position: p,
            })
            .collect();
        model.step(&mut state, &rows).unwrap();
    }
    Prefilled {
        state,
        next: contexts
            .iter()
            .enumerate()
            .map(|(q, &n)| token(q, n))
            .collect(),
    }
}

fn bf16_value(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Largest relative L2 error over rows of `got` (bf16 bytes, `[rows][hidden]`) against `want`.
fn rows_error(got: &[u8], want: &[Vec<f32>]) -> f64 {
    let hidden = want[0].len();
    want.iter()
        .enumerate()
        .map(|(r, w)| {
            let (mut diff, mut norm) = (0f64, 0f64);
            for (c, &e) in w.iter().enumerate() {
                let at = 2 * (r * hidden + c);
                let o = f64::from(bf16_value(u16::from_le_bytes([got[at], got[at + 1]])));
                diff += (o - f64::from(e)).powi(2);
                norm += f64::from(e).powi(2);
            }
            if diff.is_nan() {
                f64::INFINITY
            } else {
                (diff / norm.max(1e-30)).sqrt()
            }
        })
        .fold(0.0, f64::max)
}

/// The tiny step of `contexts` on the host backend, against the reference's step.
struct Scene {
    cfg: ModelConfig,
    pre: Prefilled,
    table: PageTable,
    batch: executor::step::inputs::Batch,
    /// The reference's step over the batch's rows.
    want: executor::reference::StepOutput,
}

fn scene(contexts: &[usize]) -> Scene {
    use executor::step::inputs::{Batch, RequestInput};
    let cfg = ModelConfig::preset("tiny").unwrap();
    let model = reference(&cfg);
    let mut options = ReferenceOptions::engines(&cfg);
    // The tiny preset's FP8 MLA record (328 bytes) is not whole 16-byte pieces, which the
    // attention reads: its cache is bf16.
    options.mla_cache = mla::reference::CacheStore::Format(CacheFormat::Bf16);
    let pre = prefill(&cfg, &model, contexts, options);
    // Each request on pages of its own, in reverse, so slots are not positions.
    let mut next = 0;
    let pages: Vec<Vec<u32>> = contexts
        .iter()
        .map(|&n| {
            let count = model::paging::pages_through(n as u32) as u32;
            let p: Vec<u32> = (next..next + count).rev().collect();
            next += count;
            p
        })
        .collect();
    let table = PageTable::new(&pages).unwrap();
    let batch = Batch {
        requests: contexts
            .iter()
            .enumerate()
            .map(|(q, &n)| RequestInput {
                tokens: vec![pre.next[q]],
                first_position: n as u32,
                pages: pages[q].clone(),
            })
            .collect(),
        page_tokens: model::paging::PAGE_TOKENS,
        pages_per_request: pages.iter().map(Vec::len).max().unwrap() as u32,
    };
    let mut state = pre.state.clone();
    let rows: Vec<Row> = contexts
        .iter()
        .enumerate()
        .map(|(q, &n)| Row {
            request: q,
            token: pre.next[q],
            position: n,
        })
        .collect();
    let want = model.step(&mut state, &rows).unwrap();
    Scene {
        cfg,
        pre,
        table,
        batch,
        want,
    }
}

fn bf16_bytes(rows: &[Vec<f32>]) -> Vec<u8> {
    rows.iter()
        .flatten()
        .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
        .collect()
}

/// Launches `ats` of the tiny step of `s` (in that order, one step graph), each fused launch on
/// CPU threads fed the reference's own inputs (the rows before each layer and before the tail,
/// the slots each layer's selection chose), with the greedy feed last; each launch's first
/// output, and the inputs after the feed.
fn run_from_reference(
    s: &Scene,
    ats: &[executor::fused::layer::LaunchAt],
) -> (Vec<(String, Vec<u8>)>, executor::step::HostRows) {
    use executor::fused::layer::{LaunchAt, LayerPlan};
    use executor::step::inputs::{FeedKernel, StepInputs};
    use executor::step::layer::step::{
        front_requests, step_build, step_graph, StepArena, StepKernels, StepPieces,
    };
    let dev = host();
    let cfg = &s.cfg;
    let images =
        CacheImages::from_reference(cfg, CacheFormat::Bf16, &s.pre.state, &s.table).unwrap();
    let caches = images.upload(&dev).unwrap();
    let w = weights(&dev, cfg);
    let bound = ModelWeights::bind(&dev, cfg, &w).unwrap();
    let build = step_build(&dev, cfg, &s.batch, &bound, CacheFormat::Bf16, caches.pages);
    let requests = front_requests(&s.batch);
    let plans: Vec<LayerPlan> = ats
        .iter()
        .map(|&at| LayerPlan::plan(cfg, at, &requests, &build).unwrap())
        .collect();
    // Debug builds: a wait that gives up names its task instead of hanging the run.
    let variant = mailbox::gpu::Variant {
        debug: Some(mailbox::gpu::DebugBound {
            poll_limit: 1 << 20,
            trap: false,
        }),
        ..Default::default()
    };
    let kernels = StepKernels::build(&dev, cfg, &build, &plans, variant).unwrap();
    let arena = StepArena::new(&dev, cfg, &plans).unwrap();
    let slices = plans[0].slices;
    let mut bytes = arena.arena.download().unwrap();
    let mut put = |offset: u64, data: &[u8]| {
        bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    };
    let topk = cfg.index_topk;
    for &at in ats {
        let i = match at {
            LaunchAt::Layer(i) => i,
            LaunchAt::Tail => cfg.num_hidden_layers,
        };
        if i > 0 {
            put(
                slices.hidden_in(i).offset,
                &bf16_bytes(&s.want.hidden[i - 1]),
            );
        }
        if i < cfg.num_hidden_layers {
            let mut lists = Vec::new();
            for (row, list) in s.want.topk[i].iter().enumerate() {
                assert_eq!(list.len(), topk);
                lists.extend(list.iter().map(|&p| {
                    if p < 0 {
                        -1
                    } else {
                        s.table.slot(row, p as u32).unwrap()
                    }
                }));
            }
            put(slices.slot_lists.offset, bytemuck::cast_slice(&lists));
        }
    }
    arena.arena.write(&bytes).unwrap();
    let inputs = StepInputs::new(&dev, &s.batch).unwrap();
    let feed = FeedKernel::build(&dev).unwrap();
    let pieces = StepPieces {
        cfg,
        build: &build,
        kernels: &kernels,
        weights: &bound,
        caches: &caches,
        arena: &arena,
        inputs: &inputs,
        feed: Some(&feed),
        variant,
    };
    let graph = step_graph(&dev, &pieces, plans).unwrap();
    let mut out = Vec::new();
    let ran = graph.run_inspected(&mut |_, launch| {
        out.push((launch.name(), launch.outputs()[0].data.bytes()?));
        Ok(())
    });
    if let Err(e) = ran {
        eprintln!("the step stopped: {e}");
    }
    (out, inputs.read().unwrap())
}

fn u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The tail as one fused launch on CPU threads (final norm, lm_head, argmax, pick) from the
/// reference's last rows, two requests: the reference's greedy tokens, which the feed moves into
/// the next step's inputs.
#[test]
#[ignore = "needs g++ (host emulation)"]
fn the_tail_picks_the_references_tokens_and_the_feed_takes_them() {
    use executor::fused::layer::LaunchAt;
    let s = scene(&[20, 3]);
    let (out, fed) = run_from_reference(&s, &[LaunchAt::Tail]);
    let tokens = u32s(&out[0].1);
    eprintln!(
        "tail: tokens {tokens:?}, the reference's {:?}",
        s.want.argmax
    );
    assert_eq!(tokens, s.want.argmax);
    assert_eq!(
        fed.tokens,
        s.want.argmax.iter().map(|&t| t as i32).collect::<Vec<_>>()
    );
    assert_eq!(fed.positions, vec![21, 4]);
}

/// The whole step, every launch chained as the step runs them, each one fused launch on CPU
/// threads: layer 0 (the embedding of the step's tokens, a full indexer's projections, index keys,
/// queries, scores and top-k, attention over the lists select publishes in the launch, the dense
/// MLP), layer 1 (the same from layer 0's rows), layers 2 and 3 (MoE layers reusing layer 1's
/// lists from the step's slot lists), layer 4 (a full-indexer MoE layer), layer 5, the tail. Each
/// layer's rows within [`TOLERANCE`] of the reference's, the tail's tokens the reference's.
#[test]
#[ignore = "needs g++ (host emulation)"]
fn the_step_of_every_launch_follows_the_reference() {
    use executor::fused::layer::LaunchAt;
    // One request: the host backend's 4 CTAs take a front half of one row.
    let s = scene(&[20]);
    let ats: Vec<LaunchAt> = (0..s.cfg.num_hidden_layers)
        .map(LaunchAt::Layer)
        .chain([LaunchAt::Tail])
        .collect();
    let (out, _) = run_from_reference(&s, &ats);
    assert_eq!(out.len(), ats.len(), "the step stopped early");
    let layers = s.cfg.num_hidden_layers;
    for (i, (name, bytes)) in out.iter().enumerate().take(layers) {
        let error = rows_error(bytes, &s.want.hidden[i]);
        eprintln!("{name}: rows within {error:.2e} of the reference");
        assert!(error < TOLERANCE, "{name}: {error:.2e}");
    }
    let tokens = u32s(&out[layers].1);
    eprintln!(
        "tail: tokens {tokens:?}, the reference's {:?}",
        s.want.argmax
    );
    assert_eq!(tokens, s.want.argmax);
}

/// Largest relative L2 error of a layer's output rows against the reference's (engine numerics:
/// bf16 activations; the kernels sum in fp32 in their own order where the reference sums in f64,
/// and round intermediates to bf16 where it does; the attention half's own tolerance is 3e-2).
const TOLERANCE: f64 = 3e-2;

/// Negative control of the binding: a tail whose lm_head is bound at another tensor (the
/// embedding) is refused before anything runs, the error naming the tensor it should read.
#[test]
#[ignore = "needs g++ (host emulation)"]
fn a_launch_bound_to_the_wrong_tensor_is_refused_by_name() {
    use executor::fused::layer::{LaunchAt, LayerPlan};
    use executor::step::inputs::StepInputs;
    use executor::step::layer::step::{
        front_requests, step_build, step_graph, StepArena, StepKernels, StepPieces,
    };
    let s = scene(&[20]);
    let cfg = &s.cfg;
    let dev = host();
    let images =
        CacheImages::from_reference(cfg, CacheFormat::Bf16, &s.pre.state, &s.table).unwrap();
    let caches = images.upload(&dev).unwrap();
    let w = weights(&dev, cfg);
    let mut bound = ModelWeights::bind(&dev, cfg, &w).unwrap();
    bound.tail.lm_head = bound.embedding;
    let build = step_build(&dev, cfg, &s.batch, &bound, CacheFormat::Bf16, caches.pages);
    let plans =
        vec![LayerPlan::plan(cfg, LaunchAt::Tail, &front_requests(&s.batch), &build).unwrap()];
    let kernels = StepKernels::build(&dev, cfg, &build, &plans, Default::default()).unwrap();
    let arena = StepArena::new(&dev, cfg, &plans).unwrap();
    let inputs = StepInputs::new(&dev, &s.batch).unwrap();
    let pieces = StepPieces {
        cfg,
        build: &build,
        kernels: &kernels,
        weights: &bound,
        caches: &caches,
        arena: &arena,
        inputs: &inputs,
        feed: None,
        variant: Default::default(),
    };
    let err = step_graph(&dev, &pieces, plans)
        .err()
        .expect("a wrong lm_head");
    assert!(err.to_string().contains("lm_head.weight"), "{err}");
}
