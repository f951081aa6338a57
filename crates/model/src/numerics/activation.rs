/// Logistic sigmoid, written so that neither large positive nor large negative inputs overflow.
pub fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// SiLU (swish), the gate activation of SwiGLU: x * sigmoid(x).
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigmoid_known_values_and_extremes() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert!((sigmoid(2.0) - 0.880_797_1).abs() < 1e-6);
        assert!((sigmoid(-2.0) - 0.119_202_92).abs() < 1e-6);
        assert_eq!(sigmoid(1000.0), 1.0);
        assert_eq!(sigmoid(-1000.0), 0.0);
        assert!(!sigmoid(-100.0).is_nan());
    }

    #[test]
    fn silu_known_values() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((silu(-1.0) + 0.268_941_43).abs() < 1e-6);
        assert_eq!(silu(-1000.0), 0.0);
    }
}
