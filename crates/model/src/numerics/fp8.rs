//! FP8 E4M3 (OCP: bias 7, no infinities, max 448) and the block quantisation of spec §3.4.

use float8::F8E4M3;

use crate::format::E4M3_MAX;

/// Smallest block maximum a scale is computed from, so an all-zero block still gets a scale.
pub const FP8_AMAX_FLOOR: f32 = 1e-4;

/// Round to nearest, ties to even; out-of-range values and infinities saturate to ±448, NaN stays
/// NaN. (float8's `from_f32` is the CUDA `__nv_cvt_float_to_fp8` with `__NV_SATFINITE`, rounding
/// once from the exact f64 value.)
pub fn e4m3_encode(x: f32) -> u8 {
    F8E4M3::from_f32(x).to_bits()
}

pub fn e4m3_decode(code: u8) -> f32 {
    F8E4M3::from_bits(code).to_f32()
}

/// `x` as it reads back after an E4M3 store.
pub fn e4m3_round(x: f32) -> f32 {
    e4m3_decode(e4m3_encode(x))
}

/// The power-of-two ("ue8m0") scale of a block whose largest magnitude is `amax`:
/// s = 2^ceil(log2(max(amax, 1e-4) / 448)). The ceiling is taken from the float's bits, exactly,
/// as DeepSeek's `fast_log2_ceil` does, since a float log2 can round a value just above a power
/// of two down onto it.
pub fn ue8m0_scale(amax: f32) -> f32 {
    // f32::max ignores NaN, so a NaN block still gets the floor's scale.
    let ratio = amax.max(FP8_AMAX_FLOOR) / E4M3_MAX;
    let bits = ratio.to_bits();
    let biased_exponent = ((bits >> 23) & 0xFF) as i32;
    let has_fraction = bits & 0x7F_FFFF != 0;
    // ratio >= 1e-4 / 448 is a normal float, so the biased exponent is its floor(log2) + 127.
    let ceil_log2 = biased_exponent - 127 + i32::from(has_fraction);
    // An infinite amax would ask for 2^129; the largest finite power of two still saturates it.
    let clamped = ceil_log2.clamp(-126, 127);
    f32::from_bits(((clamped + 127) as u32) << 23)
}

/// E4M3 codes of a block and the scale that multiplies them back.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantisedBlock {
    pub codes: Vec<u8>,
    pub scale: f32,
}

/// Spec §3.4: scale from the block's amax (ue8m0), then each value divided, clamped to ±448 and
/// rounded. The block is whatever slice the caller passes (a 128-wide head, a cache tile...).
pub fn quantise_block_e4m3(values: &[f32]) -> QuantisedBlock {
    let amax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = ue8m0_scale(amax);
    QuantisedBlock {
        codes: quantise_block_e4m3_with_scale(values, scale),
        scale,
    }
}

/// The same with a scale chosen elsewhere (e.g. the raw amax/448 some MLA cache writers store).
pub fn quantise_block_e4m3_with_scale(values: &[f32], scale: f32) -> Vec<u8> {
    values
        .iter()
        .map(|&v| e4m3_encode((v / scale).clamp(-E4M3_MAX, E4M3_MAX)))
        .collect()
}

pub fn dequantise_block_e4m3(codes: &[u8], scale: f32) -> Vec<f32> {
    codes.iter().map(|&c| e4m3_decode(c) * scale).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NAN_CODE: u8 = 0x7F;

    #[test]
    fn saturates_instead_of_overflowing() {
        assert_eq!(e4m3_round(448.0), 448.0);
        assert_eq!(e4m3_round(464.0), 448.0);
        assert_eq!(e4m3_round(1e6), 448.0);
        assert_eq!(e4m3_round(-1e6), -448.0);
        assert_eq!(e4m3_round(f32::INFINITY), 448.0);
        assert_eq!(e4m3_round(f32::NEG_INFINITY), -448.0);
        assert!(e4m3_round(f32::NAN).is_nan());
    }

    #[test]
    fn halfway_cases_go_to_even() {
        // Between 1 and 2 the step is 1/8.
        assert_eq!(e4m3_round(1.0625), 1.0);
        assert_eq!(e4m3_round(1.1875), 1.25);
        assert_eq!(e4m3_round(-1.0625), -1.0);
        // Smallest subnormal is 2^-9; half of it ties to zero (even).
        assert_eq!(e4m3_round(2f32.powi(-10)), 0.0);
        assert_eq!(e4m3_round(2f32.powi(-10) * 1.01), 2f32.powi(-9));
    }

    #[test]
    fn every_finite_code_round_trips() {
        for code in 0..=u8::MAX {
            if code & 0x7F == NAN_CODE {
                assert!(e4m3_decode(code).is_nan());
                continue;
            }
            let value = e4m3_decode(code);
            assert!(value.abs() <= E4M3_MAX);
            assert_eq!(e4m3_encode(value), code, "code {code:#04x} = {value}");
        }
    }

    #[test]
    fn scale_examples() {
        assert_eq!(ue8m0_scale(448.0), 1.0);
        assert_eq!(ue8m0_scale(449.0), 2.0);
        assert_eq!(ue8m0_scale(224.0), 0.5);
        assert_eq!(ue8m0_scale(0.0), ue8m0_scale(FP8_AMAX_FLOOR));
        // 1e-4 / 448 ~ 2.23e-7 lies in (2^-23, 2^-22].
        assert_eq!(ue8m0_scale(0.0), 2f32.powi(-22));
        assert_eq!(ue8m0_scale(f32::INFINITY), 2f32.powi(127));
    }

    #[test]
    fn all_zero_block_quantises_to_zeros() {
        let block = quantise_block_e4m3(&[0.0; 128]);
        assert!(block.codes.iter().all(|&c| c == 0));
        assert_eq!(
            dequantise_block_e4m3(&block.codes, block.scale),
            vec![0.0; 128]
        );
    }

    proptest! {
        #[test]
        fn scale_is_the_smallest_power_of_two_that_fits(amax in 0.0f32..1e30) {
            let s = ue8m0_scale(amax);
            prop_assert_eq!(s.to_bits() & 0x7F_FFFF, 0, "not a power of two: {}", s);
            let floored = amax.max(FP8_AMAX_FLOOR);
            prop_assert!(floored / s <= E4M3_MAX);
            prop_assert!(floored / (s / 2.0) > E4M3_MAX);
        }

        #[test]
        fn quantised_block_stays_in_range_and_close(
            values in prop::collection::vec(-1e4f32..1e4, 1..256),
        ) {
            let block = quantise_block_e4m3(&values);
            let back = dequantise_block_e4m3(&block.codes, block.scale);
            for (&v, (&code, &d)) in values.iter().zip(block.codes.iter().zip(&back)) {
                prop_assert!(e4m3_decode(code).abs() <= E4M3_MAX);
                // 3 mantissa bits: relative error 2^-4 for normals, absolute 2^-10 s below them.
                let tolerance = (v.abs() / 16.0).max(block.scale * 2f32.powi(-10));
                prop_assert!((d - v).abs() <= tolerance, "{} -> {}", v, d);
            }
        }
    }
}
