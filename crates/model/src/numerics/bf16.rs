use half::bf16;

/// The f32 nearest to `x` that a bf16 can hold, ties to even (what a bf16 store does on GPU).
pub fn bf16_round(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

pub fn bf16_round_slice(values: &mut [f32]) {
    for v in values {
        *v = bf16_round(*v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// bf16 keeps 8 significant bits, so between 1 and 2 its step is 2^-7.
    const STEP: f32 = 1.0 / 128.0;

    #[test]
    fn halfway_cases_go_to_even() {
        // 1 + step/2 lies between 1 (even mantissa) and 1 + step (odd): goes down.
        assert_eq!(bf16_round(1.0 + STEP / 2.0), 1.0);
        // 1 + 3 step/2 lies between 1 + step (odd) and 1 + 2 step (even): goes up.
        assert_eq!(bf16_round(1.0 + 3.0 * STEP / 2.0), 1.0 + 2.0 * STEP);
        assert_eq!(bf16_round(-(1.0 + STEP / 2.0)), -1.0);
    }

    #[test]
    fn just_off_halfway_rounds_to_nearest() {
        let above = f32::from_bits((1.0f32 + STEP / 2.0).to_bits() + 1);
        assert_eq!(bf16_round(above), 1.0 + STEP);
        let below = f32::from_bits((1.0f32 + 3.0 * STEP / 2.0).to_bits() - 1);
        assert_eq!(bf16_round(below), 1.0 + STEP);
    }

    #[test]
    fn specials_survive() {
        assert_eq!(bf16_round(f32::INFINITY), f32::INFINITY);
        assert!(bf16_round(f32::NAN).is_nan());
        assert_eq!(bf16_round(0.0), 0.0);
    }

    proptest! {
        #[test]
        fn rounding_is_idempotent_and_close(x in -1e30f32..1e30f32) {
            let r = bf16_round(x);
            prop_assert_eq!(bf16_round(r), r);
            prop_assert_eq!(r.to_bits() & 0xFFFF, 0);
            prop_assert!((r - x).abs() <= x.abs() * (1.0 / 256.0));
        }
    }
}
