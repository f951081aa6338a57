//! The CPU reference step against Hugging Face transformers' `glm_moe_dsa`.
//!
//! The fixtures in `tests/goldens/` come from `tools/goldens/generate.py` (see its README): the
//! tiny preset's GlmMoeDsaForCausalLM with our synthetic weights (seed in the manifest), run in
//! fp32 on the CPU through a prefill, greedy decode steps of one row and one 4-row MTP-style verify
//! step, all through one cache. Here the same weights, written as a safetensors checkpoint and read
//! back through `model::weights::Checkpoint`, go through the reference step with every
//! [`ReferenceOptions`] switch at transformers' choice (f32 activations and cache, as the run),
//! step by step through one persistent [`DecodeState`], and must agree:
//!
//! - every layer's output, every row: ‖ours − golden‖₂ ≤ 1e-4 ‖golden‖₂;
//! - index scores, every full layer and row: |ours − golden| ≤ 1e-4 · max|golden| over the row's
//!   keys;
//! - top-k sets, every full layer and row, unless the golden scores of the k-th and (k+1)-th keys
//!   are within the tie margin 2e-4 · max|golden| (twice the score tolerance, so scores that agree
//!   cannot be ordered differently);
//! - logits: ‖ours − golden‖₂ ≤ 1e-4 ‖golden‖₂, and the same argmax on every row of every step
//!   unless the golden top two are within the logit tie margin 2e-4 · max|golden|; then ours must
//!   be one of the tied tokens.
//!
//! Why 1e-4, a hundred times tighter than a bf16-level 1e-2: measured, the two agree to about 2e-6
//! at every layer (fp32 rounding), which is also how far transformers' own fp32 run is from its
//! fp64 run. A bf16 comparison could not be this strict, nor even hold at 1e-2: transformers' bf16
//! run of this model is 1.4e-2 from its fp64 run after layer 0 and 0.38 after layer 5, where bf16
//! noise flips indexer choices at near-ties (see tools/goldens/README.md).
//!
//! The negative control runs the same comparison with the half-split rope (DeepSeek-V3.2's indexer
//! convention) in place of the interleaved one, and it must fail.
//!
//! Without fixtures the tests fail, saying how to make them.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use executor::reference::cli::{self, Numerics, StepArgs};
use executor::reference::{DecodeState, ReferenceModel, ReferenceOptions, Row, StepOutput};
use model::weights::{checkpoint_tensors, write_checkpoint, Checkpoint, Synthetic, WeightSource};
use model::{IndexerKind, ModelConfig, Storage, WeightFormat};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use sha2::{Digest, Sha256};

const HIDDEN_REL_TOL: f64 = 1e-4;
const LOGIT_REL_TOL: f64 = 1e-4;
const SCORE_TOL: f64 = 1e-4;
const SCORE_TIE_MARGIN: f64 = 2.0 * SCORE_TOL;
const LOGIT_TIE_MARGIN: f64 = 2.0 * LOGIT_REL_TOL;

fn fixtures_dir() -> PathBuf {
    std::env::var_os("MONO_GOLDENS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/goldens"))
}

struct Goldens {
    manifest: Value,
    config_text: String,
    floats: HashMap<String, Vec<f32>>,
    ints: HashMap<String, Vec<i64>>,
}

/// The fixtures, or a failure that says how to make them.
fn goldens() -> Goldens {
    let dir = fixtures_dir();
    let read = |name: &str| std::fs::read(dir.join(name));
    let (Ok(manifest), Ok(config), Ok(tensors)) = (
        read("manifest.json"),
        read("config.json"),
        read("goldens.safetensors"),
    ) else {
        panic!(
            "GOLDEN FIXTURES MISSING in {}: this test compares the CPU reference with \
             transformers and cannot pass without them. Make them where transformers 5.x and \
             torch are installed (CPU is enough, nothing is downloaded):\n    \
             python3 tools/goldens/generate.py --out tests/goldens\n\
             then commit tests/goldens/ (config.json, goldens.safetensors, manifest.json). \
             See tools/goldens/README.md.",
            dir.display()
        );
    };
    let tensors = SafeTensors::deserialize(&tensors).expect("goldens.safetensors is readable");
    let (mut floats, mut ints) = (HashMap::new(), HashMap::new());
    for (name, view) in tensors.tensors() {
        match view.dtype() {
            Dtype::F32 => {
                let values = view
                    .data()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()));
                floats.insert(name, values.collect());
            }
            Dtype::I64 => {
                let values = view
                    .data()
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap()));
                ints.insert(name, values.collect());
            }
            other => panic!("golden tensor {name} has unexpected dtype {other:?}"),
        }
    }
    Goldens {
        manifest: serde_json::from_slice(&manifest).expect("manifest.json is JSON"),
        config_text: String::from_utf8(config).expect("config.json is UTF-8"),
        floats,
        ints,
    }
}

