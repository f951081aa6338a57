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
//!   reference's rows with the greedy feed; a launch bound to a wrong tensor refused by name;
//! * `mono check --weights` and `mono step --weights` on a checkpoint folder, end to end;
//! * the emulated grid sized for the rows, whether a command found no GPU or was sent to the host
//!   backend.
//!
//! `MONO_BACKEND=cuda` runs them on a GPU instead. Needs g++ with C++20, so ignored:
//! `cargo test --release -p executor --test layer_host -- --ignored --nocapture`

use device::{BackendChoice, Device};
use executor::fused::layer::LaunchAt;
use executor::reference::{DecodeState, ReferenceModel, ReferenceOptions, Row};
use executor::step::check::{compare_with_reference, run_launches, CheckScene, StepRun};
use executor::step::layer::{CacheImages, MlpWeights, ModelWeights};
use executor::step::scene::SceneRequest;
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

/// The tiny step of one row a request at `contexts` against the reference's step.
fn scene(contexts: &[usize]) -> CheckScene {
    let cfg = ModelConfig::preset("tiny").unwrap();
    let source = Synthetic::new(&cfg, SEED, WeightFormat::Bf16).unwrap();
    let requests: Vec<SceneRequest> = contexts
        .iter()
        .map(|&n| SceneRequest {
            context: n as u32,
            rows: 1,
        })
        .collect();
    CheckScene::new(&cfg, &source, &requests).unwrap()
}

/// Debug builds: a wait that gives up names its task instead of hanging the run. On CPU threads a
/// wait gives up once the launcher sees the launch make no progress; the count is a backstop only:
/// polls there sleep up to 200 us each, so 2^20 of them would give up after a few minutes on a
/// loaded machine where a launch takes longer (as `trace_host` did).
fn variant() -> mailbox::gpu::Variant {
    mailbox::gpu::Variant {
        debug: Some(mailbox::gpu::DebugBound {
            poll_limit: 1 << 26,
            trap: false,
        }),
        ..Default::default()
    }
}

/// Launches `ats` of the scene's step chained on the device (`step::check::run_launches`).
fn run(s: &CheckScene, ats: &[LaunchAt]) -> StepRun {
    let dev = host();
    let w = weights(&dev, &s.cfg);
    run_launches(&dev, s, &w, ats, variant(), &mut |_| Ok(())).unwrap()
}

