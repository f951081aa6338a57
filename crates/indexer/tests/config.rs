//! The wgmma scorer's config checks: what it refuses before any compile, and the LDS it asks for.

use indexer::gpu::{KernelConfig, RING};
use indexer::reference::{IndexerDims, IndexerOptions, VectorFormat};
use model::ModelConfig;

fn wgmma(preset: &str) -> KernelConfig {
    let cfg = ModelConfig::preset(preset).unwrap();
    let dims = IndexerDims::new(&cfg).unwrap();
    KernelConfig {
        wgmma: true,
        ..KernelConfig::new(dims, &IndexerOptions::deepseek(&cfg)).unwrap()
    }
}

#[test]
fn wgmma_takes_glm5_fp8_queries_only() {
    assert!(wgmma("glm-5").check().is_ok());
    let tiny = wgmma("tiny").check().unwrap_err().to_string();
    assert!(tiny.contains("32 heads x 128"), "{tiny}");
    let bf16 = KernelConfig {
        query: VectorFormat::Bf16,
        ..wgmma("glm-5")
    };
    assert!(bf16.check().is_err());
    let one_slot = KernelConfig {
        ring: 1,
        ..wgmma("glm-5")
    };
    assert!(one_slot
        .check()
        .unwrap_err()
        .to_string()
        .contains("at least 2"));
}

/// Two scoring CTAs must fit a SM (H200: 228 KiB, 1 KiB of it reserved per CTA) at the default
/// ring; the other methods take no dynamic LDS.
#[test]
fn default_ring_leaves_room_for_two_ctas_a_sm() {
    let config = wgmma("glm-5");
    assert_eq!(config.ring, RING);
    let bytes = config.score_lds_bytes();
    assert!(2 * (bytes + 1024) <= 228 * 1024, "{bytes} B");
    let more = KernelConfig {
        ring: RING + 1,
        ..config
    };
    assert!(2 * (more.score_lds_bytes() + 1024) > 228 * 1024);
    let mma = KernelConfig {
        wgmma: false,
        ..config
    };
    assert_eq!(mma.score_lds_bytes(), 0);
}
