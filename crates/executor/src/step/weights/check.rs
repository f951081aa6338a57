//! What the device's synthetic weights must hold, made on the CPU from `model::weights`: the
//! shard's values by the same rule, quantised by `Fp8Weight::quantise` (a shard covers whole scale
//! blocks, so its blocks are the whole tensor's) and packed by `model::weights::packed::pack`.

use model::weights::packed::{pack, SourceWeight};
use model::weights::{Fp8Weight, SyntheticRule};

use super::plan::{DeviceTensor, Element, Form, Shard};
use crate::step::Result;

/// The shard's values, row-major.
pub fn shard_values(seed: u64, shard: &Shard) -> Vec<f32> {
    let rule = SyntheticRule::new(seed, &shard.name, &shard.full_shape);
    let full_cols = shard.full_cols() as u64;
    let mut out = Vec::with_capacity(shard.rows * shard.cols);
    for r in 0..shard.rows as u64 {
        let start = (shard.row0 as u64 + r) * full_cols + shard.col0 as u64;
        out.extend((start..start + shard.cols as u64).map(|i| rule.value(i)));
    }
    out
}

/// The values a launch computes with for each source shard of `tensor`: the shard's values, FP8
/// ones quantised and dequantised (what the stored codes times their block scales are).
pub fn stored_values(seed: u64, tensor: &DeviceTensor) -> Result<Vec<Vec<f32>>> {
    let values = tensor
        .sources
        .iter()
        .map(|s| shard_values(seed, s))
        .collect();
    as_stored(tensor, values)
}

/// The values a launch computes with for `tensor`'s source shards' `values`: FP8 ones quantised
/// and dequantised, others as they are.
pub fn as_stored(tensor: &DeviceTensor, values: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>> {
    let (rows, cols) = tensor.shape();
    values
        .into_iter()
        .map(|v| {
            Ok(match tensor.element {
                Element::Fp8 => Fp8Weight::quantise(&v, rows, cols)?.dequantise(),
                _ => v,
            })
        })
        .collect()
}

fn bf16_bits(values: &[f32]) -> Vec<u16> {
    // The values are bf16-exact: the upper half of the f32 is the bf16.
    values.iter().map(|v| (v.to_bits() >> 16) as u16).collect()
}

/// The bytes and fp32 scales `tensor` must hold.
pub fn expected(seed: u64, tensor: &DeviceTensor) -> Result<(Vec<u8>, Vec<f32>)> {
    let values: Vec<Vec<f32>> = tensor
        .sources
        .iter()
        .map(|s| shard_values(seed, s))
        .collect();
    stored_form(tensor, &values)
}

/// The bytes and fp32 scales `tensor` holds for its source shards' `values` (row-major, each
/// shard's, bf16-exact where the tensor is bf16).
pub fn stored_form(tensor: &DeviceTensor, values: &[Vec<f32>]) -> Result<(Vec<u8>, Vec<f32>)> {
    let (rows, cols) = tensor.shape();
    let quantised = match tensor.element {
        Element::Fp8 => values
            .iter()
            .map(|v| Fp8Weight::quantise(v, rows, cols))
            .collect::<Result<Vec<_>, _>>()?,
        _ => Vec::new(),
    };
    stored_form_of(tensor, values, &quantised)
}

/// [`stored_form`] with an FP8 `tensor`'s shards already codes and scales (`quantised`, one a
/// source, as a checkpoint stores them); `values` are read only by bf16 and f32 tensors.
pub fn stored_form_of(
    tensor: &DeviceTensor,
    values: &[Vec<f32>],
    quantised: &[Fp8Weight],
) -> Result<(Vec<u8>, Vec<f32>)> {
    let (rows, cols) = tensor.shape();
    let bits: Vec<Vec<u16>> = match tensor.element {
        Element::Bf16 => values.iter().map(|v| bf16_bits(v)).collect(),
        _ => Vec::new(),
    };
    match tensor.form {
        Form::Packed(layout) => {
            let sources: Vec<SourceWeight> = match tensor.element {
                Element::Fp8 => quantised.iter().map(SourceWeight::Fp8).collect(),
                _ => bits
                    .iter()
                    .map(|b| SourceWeight::Bf16 {
                        rows,
                        cols,
                        bits: b,
                    })
                    .collect(),
            };
            let packed = pack(layout.pairing, &sources)?;
            Ok((packed.bytes, packed.scales))
        }
        Form::RowMajor => Ok(match tensor.element {
            Element::Fp8 => (
                quantised.iter().flat_map(|q| q.codes.clone()).collect(),
                quantised.iter().flat_map(|q| q.scales.clone()).collect(),
            ),
            Element::Bf16 => (
                bits.iter()
                    .flat_map(|b| b.iter().flat_map(|x| x.to_le_bytes()))
                    .collect(),
                Vec::new(),
            ),
            Element::F32 => (
                values
                    .iter()
                    .flat_map(|v| v.iter().flat_map(|x| x.to_le_bytes()))
                    .collect(),
                Vec::new(),
            ),
        }),
    }
}

/// Where a tensor read back from the device first differs from what it must hold.
pub fn first_difference(
    tensor: &DeviceTensor,
    got: &(Vec<u8>, Vec<f32>),
    want: &(Vec<u8>, Vec<f32>),
) -> Option<String> {
    if got.0.len() != want.0.len() || got.1.len() != want.1.len() {
        return Some(format!(
            "{}: {} bytes and {} scales, expected {} and {}",
            tensor.name,
            got.0.len(),
            got.1.len(),
            want.0.len(),
            want.1.len()
        ));
    }
    if let Some(i) = got.0.iter().zip(&want.0).position(|(a, b)| a != b) {
        return Some(format!(
            "{}: byte {i} is {:#04x}, expected {:#04x}",
            tensor.name, got.0[i], want.0[i]
        ));
    }
    let scale_bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let (a, b) = (scale_bits(&got.1), scale_bits(&want.1));
    a.iter().zip(&b).position(|(x, y)| x != y).map(|i| {
        format!(
            "{}: scale {i} is {}, expected {}",
            tensor.name, got.1[i], want.1[i]
        )
    })
}
