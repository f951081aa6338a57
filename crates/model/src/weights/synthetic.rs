//! Deterministic synthetic weights: every value a function of (seed, tensor name, element index),
//! so any tensor can be made on its own, in any order, and `tools/goldens/generate.py` makes the
//! very same bits in Python (it mirrors this file; keep the two in step).
//!
//! Each value is an 8-bit integer times a power of two, so it is exact in bf16 and in f32 and no
//! float rounding can differ between languages:
//! * matrices: m · 2^-(7+e), m a signed byte, e = ceil(ceil_log2(cols) / 2) - 1, so the range
//!   ±2^-e is about ±2/√cols and the products keep activations near unit scale;
//! * norm weights (`*norm.weight`): 1 + k/128, k in [-16, 15];
//! * the indexer's LayerNorm bias (`*norm.bias`): m · 2^-11 (within ±1/16);
//! * the router's `e_score_correction_bias`: m · 2^-12 (within ±1/32).

use std::collections::HashMap;

use super::fp8::Fp8Weight;
use super::{checkpoint_tensors, TensorSpec, WeightError, WeightSource};
use crate::format::{Storage, WeightFormat};
use crate::ModelConfig;

/// How a tensor's values are drawn, decided by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyntheticKind {
    Matrix,
    NormWeight,
    NormBias,
    RouterBias,
}

impl SyntheticKind {
    pub fn of(name: &str) -> Self {
        if name.ends_with("norm.weight") {
            SyntheticKind::NormWeight
        } else if name.ends_with("norm.bias") {
            SyntheticKind::NormBias
        } else if name.ends_with("e_score_correction_bias") {
            SyntheticKind::RouterBias
        } else {
            SyntheticKind::Matrix
        }
    }
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function (Steele, Lea, Flood 2014).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a, 64 bit, over the name's UTF-8 bytes.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    })
}

/// ceil(log2(n)) for n >= 1.
fn ceil_log2(n: usize) -> u32 {
    n.max(1).next_power_of_two().trailing_zeros()
}

/// What every value of one tensor shares: the hash key and the rule that turns a hash into a
/// value. Generators elsewhere (the GPU's) take these numbers as they are, so the rule lives here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SyntheticRule {
    /// The name's hash mixed with the seed; element `i` hashes `key + (i + 1) x golden gamma`.
    pub key: u64,
    pub kind: SyntheticKind,
    /// What the signed byte is multiplied by (matrices, norm biases, the router bias).
    pub factor: f32,
}

impl SyntheticRule {
    pub fn new(seed: u64, name: &str, shape: &[usize]) -> Self {
        let kind = SyntheticKind::of(name);
        let cols = shape.last().copied().unwrap_or(1);
        let matrix_exponent = (ceil_log2(cols) as i32 + 1) / 2 - 1;
        let factor = match kind {
            SyntheticKind::Matrix => 2f32.powi(-7 - matrix_exponent),
            SyntheticKind::NormWeight => 1.0,
            SyntheticKind::NormBias => 2f32.powi(-11),
            SyntheticKind::RouterBias => 2f32.powi(-12),
        };
        SyntheticRule {
            key: name_hash(name) ^ seed.wrapping_mul(GOLDEN_GAMMA),
            kind,
            factor,
        }
    }

    /// Element `i` (row-major over the whole tensor).
    pub fn value(&self, i: u64) -> f32 {
        let u = mix(self.key.wrapping_add((i + 1).wrapping_mul(GOLDEN_GAMMA)));
        let byte = f32::from((u >> 56) as u8 as i8);
        match self.kind {
            SyntheticKind::NormWeight => 1.0 + ((u >> 59) as i32 - 16) as f32 / 128.0,
            _ => byte * self.factor,
        }
    }
}

/// The values of tensor `name` with `shape` (row-major) for `seed`, as bf16-exact f32.
pub fn synthetic_values(seed: u64, name: &str, shape: &[usize]) -> Vec<f32> {
    let rule = SyntheticRule::new(seed, name, shape);
    let count: usize = shape.iter().product();
    (0..count as u64).map(|i| rule.value(i)).collect()
}

/// Synthetic weights for every tensor of a config. In the FP8 format the quantisable matrices
/// read back as their FP8 values (128 x 128 block scales multiplied in), as a loaded FP8
/// checkpoint would.
#[derive(Debug, Clone)]
pub struct Synthetic {
    seed: u64,
    format: WeightFormat,
    specs: HashMap<String, TensorSpec>,
}

