//! The RMSNorm prologue's probe (`kernels/norm_probe.hip`), shared by the host emulation and the
//! GPU tests: its cases and its check.

use linear::cases::{Finish, Pattern, Problem};
use model::weights::packed::Pairing;
use model::WeightFormat;

/// Source rows of which a normed matrix reads the k-range k0..k0 + k, with the norm's weight.
pub struct NormSource {
    pub rows: usize,
    pub n: usize,
    pub k0: usize,
    pub k: usize,
    pub x: Vec<u16>,
    pub weight: Vec<u16>,
    pub eps: f32,
}

impl NormSource {
    /// The case in a few words: its rows, width and k-range.
    pub fn describe(&self) -> String {
        let (rows, n, k0, k) = (self.rows, self.n, self.k0, self.k);
        format!("{rows} rows of {n} (k {k0}..{})", k0 + k)
    }

    pub fn new(pattern: Pattern, rows: usize, n: usize, k0: usize, k: usize, seed: u64) -> Self {
        let draw = |pattern, rows, seed| {
            Problem::new(
                pattern,
                WeightFormat::Bf16,
                Pairing::Plain,
                16,
                n,
                rows,
                Finish::Rounded,
                seed,
            )
            .unwrap()
            .x
        };
        NormSource {
            rows,
            n,
            k0,
            k,
            x: draw(pattern, rows, seed),
            weight: draw(Pattern::Random, 1, seed + 1),
            eps: 1e-5,
        }
    }
}

/// bf16 bits in an order where neighbours differ by one.
fn ordered(bits: u16) -> i32 {
    let magnitude = i32::from(bits & 0x7fff);
    if bits & 0x8000 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// The norm function's rows against the f64 reference (a bf16 unit apart at most), and the staged
/// x against them bit for bit.
pub fn check_probe(s: &NormSource, normed: &[u16], staged: &[u16]) -> Result<(), String> {
    let value = linear::cases::bf16_value;
    let weight: Vec<f32> = s.weight.iter().map(|&b| value(b)).collect();
    for r in 0..s.rows {
        let row: Vec<f32> = s.x[r * s.n..(r + 1) * s.n]
            .iter()
            .map(|&b| value(b))
            .collect();
        let reference = model::numerics::rms_norm(&row, &weight, f64::from(s.eps)).unwrap();
        for (i, &v) in reference.iter().enumerate() {
            let want = (model::numerics::bf16_round(v).to_bits() >> 16) as u16;
            let got = normed[r * s.n + i];
            if (ordered(got) - ordered(want)).abs() > 1 {
                return Err(format!(
                    "row {r} element {i}: the norm wrote {got:#06x}, the reference is {want:#06x}"
                ));
            }
        }
        for c in 0..s.k {
            let (want, got) = (normed[r * s.n + s.k0 + c], staged[r * s.k + c]);
            if want != got {
                return Err(format!(
                    "row {r} element {}: staged {got:#06x}, the norm task's bits {want:#06x}",
                    s.k0 + c
                ));
            }
        }
    }
    Ok(())
}

/// The cases both tests run: a k-split of one row (the router's), whole rows (with outliers; one
/// row), a k-range of rows whose width is no multiple of the team, a k-range of 16 rows.
pub fn cases() -> Vec<NormSource> {
    vec![
        NormSource::new(Pattern::Random, 1, 1536, 512, 384, 21),
        // Whole rows (staged, then normed in LDS).
        NormSource::new(Pattern::Outliers, 4, 1024, 0, 1024, 25),
        NormSource::new(Pattern::Random, 1, 768, 0, 768, 26),
        NormSource::new(Pattern::Outliers, 4, 1000, 0, 896, 22),
        NormSource::new(Pattern::Random, 16, 640, 128, 256, 23),
    ]
}
