//! The safetensors loader and the synthetic weights: round trips, FP8 block scales, checkpoint
//! folders as Hugging Face writes them (an index, else `model.safetensors`, nothing else), and the
//! errors for a missing or misshapen tensor.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::bf16;
use model::weights::{
    checkpoint_tensors, write_checkpoint, Checkpoint, Fp8Weight, Synthetic, WeightError,
    WeightSource, INDEX_FILE, SINGLE_FILE,
};
use model::{ModelConfig, WeightFormat};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

fn tiny() -> ModelConfig {
    ModelConfig::preset("tiny").unwrap()
}

/// A fresh empty folder under the system temp dir, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("model-weights-{name}-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// Writes `tensors` (name, dtype, shape, bytes) as one safetensors file.
fn write_file(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(&str, TensorView)> = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            (
                *name,
                TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn bf16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
        .collect()
}

#[test]
fn checkpoint_reads_back_what_synthetic_wrote() {
    let cfg = tiny();
    for format in [WeightFormat::Bf16, WeightFormat::Fp8] {
        let scratch = Scratch::new(&format!("{format:?}"));
        let synthetic = Synthetic::new(&cfg, 11, format).unwrap();
        write_checkpoint(&cfg, &synthetic, &scratch.0).unwrap();
        let checkpoint = Checkpoint::open(&scratch.0).unwrap();
        for spec in checkpoint_tensors(&cfg).unwrap() {
            assert_eq!(
                checkpoint.tensor(&spec.name, &spec.shape).unwrap(),
                synthetic.tensor(&spec.name, &spec.shape).unwrap(),
                "{format:?} {}",
                spec.name
            );
        }
        let q_a = "model.layers.0.self_attn.q_a_proj.weight";
        let expected = match format {
            WeightFormat::Fp8 => Dtype::F8_E4M3,
            WeightFormat::Bf16 => Dtype::BF16,
        };
        assert_eq!(checkpoint.info(q_a).unwrap().0, expected);
        let bias = "model.layers.2.mlp.gate.e_score_correction_bias";
        assert_eq!(checkpoint.info(bias).unwrap().0, Dtype::F32);
    }
}

#[test]
fn fp8_scales_are_multiplied_in() {
    let scratch = Scratch::new("fp8-scales");
    // A 130 x 2 weight: two row blocks, scales 0.5 and 4.
    let codes: Vec<u8> = (0..260)
        .map(|i| model::numerics::e4m3_encode((i % 7) as f32))
        .collect();
    let scales: Vec<u8> = [0.5f32, 4.0].iter().flat_map(|s| s.to_le_bytes()).collect();
    write_file(
        &scratch.0.join("model.safetensors"),
        &[
            ("w.weight", Dtype::F8_E4M3, vec![130, 2], codes),
            ("w.weight_scale_inv", Dtype::F32, vec![2, 1], scales),
        ],
    );
    let values = Checkpoint::open(&scratch.0)
        .unwrap()
        .tensor("w.weight", &[130, 2])
        .unwrap();
    assert_eq!(values[3], 3.0 * 0.5);
    assert_eq!(values[128 * 2 + 1], ((128 * 2 + 1) % 7) as f32 * 4.0);
}

/// A published checkpoint's scales are the block's amax / 448, not powers of two: `fp8` hands the
/// codes and scales back as stored, where quantising the values again gives other ones (the
/// control); bf16 tensors have no FP8 form.
#[test]
fn fp8_weights_come_back_as_stored() {
    let scratch = Scratch::new("fp8-as-stored");
    let codes: Vec<u8> = (0..260u32).map(|i| (i % 0x7e) as u8).collect();
    let scales = [0.0123f32, 3.0 / 448.0];
    write_file(
        &scratch.0.join("model.safetensors"),
        &[
            ("w.weight", Dtype::F8_E4M3, vec![130, 2], codes.clone()),
            (
                "w.weight_scale_inv",
                Dtype::F32,
                vec![2, 1],
                scales.iter().flat_map(|s| s.to_le_bytes()).collect(),
            ),
            ("b.weight", Dtype::BF16, vec![2, 3], bf16_bytes(&[1.0; 6])),
        ],
    );
    let checkpoint = Checkpoint::open(&scratch.0).unwrap();
    let stored = checkpoint.fp8("w.weight", 130, 2).unwrap().unwrap();
    assert_eq!((stored.rows, stored.cols), (130, 2));
    assert_eq!(stored.codes, codes);
    assert_eq!(stored.scales, scales);
    let values = checkpoint.tensor("w.weight", &[130, 2]).unwrap();
    assert_eq!(stored.dequantise(), values);
    let again = Fp8Weight::quantise(&values, 130, 2).unwrap();
    assert_ne!(again.scales, stored.scales, "requantising keeps the scales");
    assert!(checkpoint.fp8("b.weight", 2, 3).unwrap().is_none());
    let shape = checkpoint.fp8("w.weight", 2, 130).unwrap_err().to_string();
    assert!(shape.contains("expected shape [2, 130]"), "{shape}");
}

#[test]
fn missing_and_misshapen_tensors_are_named() {
    let scratch = Scratch::new("errors");
    write_file(
        &scratch.0.join("a.safetensors"),
        &[
            ("x.weight", Dtype::BF16, vec![2, 3], bf16_bytes(&[0.0; 6])),
            ("f8.weight", Dtype::F8_E4M3, vec![2, 3], vec![0; 6]),
            ("scaled.weight", Dtype::BF16, vec![2], bf16_bytes(&[0.0; 2])),
            (
                "scaled.weight_scale_inv",
                Dtype::F32,
                vec![1, 1],
                vec![0; 4],
            ),
            ("bad_scale.weight", Dtype::F8_E4M3, vec![2, 3], vec![0; 6]),
            (
                "bad_scale.weight_scale_inv",
                Dtype::F32,
                vec![2, 1],
                vec![0; 8],
            ),
        ],
    );
    // A path to a file opens that file alone.
    let checkpoint = Checkpoint::open(scratch.0.join("a.safetensors")).unwrap();
    let message = |r: Result<Vec<f32>, WeightError>| r.unwrap_err().to_string();

    let missing = message(checkpoint.tensor("y.weight", &[2, 3]));
    assert!(missing.contains("`y.weight` is missing"), "{missing}");
    let shape = message(checkpoint.tensor("x.weight", &[3, 2]));
    assert!(
        shape.contains("`x.weight`")
            && shape.contains("expected shape [3, 2], found [2, 3]")
            && shape.contains("a.safetensors"),
        "{shape}"
    );
    let no_scale = message(checkpoint.tensor("f8.weight", &[2, 3]));
    assert!(
        no_scale.contains("f8.weight_scale_inv") && no_scale.contains("missing"),
        "{no_scale}"
    );
    let stray_scale = message(checkpoint.tensor("scaled.weight", &[2]));
    assert!(stray_scale.contains("not FP8"), "{stray_scale}");
    let bad_scale = message(checkpoint.tensor("bad_scale.weight", &[2, 3]));
    assert!(
        bad_scale.contains("expected shape [1, 1], found [2, 1]"),
        "{bad_scale}"
    );
}

fn one(name: &str) -> (&str, Dtype, Vec<usize>, Vec<u8>) {
    (name, Dtype::F32, vec![1], 1.5f32.to_le_bytes().to_vec())
}

const SHARD_1: &str = "model-00001-of-00002.safetensors";
const SHARD_2: &str = "model-00002-of-00002.safetensors";

/// An index in Hugging Face's form: `weight_map` from tensor to file.
fn write_index(dir: &Path, weight_map: &[(&str, &str)]) {
    let map: serde_json::Map<String, serde_json::Value> = weight_map
        .iter()
        .map(|&(name, file)| (name.to_owned(), file.into()))
        .collect();
    let index = serde_json::json!({"metadata": {"total_size": 8}, "weight_map": map});
    std::fs::write(dir.join(INDEX_FILE), index.to_string()).unwrap();
}

/// Two shards and their index, beside files a loader reading every `*.safetensors` would take:
/// a third shard repeating `a`, a file of outputs. Only what the index names is read.
#[test]
fn an_index_names_the_tensors_and_their_shards() {
    let scratch = Scratch::new("index");
    write_file(&scratch.0.join(SHARD_1), &[one("a"), one("unlisted")]);
    write_file(&scratch.0.join(SHARD_2), &[one("b")]);
    write_file(&scratch.0.join("model-00003.safetensors"), &[one("a")]);
    write_file(&scratch.0.join("outputs.safetensors"), &[one("logits")]);
    write_index(&scratch.0, &[("a", SHARD_1), ("b", SHARD_2)]);
    let checkpoint = Checkpoint::open(&scratch.0).unwrap();
    assert_eq!(checkpoint.names(), vec!["a", "b"]);
    assert_eq!(checkpoint.tensor("b", &[1]).unwrap(), vec![1.5]);
    // The index wins over a single file beside it.
    write_file(&scratch.0.join(SINGLE_FILE), &[one("c")]);
    assert_eq!(
        Checkpoint::open(&scratch.0).unwrap().names(),
        vec!["a", "b"]
    );
}

/// The tiny model as one `model.safetensors`, beside a file of reference outputs that reuses one
/// of its names and adds others: the model's tensors, and only those, come back.
#[test]
fn a_single_file_folder_ignores_the_files_beside_it() {
    let cfg = tiny();
    let scratch = Scratch::new("single");
    let synthetic = Synthetic::new(&cfg, 3, WeightFormat::Bf16).unwrap();
    write_checkpoint(&cfg, &synthetic, &scratch.0).unwrap();
    write_file(
        &scratch.0.join("outputs.safetensors"),
        &[one("model.norm.weight"), one("step0.logits")],
    );
    std::fs::write(scratch.0.join("config.json"), cfg.to_json().unwrap()).unwrap();
    let checkpoint = Checkpoint::open(&scratch.0).unwrap();
    let mut expected: Vec<String> = checkpoint_tensors(&cfg)
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    expected.sort();
    assert_eq!(checkpoint.names(), expected);
    let norm = [cfg.hidden_size];
    assert_eq!(
        checkpoint.tensor("model.norm.weight", &norm).unwrap(),
        synthetic.tensor("model.norm.weight", &norm).unwrap()
    );
}

#[test]
fn index_errors_name_the_tensor_and_the_file() {
    let scratch = Scratch::new("index-errors");
    write_file(&scratch.0.join(SHARD_1), &[one("a")]);
    write_file(&scratch.0.join(SHARD_2), &[one("b")]);
    let error = |weight_map: &[(&str, &str)]| {
        write_index(&scratch.0, weight_map);
        Checkpoint::open(&scratch.0).err().unwrap().to_string()
    };
    let not_held = error(&[("a", SHARD_1), ("c", SHARD_2)]);
    assert!(
        not_held.contains("`c`")
            && not_held.contains(SHARD_2)
            && not_held.contains(INDEX_FILE)
            && not_held.contains("does not hold it"),
        "{not_held}"
    );
    let no_file = error(&[("a", SHARD_1), ("b", "model-00009-of-00009.safetensors")]);
    assert!(
        no_file.contains("`b`")
            && no_file.contains("model-00009-of-00009.safetensors")
            && no_file.contains("does not exist"),
        "{no_file}"
    );
    let elsewhere = error(&[("a", "../model.safetensors")]);
    assert!(
        elsewhere.contains("not a file name in the index's folder"),
        "{elsewhere}"
    );
    // The control: the same shards under a right index open.
    write_index(&scratch.0, &[("a", SHARD_1), ("b", SHARD_2)]);
    Checkpoint::open(&scratch.0).unwrap();
    std::fs::write(scratch.0.join(INDEX_FILE), "{\"metadata\": {}}").unwrap();
    let unreadable = Checkpoint::open(&scratch.0).err().unwrap().to_string();
    assert!(
        unreadable.contains("not a valid safetensors index") && unreadable.contains("weight_map"),
        "{unreadable}"
    );
}

#[test]
fn a_crowded_folder_without_a_checkpoint_names_a_few_and_counts_the_rest() {
    let crowded = Scratch::new("crowded");
    for i in 0..12 {
        std::fs::write(crowded.0.join(format!("file{i:02}.txt")), "").unwrap();
    }
    let message = Checkpoint::open(&crowded.0).err().unwrap().to_string();
    assert!(
        message.contains("file00.txt")
            && message.contains("file07.txt")
            && message.contains("and 4 more"),
        "{message}"
    );
    assert!(!message.contains("file08.txt"), "{message}");
}

#[test]
fn a_folder_without_a_checkpoint_says_what_it_holds() {
    let empty = Scratch::new("empty");
    let nothing = Checkpoint::open(&empty.0).err().unwrap();
    assert!(
        matches!(&nothing, WeightError::NoCheckpoint { found, .. } if found.is_empty()),
        "{nothing}"
    );
    assert!(nothing.to_string().contains("found: nothing"), "{nothing}");
    // Safetensors files under other names are not a checkpoint.
    write_file(&empty.0.join("goldens.safetensors"), &[one("a")]);
    std::fs::write(empty.0.join("config.json"), "{}").unwrap();
    let others = Checkpoint::open(&empty.0).err().unwrap().to_string();
    assert!(
        others.contains(INDEX_FILE)
            && others.contains(SINGLE_FILE)
            && others.contains("found: config.json, goldens.safetensors"),
        "{others}"
    );
    std::fs::write(empty.0.join(SINGLE_FILE), b"not a safetensors file").unwrap();
    let junk = Checkpoint::open(&empty.0).err().unwrap().to_string();
    assert!(
        junk.contains(SINGLE_FILE) && junk.contains("not a valid safetensors"),
        "{junk}"
    );
}

#[test]
fn every_tiny_tensor_has_a_distinct_synthetic_stream() {
    let cfg = tiny();
    let synthetic = Synthetic::new(&cfg, 1, WeightFormat::Bf16).unwrap();
    let mut firsts: HashMap<Vec<u32>, String> = HashMap::new();
    for spec in checkpoint_tensors(&cfg).unwrap() {
        let values = synthetic.tensor(&spec.name, &spec.shape).unwrap();
        if values.len() < 64 {
            continue;
        }
        let key: Vec<u32> = values[..64].iter().map(|v| v.to_bits()).collect();
        if let Some(other) = firsts.insert(key, spec.name.clone()) {
            panic!("{} and {other} start with the same values", spec.name);
        }
    }
}