/// The tail as one fused launch on CPU threads (final norm, lm_head, argmax, pick) from the
/// reference's last rows, two requests: the reference's greedy tokens, which the feed moves into
/// the next step's inputs.
#[test]
#[ignore = "needs g++ (host emulation)"]
fn the_tail_picks_the_references_tokens_and_the_feed_takes_them() {
    let s = scene(&[20, 3]);
    let out = run(&s, &[LaunchAt::Tail]);
    let report = compare_with_reference(&s, &out);
    eprint!("{report}");
    assert!(report.passed(), "{report}");
    let fed = out.fed.expect("the feed ran");
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
/// layer's rows within `step::check::TOLERANCE` of the reference's, the tail's tokens the
/// reference's.
#[test]
#[ignore = "needs g++ (host emulation)"]
fn the_step_of_every_launch_follows_the_reference() {
    // One request: the host backend's 4 CTAs take a front half of one row.
    let s = scene(&[20]);
    let out = run(&s, &s.every_launch());
    let report = compare_with_reference(&s, &out);
    eprint!("{report}");
    assert_eq!(out.launches.len(), s.every_launch().len(), "{report}");
    assert!(report.passed(), "{report}");
}

/// Negative control of the binding: a tail whose lm_head is bound at another tensor (the
/// embedding) is refused before anything runs, the error naming the tensor it should read.
#[test]
#[ignore = "needs g++ (host emulation)"]
fn a_launch_bound_to_the_wrong_tensor_is_refused_by_name() {
    use executor::fused::layer::LayerPlan;
    use executor::step::inputs::StepInputs;
    use executor::step::layer::step::{
        front_requests, step_build, step_graph, StepArena, StepKernels, StepPieces,
    };
    let s = scene(&[20]);
    let cfg = &s.cfg;
    let dev = host();
    let images = CacheImages::from_reference(cfg, s.cache, &s.prefilled, &s.table).unwrap();
    let caches = images.upload(&dev).unwrap();
    let w = weights(&dev, cfg);
    let mut bound = ModelWeights::bind(&dev, cfg, &w).unwrap();
    bound.tail.lm_head = bound.embedding;
    let build = step_build(&dev, cfg, &s.batch, &bound, s.cache, caches.pages);
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

/// A checkpoint on the device (`mono check --weights DIR`): the tiny synthetic weights written as
/// safetensors and read back through the loader give the bytes the host's rule makes, every
/// tensor, and bound, the derived forms (W_UK, W_UV, the router's splits, the key norm) made from
/// the checkpoint's values, not from the seed recorded beside them (the forms of that seed's
/// weights differ: the control); a bf16 tensor whose values are not bf16 is refused by name.
#[test]
#[ignore = "needs g++ (host emulation)"]
fn a_checkpoint_on_the_device_holds_the_synthetic_bytes() {
    use model::weights::{Checkpoint, WeightError, WeightSource};
    let dev = host();
    let cfg = ModelConfig::preset("tiny").unwrap();
    let dir = tiny_checkpoint("mono-check-weights");
    let checkpoint = Checkpoint::open(&dir).unwrap();
    let plan = || WeightPlan::new(&cfg, 1, 0, WeightFormat::Bf16).unwrap();
    let loaded =
        DeviceWeights::from_source(&dev, plan(), &checkpoint, SEED + 1, &mut |_| {}).unwrap();
    let made = weights(&dev, &cfg);
    assert!(loaded.arena.download().unwrap() == made.arena.download().unwrap());
    let forms = |w: &DeviceWeights| {
        let bound = ModelWeights::bind(&dev, &cfg, w).unwrap();
        bound.forms.buffer.download().unwrap()
    };
    assert!(
        forms(&loaded) == forms(&made),
        "the derived forms of the loaded checkpoint differ from those of its weights"
    );
    let other_seed = DeviceWeights::from_host(&dev, plan(), SEED + 1).unwrap();
    assert!(forms(&loaded) != forms(&other_seed));

    /// The checkpoint with one tensor's first value nudged off bf16.
    struct Nudged<'a>(&'a Checkpoint, &'static str);
    impl WeightSource for Nudged<'_> {
        fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightError> {
            let mut v = self.0.tensor(name, shape)?;
            if name == self.1 {
                v[0] = f32::from_bits(v[0].to_bits() | 1);
            }
            Ok(v)
        }
    }
    let name = "model.layers.2.self_attn.o_proj.weight";
    let err =
        DeviceWeights::from_source(&dev, plan(), &Nudged(&checkpoint, name), SEED, &mut |_| {})
            .err()
            .expect("a value off bf16");
    assert!(err.to_string().contains(name), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A published FP8 checkpoint on the device in the FP8 weight format: its block scales are the
/// blocks' amax / 448, not powers of two, so the device must keep its codes and scales as stored
/// rather than quantise its values again (`published_fp8_checkpoint`). Each FP8 tensor on the
/// device holds the checkpoint's codes and scales, packed, and the values kept for the derived
/// forms are the checkpoint's. The control: the same values quantised again (what a loader that
/// quantises the values it reads would store) differ on every FP8 tensor. The bf16 weight format
/// over the checkpoint is refused, naming a tensor and saying it is FP8.
#[test]
#[ignore = "needs g++ (host emulation)"]
fn a_published_fp8_checkpoint_reaches_the_device_as_stored() {
    use executor::step::weights::check::{first_difference, stored_form, stored_form_of};
    use executor::step::weights::Element;
    use model::weights::{Checkpoint, WeightSource};
    let dev = host();
    let cfg = ModelConfig::preset("tiny").unwrap();
    let dir = published_fp8_checkpoint("mono-fp8-as-stored");
    let checkpoint = Checkpoint::open(&dir).unwrap();

    let plan = |f| WeightPlan::new(&cfg, 1, 0, f).unwrap();
    let loaded = DeviceWeights::from_source(
        &dev,
        plan(WeightFormat::Fp8),
        &checkpoint,
        SEED,
        &mut |_| {},
    )
    .unwrap();
    let (mut fp8, mut requantised_differ) = (0, 0);
    for t in loaded
        .plan
        .tensors
        .iter()
        .filter(|t| t.element == Element::Fp8)
    {
        let (rows, cols) = t.shape();
        let stored: Vec<_> = t
            .sources
            .iter()
            .map(|s| checkpoint.fp8(&s.name, rows, cols).unwrap().expect("FP8"))
            .collect();
        let values: Vec<Vec<f32>> = stored.iter().map(|w| w.dequantise()).collect();
        let got = loaded.read(t).unwrap();
        let want = stored_form_of(t, &values, &stored).unwrap();
        if let Some(d) = first_difference(t, &got, &want) {
            panic!("the device does not hold the checkpoint's FP8 weight: {d}");
        }
        fp8 += 1;
        requantised_differ += usize::from(got != stored_form(t, &values).unwrap());
    }
    assert!(fp8 > 0, "the FP8 plan has FP8 tensors");
    assert_eq!(
        requantised_differ, fp8,
        "quantised again, each FP8 tensor changes"
    );
    let kv_b = "model.layers.1.self_attn.kv_b_proj.weight";
    let t = loaded.tensor(kv_b).unwrap();
    let (rows, cols) = t.shape();
    assert_eq!(
        loaded.stored_values(t).unwrap(),
        vec![checkpoint.tensor(kv_b, &[rows, cols]).unwrap()],
        "the derived forms read the checkpoint's values"
    );

    let refused = DeviceWeights::from_source(
        &dev,
        plan(WeightFormat::Bf16),
        &checkpoint,
        SEED,
        &mut |_| {},
    )
    .err()
    .expect("an FP8 checkpoint in the bf16 weight format")
    .to_string();
    eprintln!("bf16 weight format over an FP8 checkpoint: {refused}");
    assert!(
        refused.contains("model.layers.") && refused.contains("FP8 in the checkpoint"),
        "{refused}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Multiplies every `weight_scale_inv` of the safetensors file `path` by `factor`, in place.
fn scale_every_block(path: &std::path::Path, factor: f32) {
    use safetensors::tensor::TensorView;
    use safetensors::SafeTensors;
    let file = std::fs::read(path).unwrap();
    let tensors = SafeTensors::deserialize(&file).unwrap();
    let owned: Vec<(String, _, Vec<usize>, Vec<u8>)> = tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let mut bytes = view.data().to_vec();
            if name.ends_with("_scale_inv") {
                for b in bytes.chunks_exact_mut(4) {
                    let s = f32::from_le_bytes(b.try_into().unwrap()) * factor;
                    b.copy_from_slice(&s.to_le_bytes());
                }
            }
            (name, view.dtype(), view.shape().to_vec(), bytes)
        })
        .collect();
    let views: Vec<_> = owned
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            (
                name.as_str(),
                TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// `mono` on the host backend (`MONO_BACKEND=cuda` keeps the GPU) with `ctas` emulated CTAs.
fn mono(args: &[&std::ffi::OsStr], ctas: u32) -> (bool, String) {
    let backend = match std::env::var("MONO_BACKEND").as_deref() {
        Ok("cuda") => "cuda",
        _ => "host",
    };
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mono"));
    cmd.args(args)
        .env("MONO_BACKEND", backend)
        .env("MONO_HOST_CTAS", ctas.to_string());
    outcome(cmd)
}

/// Whether `cmd` (a `mono` command) succeeded, and its stdout and stderr together.
fn outcome(mut cmd: std::process::Command) -> (bool, String) {
    let out = cmd.output().expect("mono runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A checkpoint folder as `tools/goldens/generate.py --keep-checkpoint` leaves one, in the temp
/// folder under `name`: the tiny preset's config as transformers saved it
/// (`tests/goldens/config.json`), seed 5's weights as `model.safetensors` (the published names),
/// and the goldens' files beside them, which the loader must leave alone.
fn tiny_checkpoint(name: &str) -> std::path::PathBuf {
    tiny_checkpoint_as(name, WeightFormat::Bf16)
}

/// [`tiny_checkpoint`] with the weights in `format`.
fn tiny_checkpoint_as(name: &str, format: WeightFormat) -> std::path::PathBuf {
    use model::weights::write_checkpoint;
    let cfg = ModelConfig::preset("tiny").unwrap();
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let synthetic = Synthetic::new(&cfg, SEED, format).unwrap();
    write_checkpoint(&cfg, &synthetic, &dir).unwrap();
    let goldens = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/goldens");
    for file in ["config.json", "goldens.safetensors", "manifest.json"] {
        std::fs::copy(goldens.join(file), dir.join(file)).unwrap();
    }
    dir
}

/// [`tiny_checkpoint`] as a published FP8 checkpoint stores its weights: the matrices E4M3 with
/// block scales that are not powers of two (the blocks' amax / 448 there; seed 5's FP8 scales
/// times 0.8123 here).
fn published_fp8_checkpoint(name: &str) -> std::path::PathBuf {
    let dir = tiny_checkpoint_as(name, WeightFormat::Fp8);
    scale_every_block(&dir.join(model::weights::SINGLE_FILE), 0.8123);
    dir
}

/// The checkpoint folder `dir` without tensor `gone`, as `dir/short`.
fn without_tensor(dir: &std::path::Path, gone: &str) -> std::path::PathBuf {
    use model::weights::SINGLE_FILE;
    use safetensors::SafeTensors;
    let file = std::fs::read(dir.join(SINGLE_FILE)).unwrap();
    let tensors = SafeTensors::deserialize(&file).unwrap();
    let kept: Vec<_> = tensors
        .tensors()
        .into_iter()
        .filter(|(name, _)| name != gone)
        .collect();
    assert_eq!(kept.len() + 1, tensors.len(), "{gone} is in the checkpoint");
    let short = dir.join("short");
    std::fs::create_dir_all(&short).unwrap();
    safetensors::serialize_to_file(kept, None, &short.join(SINGLE_FILE)).unwrap();
    std::fs::copy(dir.join("config.json"), short.join("config.json")).unwrap();
    short
}

/// `mono check --weights DIR` end to end on a checkpoint folder (`tiny_checkpoint`). Both steps
/// read the checkpoint: its weights are those of seed 5 and the command's `--seed` is 6, so a side
/// that made synthetic weights instead would differ. The control: the folder with one tensor left
/// out of `model.safetensors` is refused, naming it, before anything runs.
#[test]
#[ignore = "needs g++ (host emulation)"]
fn mono_check_runs_a_checkpoint_folder_end_to_end() {
    let dir = tiny_checkpoint("mono-check-folder");
    let check = |dir: &std::path::Path| {
        mono(
            &[
                "check".as_ref(),
                "--weights".as_ref(),
                dir.as_os_str(),
                "--seed".as_ref(),
                "6".as_ref(),
            ],
            4,
        )
    };
    let (passed, out) = check(&dir);
    eprint!("{out}");
    assert!(passed, "mono check --weights failed:\n{out}");
    for part in [
        "config.json",
        "checkpoint",
        "tokens",
        "the device step follows the CPU reference step",
    ] {
        assert!(out.contains(part), "{part}:\n{out}");
    }

    let gone = "model.layers.4.self_attn.indexer.wk.weight";
    let (passed, refused) = check(&without_tensor(&dir, gone));
    std::fs::remove_dir_all(&dir).ok();
    eprintln!("one tensor left out: {}", refused.trim_end());
    assert!(!passed, "a checkpoint without {gone} passed:\n{refused}");
    assert!(
        refused.contains(gone) && !refused.contains("the device step:"),
        "{refused}"
    );
}

/// `mono check --weights DIR` on a published FP8 checkpoint folder (`published_fp8_checkpoint`):
/// the device keeps its matrices in FP8 as stored, with no flag asked, and its step follows the
/// CPU reference's over the checkpoint's values.
#[test]
#[ignore = "needs g++ (host emulation)"]
fn mono_check_follows_a_published_fp8_checkpoint() {
    let dir = published_fp8_checkpoint("mono-check-fp8");
    let (passed, out) = mono(
        &["check".as_ref(), "--weights".as_ref(), dir.as_os_str()],
        4,
    );
    std::fs::remove_dir_all(&dir).ok();
    eprint!("{out}");
    assert!(passed, "mono check --weights failed:\n{out}");
    for part in [
        "(Fp8 on the device)",
        "the device step follows the CPU reference step",
    ] {
        assert!(out.contains(part), "{part}:\n{out}");
    }
}

/// `mono check` on the host backend beyond one row: four rows of one request (an MTP verify)
/// and one row of each of three requests, on grids with a key and a query CTA for every row beside
/// the scorers; each follows the reference. The control: twelve rows on a grid that takes seven
/// are refused, naming the grid, before any launch runs.
#[test]
#[ignore = "needs g++ (host emulation)"]
fn mono_check_follows_the_reference_at_four_rows_and_at_three_requests() {
    for flags in [["--rows", "4"], ["--requests", "3"]] {
        let args: Vec<&std::ffi::OsStr> = std::iter::once("check")
            .chain(flags)
            .map(std::ffi::OsStr::new)
            .collect();
        let (passed, out) = mono(&args, 12);
        eprint!("{out}");
        assert!(passed, "mono check {flags:?} failed:\n{out}");
        assert!(
            out.contains("the device step follows the CPU reference step"),
            "{flags:?}:\n{out}"
        );
    }
    let args = ["check", "--requests", "3", "--rows", "4"].map(std::ffi::OsStr::new);
    let (passed, refused) = mono(&args, 16);
    assert!(!passed, "twelve rows on 16 CTAs ran:\n{refused}");
    assert!(
        refused.contains("a grid of 16 CTAs takes at most 7") && !refused.contains("tail:"),
        "{refused}"
    );
}

/// `mono step --weights DIR` on the host backend: the GPU step, launched directly and then
/// replayed, over a checkpoint folder (`tiny_checkpoint`). Its tokens are those of the same steps
/// over seed 5's synthetic weights made instead of loaded (`--config` of the same file): the
/// checkpoint's values reach the device bit for bit. The control: the folder with one tensor left
/// out is refused, naming it, before any step runs.
#[test]
#[ignore = "needs g++ (host emulation)"]
fn mono_step_runs_a_checkpoint_folder() {
    let dir = tiny_checkpoint("mono-step-folder");
    let step = |flag: &str, path: &std::path::Path| {
        let seed = SEED.to_string();
        mono(
            &[
                "step".as_ref(),
                flag.as_ref(),
                path.as_os_str(),
                "--seed".as_ref(),
                seed.as_ref(),
                "--steps".as_ref(),
                "2".as_ref(),
            ],
            4,
        )
    };
    // The tokens of each step, without its time.
    let tokens = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.starts_with("step ") && l.contains("tokens"))
            .map(|l| l.split_once("; ").map_or(l, |(_, rest)| rest).to_owned())
            .collect()
    };
    let (passed, loaded) = step("--weights", &dir);
    eprint!("{loaded}");
    assert!(passed, "mono step --weights failed:\n{loaded}");
    assert!(loaded.contains("loaded from checkpoint"), "{loaded}");
    let (passed, made) = step("--config", &dir.join("config.json"));
    assert!(passed, "mono step --config failed:\n{made}");
    assert!(made.contains("synthetic (seed 5)"), "{made}");
    assert_eq!(tokens(&loaded).len(), 2, "not two steps' tokens:\n{loaded}");
    assert_eq!(
        tokens(&loaded),
        tokens(&made),
        "loaded:\n{loaded}\nmade:\n{made}"
    );

    let gone = "model.layers.1.mlp.down_proj.weight";
    let (passed, refused) = step("--weights", &without_tensor(&dir, gone));
    std::fs::remove_dir_all(&dir).ok();
    eprintln!("one tensor left out: {}", refused.trim_end());
    assert!(!passed, "a checkpoint without {gone} ran:\n{refused}");
    assert!(
        refused.contains(gone) && !refused.contains("step 0:"),
        "{refused}"
    );
}

/// `MONO_BACKEND=host` asked for outright sizes the emulated grid for the step's rows, as a
/// command that finds no GPU does: `mono dump` of three requests of four rows runs (26 CTAs) and
/// writes its digests. The control: `MONO_HOST_CTAS=4` still sets the grid, and that one is
/// refused, naming it.
#[test]
#[ignore = "needs g++ (host emulation)"]
fn the_host_backend_asked_for_sizes_its_grid_for_the_rows() {
    let out_file = std::env::temp_dir().join(format!("mono-host-dump-{}", std::process::id()));
    let dump = |ctas: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mono"));
        cmd.args(["dump", "--preset", "tiny", "--tp", "1", "--context", "20"])
            .args(["--requests", "3", "--rows", "4", "--out"])
            .arg(&out_file)
            .env("MONO_BACKEND", "host")
            .env_remove("MONO_HOST_CTAS");
        if let Some(n) = ctas {
            cmd.env("MONO_HOST_CTAS", n);
        }
        outcome(cmd)
    };
    let (passed, out) = dump(None);
    let written = std::fs::metadata(&out_file).is_ok_and(|m| m.len() > 0);
    std::fs::remove_file(&out_file).ok();
    assert!(passed && written, "{out}");
    let (passed, refused) = dump(Some("4"));
    std::fs::remove_file(&out_file).ok();
    assert!(!passed, "twelve rows ran on 4 CTAs:\n{refused}");
    assert!(
        refused.contains("a grid of 4 CTAs takes at most 1"),
        "{refused}"
    );
}

/// `mono step` and `mono check` on a machine without a GPU run the device step's kernels on the
/// host backend by themselves, the grid sized for the rows: three requests of four rows need 26
/// CTAs (a key and a query CTA a row, a scoring run a group of rows); each step prints every
/// row's token, and the check follows the reference. The controls: the same rows on the 4 CTAs
/// `MONO_HOST_CTAS` asks for are refused, naming the grid; `mono check --select` (a large
/// preset's step) and `mono bench` (a GPU's times), also on the host backend, say they need a GPU.
#[test]
#[ignore = "needs g++ (host emulation)"]
fn mono_step_and_check_without_a_gpu_size_the_emulated_grid_for_their_rows() {
    if Device::open_with(0, BackendChoice::Auto).is_ok() {
        eprintln!("a GPU is present here; this test is about machines without one");
        return;
    }
    let run = |args: &[&str], ctas: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mono"));
        cmd.args(args)
            .env_remove("MONO_BACKEND")
            .env_remove("MONO_HOST_CTAS");
        if let Some(n) = ctas {
            cmd.env("MONO_HOST_CTAS", n);
        }
        outcome(cmd)
    };
    let step = |ctas| {
        run(
            &["step", "--requests", "3", "--rows", "4", "--steps", "1"],
            ctas,
        )
    };
    let (passed, checked) = run(&["check", "--requests", "3", "--rows", "4"], None);
    eprint!("{checked}");
    assert!(passed, "{checked}");
    assert!(
        checked.contains("on 26 emulated CTAs")
            && checked.contains("the device step follows the CPU reference step"),
        "{checked}"
    );
    let (passed, refused) = run(&["check", "--select"], None);
    assert!(!passed && refused.contains("needs one"), "{refused}");
    // Nor does `mono bench`, whose times would be no GPU's, sent to the host backend or not.
    let (passed, refused) = run(&["bench"], None);
    assert!(
        !passed && refused.contains("times a GPU and found none"),
        "{refused}"
    );
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_mono"));
    cmd.arg("bench").env("MONO_BACKEND", "host");
    let (passed, refused) = outcome(cmd);
    assert!(
        !passed && refused.contains("the host backend emulates one"),
        "{refused}"
    );

    let (passed, out) = step(None);
    eprint!("{out}");
    assert!(passed, "{out}");
    assert!(out.contains("on 26 emulated CTAs"), "{out}");
    let tokens = out
        .lines()
        .find_map(|l| l.strip_prefix("step 0: ")?.split_once("tokens ["))
        .map(|(_, t)| t.split(',').count());
    assert_eq!(tokens, Some(12), "{out}");

    let (passed, refused) = step(Some("4"));
    assert!(!passed, "twelve rows ran on 4 CTAs:\n{refused}");
    assert!(
        refused.contains("a grid of 4 CTAs takes at most 1") && !refused.contains("step 0:"),
        "{refused}"
    );

    // The first two layers and the head: three launches, the tail's tokens still fed back.
    let (passed, out) = run(&["step", "--layers", "2", "--steps", "2"], None);
    eprint!("{out}");
    assert!(passed, "{out}");
    assert!(
        out.contains("step: 3 launches") && out.contains("step 1: "),
        "{out}"
    );
}

/// `mono dump --layers 2` is the same step's first two layers and the tail: its layers' digests
/// are the whole model's, and `mono compare` names launch 2 as the first that differs: the whole
/// model's third layer, the tail in the other. The control: more layers than the model has are
/// refused, naming the count.
#[test]
#[ignore = "needs g++ (host emulation)"]
fn mono_dump_of_the_first_layers_matches_the_whole_models_layers() {
    let dir = std::env::temp_dir();
    let file = |name: &str| dir.join(format!("mono-dump-{name}-{}", std::process::id()));
    let (whole, first) = (file("whole"), file("first2"));
    let dump = |out: &std::path::Path, layers: Option<&str>| {
        let mut args: Vec<&std::ffi::OsStr> = ["dump", "--preset", "tiny", "--tp", "1"]
            .iter()
            .chain(&["--context", "20", "--out"])
            .map(|s| s.as_ref())
            .collect();
        args.push(out.as_os_str());
        if let Some(n) = layers {
            args.push("--layers".as_ref());
            args.push(n.as_ref());
        }
        mono(&args, 9)
    };
    let (passed, out) = dump(&whole, None);
    assert!(passed, "{out}");
    let (passed, out) = dump(&first, Some("2"));
    assert!(passed, "{out}");
    let compare = |a: &std::path::Path, b: &std::path::Path| {
        mono(&["compare".as_ref(), a.as_os_str(), b.as_os_str()], 9)
    };
    let (equal, said) = compare(&whole, &first);
    let (self_equal, _) = compare(&first, &first);
    for f in [&whole, &first] {
        std::fs::remove_file(f).ok();
    }
    assert!(self_equal);
    assert!(!equal, "{said}");
    assert!(
        said.contains("first difference: launch 2 (layer 2") && said.contains("launch 2 (tail)"),
        "{said}"
    );
    let (passed, refused) = dump(&first, Some("99"));
    std::fs::remove_file(&first).ok();
    assert!(!passed, "{refused}");
    assert!(refused.contains("--layers 99"), "{refused}");
}