impl Goldens {
    fn floats(&self, name: &str) -> &[f32] {
        self.floats
            .get(name)
            .unwrap_or_else(|| panic!("golden tensor {name} is missing"))
    }

    fn ints(&self, name: &str) -> &[i64] {
        self.ints
            .get(name)
            .unwrap_or_else(|| panic!("golden tensor {name} is missing"))
    }

    fn seed(&self) -> u64 {
        self.manifest["seed"].as_u64().expect("manifest seed")
    }

    fn steps(&self) -> Vec<Vec<Row>> {
        self.manifest["steps"]
            .as_array()
            .expect("manifest steps")
            .iter()
            .map(|step| {
                let tokens = step["tokens"].as_array().expect("step tokens");
                let positions = step["positions"].as_array().expect("step positions");
                tokens
                    .iter()
                    .zip(positions)
                    .map(|(t, p)| Row {
                        request: 0,
                        token: t.as_u64().expect("token") as u32,
                        position: p.as_u64().expect("position") as usize,
                    })
                    .collect()
            })
            .collect()
    }
}

fn tiny() -> ModelConfig {
    ModelConfig::preset("tiny").unwrap()
}

fn l2(v: impl Iterator<Item = f64>) -> f64 {
    v.map(|x| x * x).sum::<f64>().sqrt()
}

fn relative_error(ours: &[f32], golden: &[f32]) -> f64 {
    let diff = l2(ours
        .iter()
        .zip(golden)
        .map(|(&a, &b)| f64::from(a) - f64::from(b)));
    diff / l2(golden.iter().map(|&b| f64::from(b))).max(f64::MIN_POSITIVE)
}

#[derive(Debug, Default)]
struct Report {
    worst_hidden: f64,
    worst_score: f64,
    worst_logits: f64,
    topk_checked: usize,
    topk_near_ties: usize,
    argmax_checked: usize,
    argmax_near_ties: usize,
}

/// Compares one step's output with the goldens of step `s`, layer by layer (index scores, top-k,
/// then the layer's output), then the logits; the first disagreement is an error.
fn compare_step(
    cfg: &ModelConfig,
    goldens: &Goldens,
    s: usize,
    rows: &[Row],
    out: &StepOutput,
    report: &mut Report,
) -> Result<(), String> {
    for l in 0..out.hidden.len() {
        if let Some(scores) = &out.index_scores[l] {
            compare_indexer(cfg, goldens, s, l, rows, scores, &out.topk[l], report)?;
        }
        let golden = goldens.floats(&format!("step{s}.layer{l}.hidden"));
        let hidden = cfg.hidden_size;
        for (r, ours) in out.hidden[l].iter().enumerate() {
            let err = relative_error(ours, &golden[r * hidden..(r + 1) * hidden]);
            report.worst_hidden = report.worst_hidden.max(err);
            if err > HIDDEN_REL_TOL {
                return Err(format!(
                    "step {s} layer {l} row {r}: hidden state relative error {err:.3e} > {HIDDEN_REL_TOL:e}"
                ));
            }
        }
    }
    compare_logits(cfg, goldens, s, out, report)
}

/// Index scores within tolerance, and the same top-k set wherever the golden scores leave no
/// near-tie at the k boundary.
#[allow(clippy::too_many_arguments)]
fn compare_indexer(
    cfg: &ModelConfig,
    goldens: &Goldens,
    s: usize,
    l: usize,
    rows: &[Row],
    scores: &[Vec<f32>],
    topk: &[Vec<i32>],
    report: &mut Report,
) -> Result<(), String> {
    let k = cfg.index_topk;
    let golden = goldens.floats(&format!("step{s}.layer{l}.index_scores"));
    let keys = golden.len() / rows.len();
    for (r, (row, ours)) in rows.iter().zip(scores).enumerate() {
        let valid = &golden[r * keys..r * keys + row.position + 1];
        let scale = valid.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
        let err = ours.iter().zip(valid).fold(0f64, |m, (&a, &b)| {
            m.max((f64::from(a) - f64::from(b)).abs())
        });
        report.worst_score = report.worst_score.max(err / scale);
        if err > SCORE_TOL * scale {
            return Err(format!(
                "step {s} layer {l} row {r}: index score error {err:.3e} > {SCORE_TOL:e} x {scale:.3e}"
            ));
        }
        let mut sorted: Vec<f64> = valid.iter().map(|&v| f64::from(v)).collect();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let golden_set: HashSet<i32> = if sorted.len() <= k {
            (0..sorted.len() as i32).collect()
        } else {
            if sorted[k - 1] - sorted[k] <= SCORE_TIE_MARGIN * scale {
                report.topk_near_ties += 1;
                continue;
            }
            let floor = sorted[k - 1];
            (0..valid.len() as i32)
                .filter(|&t| f64::from(valid[t as usize]) >= floor)
                .collect()
        };
        let ours_set: HashSet<i32> = topk[r].iter().copied().filter(|&t| t >= 0).collect();
        report.topk_checked += 1;
        if ours_set != golden_set {
            let mut missing: Vec<_> = golden_set.difference(&ours_set).collect();
            let mut extra: Vec<_> = ours_set.difference(&golden_set).collect();
            missing.sort();
            extra.sort();
            return Err(format!(
                "step {s} layer {l} row {r}: top-{k} differs; golden only {missing:?}, ours only {extra:?}"
            ));
        }
    }
    Ok(())
}

