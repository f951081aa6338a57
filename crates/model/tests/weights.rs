//! The safetensors loader and the synthetic weights: round trips, FP8 block scales, and the errors
//! for a missing or misshapen tensor.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::bf16;
use model::weights::{
    checkpoint_tensors, write_checkpoint, Checkpoint, Synthetic, WeightError, WeightSource,
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
        &scratch.0.join("w.safetensors"),
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
    let checkpoint = Checkpoint::open(&scratch.0).unwrap();
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

#[test]
fn sharded_checkpoints_and_their_errors() {
    let scratch = Scratch::new("shards");
    fn one(name: &str) -> (&str, Dtype, Vec<usize>, Vec<u8>) {
        (name, Dtype::F32, vec![1], 1.5f32.to_le_bytes().to_vec())
    }
    write_file(
        &scratch.0.join("model-00001-of-00002.safetensors"),
        &[one("a")],
    );
    write_file(
        &scratch.0.join("model-00002-of-00002.safetensors"),
        &[one("b")],
    );
    let checkpoint = Checkpoint::open(&scratch.0).unwrap();
    assert_eq!(checkpoint.names(), vec!["a", "b"]);
    assert_eq!(checkpoint.tensor("b", &[1]).unwrap(), vec![1.5]);

    write_file(&scratch.0.join("model-00003.safetensors"), &[one("a")]);
    let duplicate = Checkpoint::open(&scratch.0).err().unwrap().to_string();
    assert!(duplicate.contains("`a` is in both"), "{duplicate}");

    let empty = Scratch::new("empty");
    assert!(matches!(
        Checkpoint::open(&empty.0),
        Err(WeightError::NoFiles(_))
    ));
    std::fs::write(empty.0.join("junk.safetensors"), b"not a safetensors file").unwrap();
    let junk = Checkpoint::open(&empty.0).err().unwrap().to_string();
    assert!(
        junk.contains("junk.safetensors") && junk.contains("not a valid safetensors"),
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
