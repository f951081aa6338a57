//! The packed weight layout: every source element lands exactly once, padding is zero, the
//! position formula inverts the streaming order, and every packed scale is its block's.

use model::weights::packed::{
    pack, PackedLayout, Pairing, SourceWeight, HALF_ROWS, LANES, TILE_ROWS,
};
use model::weights::Fp8Weight;
use model::{WeightFormat, WEIGHT_BLOCK};
use proptest::prelude::*;

fn formats() -> impl Strategy<Value = WeightFormat> {
    prop_oneof![Just(WeightFormat::Fp8), Just(WeightFormat::Bf16)]
}

fn pairings() -> impl Strategy<Value = Pairing> {
    prop_oneof![Just(Pairing::Plain), Just(Pairing::GateUp)]
}

/// Walks the layout in streaming order: (element index, source element) of every stored element.
fn streaming_order(l: &PackedLayout) -> Vec<(usize, model::weights::packed::SourceElement)> {
    let mut all = Vec::new();
    for tile in 0..l.tiles() {
        for kb in 0..l.k_blocks() {
            for j in 0..l.loads_per_block() {
                for lane in 0..LANES {
                    for i in 0..l.elements_per_load() {
                        all.push((
                            l.element_index(tile, kb, j, lane, i),
                            l.element(tile, kb, j, lane, i),
                        ));
                    }
                }
            }
        }
    }
    all
}

proptest! {
    #[test]
    fn every_element_exactly_once(
        format in formats(),
        pairing in pairings(),
        n in 1usize..70,
        kb in 1usize..4,
    ) {
        let k = kb * WEIGHT_BLOCK;
        let l = PackedLayout::new(format, pairing, n, k).unwrap();
        let order = streaming_order(&l);
        prop_assert_eq!(order.len() * l.element_bytes(), l.bytes());
        // The streaming order visits the stored elements 0, 1, 2, ... in turn.
        for (at, (index, _)) in order.iter().enumerate() {
            prop_assert_eq!(at, *index);
        }
        let mut seen = vec![false; pairing.sources() * n * k];
        let mut padding = 0;
        for (index, e) in &order {
            prop_assert!(e.k < k && e.source < pairing.sources());
            if !e.real {
                padding += 1;
                continue;
            }
            let flat = (e.source * n + e.row) * k + e.k;
            prop_assert!(!seen[flat], "{:?} stored twice", e);
            seen[flat] = true;
            prop_assert_eq!(l.position(e.source, e.row, e.k), *index);
        }
        prop_assert!(seen.iter().all(|&s| s));
        prop_assert_eq!(padding, order.len() - seen.len());
    }

    #[test]
    fn a_half_is_one_source_and_one_scale_block(
        pairing in pairings(),
        n in 1usize..300,
    ) {
        let l = PackedLayout::new(WeightFormat::Fp8, pairing, n, WEIGHT_BLOCK).unwrap();
        for tile in 0..l.tiles() {
            for half in 0..2 {
                let (source, first) = l.source_row(tile, half * HALF_ROWS);
                for r in 0..HALF_ROWS {
                    let (s, row) = l.source_row(tile, half * HALF_ROWS + r);
                    prop_assert_eq!((s, row), (source, first + r));
                    prop_assert_eq!(row / WEIGHT_BLOCK, first / WEIGHT_BLOCK);
                }
            }
        }
    }

    #[test]
    fn packed_values_and_scales_are_the_sources(
        pairing in pairings(),
        n in 1usize..300,
        kb in 1usize..4,
        seed in any::<u64>(),
    ) {
        let k = kb * WEIGHT_BLOCK;
        let sources: Vec<Fp8Weight> = (0..pairing.sources() as u64)
            .map(|s| {
                let values: Vec<f32> = (0..n * k)
                    .map(|i| {
                        let z = (seed ^ (s << 60) ^ i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                        ((z >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * (1 + i / (WEIGHT_BLOCK * k)) as f32
                    })
                    .collect();
                let mut w = Fp8Weight::quantise(&values, n, k).unwrap();
                // Distinct scales, so a scale from the wrong block cannot pass.
                for (b, sc) in w.scales.iter_mut().enumerate() {
                    *sc *= 1.0 + b as f32 / 64.0 + s as f32 / 8.0;
                }
                w
            })
            .collect();
        let refs: Vec<SourceWeight> = sources.iter().map(SourceWeight::Fp8).collect();
        let p = pack(pairing, &refs).unwrap();
        let l = p.layout;
        let block_cols = k / WEIGHT_BLOCK;
        for (index, e) in streaming_order(&l) {
            let expect = if e.real { sources[e.source].codes[e.row * k + e.k] } else { 0 };
            prop_assert_eq!(p.bytes[index], expect);
        }
        for tile in 0..l.tiles() {
            for b in 0..l.k_blocks() {
                for half in 0..2 {
                    let (source, row) = l.source_row(tile, half * HALF_ROWS);
                    let expect = if row < n {
                        sources[source].scales[(row / WEIGHT_BLOCK) * block_cols + b]
                    } else {
                        0.0
                    };
                    prop_assert_eq!(p.scales[l.scale_index(tile, b, half)], expect);
                }
            }
        }
    }
}

#[test]
fn bf16_sources_are_stored_little_endian_in_place() {
    let (n, k) = (TILE_ROWS + 3, WEIGHT_BLOCK);
    let bits: Vec<u16> = (0..n * k).map(|i| i as u16 ^ 0x5a00).collect();
    let src = SourceWeight::Bf16 {
        rows: n,
        cols: k,
        bits: &bits,
    };
    let p = pack(Pairing::Plain, &[src]).unwrap();
    assert!(p.scales.is_empty());
    for row in 0..n {
        for kk in 0..k {
            let at = 2 * p.layout.position(0, row, kk);
            assert_eq!(
                u16::from_le_bytes([p.bytes[at], p.bytes[at + 1]]),
                bits[row * k + kk]
            );
        }
    }
}

#[test]
fn mismatched_sources_are_errors() {
    let a = Fp8Weight::quantise(&[0.5; 16 * 128], 16, 128).unwrap();
    let b = Fp8Weight::quantise(&[0.5; 8 * 128], 8, 128).unwrap();
    let err = pack(
        Pairing::GateUp,
        &[SourceWeight::Fp8(&a), SourceWeight::Fp8(&b)],
    );
    assert!(err.unwrap_err().to_string().contains("share shape"));
    assert!(pack(Pairing::GateUp, &[SourceWeight::Fp8(&a)]).is_err());
    let bits = [0u16; 16 * 100];
    let odd = SourceWeight::Bf16 {
        rows: 16,
        cols: 100,
        bits: &bits,
    };
    assert!(pack(Pairing::Plain, &[odd]).is_err());
}