/// Logits within tolerance and the same argmax, up to near-ties in the golden logits.
fn compare_logits(
    cfg: &ModelConfig,
    goldens: &Goldens,
    s: usize,
    out: &StepOutput,
    report: &mut Report,
) -> Result<(), String> {
    let vocab = cfg.vocab_size;
    let golden_logits = goldens.floats(&format!("step{s}.logits"));
    for (r, ours) in out.logits.iter().enumerate() {
        let golden = &golden_logits[r * vocab..(r + 1) * vocab];
        let err = relative_error(ours, golden);
        report.worst_logits = report.worst_logits.max(err);
        if err > LOGIT_REL_TOL {
            return Err(format!(
                "step {s} row {r}: logits relative error {err:.3e} > {LOGIT_REL_TOL:e}"
            ));
        }
        let top = golden.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let scale = golden.iter().fold(0f32, |m, &v| m.max(v.abs()));
        let margin = LOGIT_TIE_MARGIN as f32 * scale;
        let tied: Vec<u32> = (0..vocab as u32)
            .filter(|&t| golden[t as usize] >= top - margin)
            .collect();
        if tied.len() > 1 {
            report.argmax_near_ties += 1;
        } else {
            report.argmax_checked += 1;
        }
        if !tied.contains(&out.argmax[r]) {
            return Err(format!(
                "step {s} row {r}: argmax {} but transformers' is {tied:?} (within {margin:.3e})",
                out.argmax[r]
            ));
        }
    }
    Ok(())
}

/// Runs every golden step through one state and compares each.
fn compare(cfg: &ModelConfig, model: &ReferenceModel, goldens: &Goldens) -> Result<Report, String> {
    let options = ReferenceOptions::transformers(cfg, false);
    let mut state = DecodeState::new(model, 1, options).map_err(|e| e.to_string())?;
    let mut report = Report::default();
    for (s, rows) in goldens.steps().iter().enumerate() {
        let tokens: Vec<i64> = rows.iter().map(|r| i64::from(r.token)).collect();
        assert_eq!(goldens.ints(&format!("step{s}.tokens")), tokens.as_slice());
        let out = model
            .step(&mut state, rows)
            .map_err(|e| format!("step {s}: {e}"))?;
        compare_step(cfg, goldens, s, rows, &out, &mut report)?;
    }
    Ok(report)
}

fn scratch_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mono-goldens-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The folder `generate.py --keep-checkpoint` leaves, with the fixtures copied beside it: the
/// goldens' weights as `model.safetensors` (the published names), `config.json`, and
/// `goldens.safetensors` + `manifest.json`, which the loader must leave alone.
fn checkpoint_beside_the_goldens(what: &str, cfg: &ModelConfig, seed: u64) -> PathBuf {
    let dir = scratch_dir(what);
    let synthetic = Synthetic::new(cfg, seed, WeightFormat::Bf16).unwrap();
    write_checkpoint(cfg, &synthetic, &dir).unwrap();
    for fixture in ["config.json", "goldens.safetensors", "manifest.json"] {
        std::fs::copy(fixtures_dir().join(fixture), dir.join(fixture)).unwrap();
    }
    dir
}

/// The goldens' weights through the safetensors loader: written with the published names, then
/// memory-mapped back.
fn model_through_the_loader(cfg: &ModelConfig, seed: u64) -> ReferenceModel {
    let dir = checkpoint_beside_the_goldens("checkpoint", cfg, seed);
    let checkpoint = Checkpoint::open(&dir).unwrap();
    let model = ReferenceModel::load(cfg, &checkpoint).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    model
}