impl Synthetic {
    pub fn new(cfg: &ModelConfig, seed: u64, format: WeightFormat) -> Result<Self, WeightError> {
        let specs = checkpoint_tensors(cfg)?
            .into_iter()
            .map(|s| (s.name.clone(), s))
            .collect();
        Ok(Synthetic {
            seed,
            format,
            specs,
        })
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// The FP8 codes and scales of a quantisable matrix (what an FP8 checkpoint holds).
    pub fn fp8(&self, spec: &TensorSpec) -> Result<Fp8Weight, WeightError> {
        let (rows, cols) = match spec.shape[..] {
            [rows, cols] => (rows, cols),
            _ => (spec.shape.iter().product(), 1),
        };
        Fp8Weight::quantise(
            &synthetic_values(self.seed, &spec.name, &spec.shape),
            rows,
            cols,
        )
    }
}

impl WeightSource for Synthetic {
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, WeightError> {
        let spec = self.specs.get(name).ok_or_else(|| WeightError::Missing {
            name: name.to_owned(),
            source_desc: format!("the synthetic weights (seed {})", self.seed),
        })?;
        if spec.shape != shape {
            return Err(WeightError::Shape {
                name: name.to_owned(),
                expected: shape.to_vec(),
                found: spec.shape.clone(),
                location: " in the synthetic weights' table".to_owned(),
            });
        }
        match (self.format, spec.storage) {
            (WeightFormat::Fp8, Storage::Quantisable) => Ok(self.fp8(spec)?.dequantise()),
            _ => Ok(synthetic_values(self.seed, name, shape)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::bf16_round;

    /// Pinned to what tools/goldens/synthetic.py printed for the same calls, so that a change
    /// on one side only shows up here.
    #[test]
    fn pinned_values_agree_with_the_python_mirror() {
        let v = synthetic_values(7, "model.layers.0.self_attn.q_a_proj.weight", &[2, 256]);
        assert_eq!(
            &v[..4],
            &[0.073_242_19, -0.098_632_81, -0.085_937_5, 0.020_507_813]
        );
        let norm = synthetic_values(7, "model.norm.weight", &[4]);
        assert_eq!(norm, vec![1.0, 0.976_562_5, 1.046_875, 1.093_75]);
    }

    #[test]
    fn values_are_bf16_exact_and_depend_on_seed_and_name() {
        let a = synthetic_values(1, "lm_head.weight", &[8, 256]);
        assert!(a.iter().all(|&x| bf16_round(x) == x));
        assert!(a.iter().all(|&x| x.abs() <= 0.125));
        assert_ne!(a, synthetic_values(2, "lm_head.weight", &[8, 256]));
        assert_ne!(
            a,
            synthetic_values(1, "model.embed_tokens.weight", &[8, 256])
        );
        assert_eq!(a, synthetic_values(1, "lm_head.weight", &[8, 256]));
    }

    #[test]
    fn unknown_name_and_wrong_shape_are_errors() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let w = Synthetic::new(&cfg, 0, WeightFormat::Bf16).unwrap();
        let err = w.tensor("model.layers.2.self_attn.indexer.wk.weight", &[64, 256]);
        assert!(matches!(err, Err(WeightError::Missing { .. })), "{err:?}");
        let err = w.matrix("model.layers.0.self_attn.q_a_proj.weight", 256, 128);
        let message = err.unwrap_err().to_string();
        assert!(
            message.contains("q_a_proj") && message.contains("[256, 128]"),
            "{message}"
        );
    }

    #[test]
    fn fp8_format_reads_back_quantised_values() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let name = "model.layers.0.self_attn.q_a_proj.weight";
        let bf16 = Synthetic::new(&cfg, 3, WeightFormat::Bf16).unwrap();
        let fp8 = Synthetic::new(&cfg, 3, WeightFormat::Fp8).unwrap();
        let (a, b) = (
            bf16.tensor(name, &[128, 256]).unwrap(),
            fp8.tensor(name, &[128, 256]).unwrap(),
        );
        assert_ne!(a, b);
        assert!(a
            .iter()
            .zip(&b)
            .all(|(x, y)| (x - y).abs() <= x.abs() / 16.0 + 1e-6));
        // Norms are never quantised.
        let norm = "model.norm.weight";
        assert_eq!(
            bf16.tensor(norm, &[256]).unwrap(),
            fp8.tensor(norm, &[256]).unwrap()
        );
    }
}