/// `mono step --weights DIR` on that folder runs; on the fixtures' folder, which holds the
/// goldens but not the weights (the checkpoint is not committed), it says what it found.
#[test]
fn mono_step_loads_the_checkpoint_folder_and_only_it() {
    let goldens = goldens();
    let dir = checkpoint_beside_the_goldens("step", &tiny(), goldens.seed());
    let args = |weights: PathBuf| StepArgs {
        preset: "tiny".to_owned(),
        config: None,
        weights: Some(weights),
        seed: goldens.seed(),
        fp8_weights: false,
        rows: 2,
        context: 8,
        numerics: Numerics::TransformersFp32,
    };
    let outcome = cli::run(&args(dir.clone()));
    std::fs::remove_dir_all(&dir).ok();
    outcome.unwrap();
    let refused = cli::run(&args(fixtures_dir())).unwrap_err();
    assert!(
        refused.contains("holds no checkpoint") && refused.contains("goldens.safetensors"),
        "{refused}"
    );
}

#[test]
fn reference_step_matches_transformers() {
    let goldens = goldens();
    let cfg = tiny();
    let model = model_through_the_loader(&cfg, goldens.seed());
    let report = compare(&cfg, &model, &goldens).unwrap_or_else(|e| panic!("{e}"));
    println!("{report:#?}");
    // Something must actually have been checked.
    let full_layers = cfg
        .layer_plan()
        .unwrap()
        .iter()
        .filter(|l| l.indexer == IndexerKind::Full)
        .count();
    let rows: usize = goldens.steps().iter().map(Vec::len).sum();
    assert!(
        report.topk_checked * 10 >= full_layers * rows * 9,
        "only {} of {} top-k sets were clear of near-ties",
        report.topk_checked,
        full_layers * rows
    );
    assert!(report.argmax_checked * 10 >= rows * 9, "{report:?}");
}

/// The negative control: the half-split (NeoX) rope in place of the interleaved one, in the
/// indexer only (DeepSeek-V3.2's convention there), in MLA only, and in both, must each fail, and
/// where the difference first shows.
#[test]
fn half_split_rope_fails_the_comparison() {
    let goldens = goldens();
    let cases = [
        ("indexer", true, false, "index score error"),
        ("MLA", false, true, "hidden state"),
        ("both", false, false, "index score error"),
    ];
    for (which, rope_interleave, indexer_rope_interleave, first_symptom) in cases {
        let cfg = ModelConfig {
            rope_interleave,
            indexer_rope_interleave,
            ..tiny()
        };
        let synthetic = Synthetic::new(&cfg, goldens.seed(), WeightFormat::Bf16).unwrap();
        let model = ReferenceModel::load(&cfg, &synthetic).unwrap();
        let outcome = compare(&cfg, &model, &goldens);
        println!("half-split rope in {which}: {outcome:?}");
        let error = outcome.expect_err("the half-split rope passed the comparison");
        assert!(
            error.contains(first_symptom),
            "{which}: failed, but first on {error}"
        );
    }
}

/// The fixtures are of the tiny preset and of the very weights `Synthetic` makes, under the names
/// our loader reads: transformers loaded exactly these names (generate.py checks that).
#[test]
fn fixtures_are_the_tiny_preset_with_our_weights() {
    let goldens = goldens();
    let cfg = tiny();
    assert_eq!(
        ModelConfig::from_json_str(&goldens.config_text).unwrap(),
        cfg
    );
    let committed = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/goldens/tiny_config.json"),
    )
    .unwrap();
    assert_eq!(
        committed.trim_end(),
        cfg.to_json().unwrap(),
        "tools/goldens/tiny_config.json is stale"
    );

    let facts = &goldens.manifest["facts"];
    let options = ReferenceOptions::transformers(&cfg, false);
    assert_eq!(
        facts["q_a_layernorm_eps"].as_f64(),
        Some(options.mla.latent_norm_eps)
    );
    assert_eq!(
        facts["kv_a_layernorm_eps"].as_f64(),
        Some(options.mla.latent_norm_eps)
    );
    assert_eq!(
        facts["index_k_norm_eps"].as_f64(),
        Some(ModelConfig::INDEX_K_NORM_EPS)
    );

    let weights = goldens.manifest["weights"]
        .as_object()
        .expect("manifest weights");
    let synthetic = Synthetic::new(&cfg, goldens.seed(), WeightFormat::Bf16).unwrap();
    let specs = checkpoint_tensors(&cfg).unwrap();
    let ours: HashSet<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    let theirs: HashSet<&str> = weights.keys().map(String::as_str).collect();
    assert_eq!(
        ours, theirs,
        "tensor names differ from what transformers' model holds"
    );
    for spec in &specs {
        let entry = &weights[&spec.name];
        let shape: Vec<usize> = entry["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(shape, spec.shape, "{}", spec.name);
        let values = synthetic.tensor(&spec.name, &spec.shape).unwrap();
        let bytes: Vec<u8> = match spec.storage {
            Storage::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            _ => values
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
        };
        let digest = format!("{:x}", Sha256::digest(&bytes));
        assert_eq!(
            entry["sha256"].as_str(),
            Some(digest.as_str()),
            "{}",
            spec.name
        );
    }
}
