use model::{
    IndexerKind, LayerPlan, MlpKind, ModelConfig, ModelError, Preset, RankShapes, Storage,
    WeightClass, WeightFormat, WeightSpec,
};

fn layer(mlp: MlpKind, indexer: IndexerKind) -> LayerPlan {
    LayerPlan {
        index: 3,
        mlp,
        indexer,
    }
}

fn find<'a>(table: &'a [WeightSpec], name: &str) -> &'a WeightSpec {
    table
        .iter()
        .find(|w| w.name == name)
        .unwrap_or_else(|| panic!("no weight {name}"))
}

#[test]
fn glm5_full_width_shapes_match_spec_1_5() {
    let shapes = RankShapes::new(&Preset::Glm5.config(), 1).unwrap();
    let table = shapes.layer_weights(&layer(MlpKind::Moe, IndexerKind::Full));
    let expect = [
        ("self_attn.q_a_proj.weight", [2048, 6144]),
        ("self_attn.q_b_proj.weight", [16384, 2048]),
        ("self_attn.kv_a_proj_with_mqa.weight", [576, 6144]),
        ("self_attn.kv_b_proj.weight", [28672, 512]),
        ("self_attn.o_proj.weight", [6144, 16384]),
        ("self_attn.indexer.wq_b.weight", [4096, 2048]),
        ("self_attn.indexer.wk.weight", [128, 6144]),
        ("self_attn.indexer.k_norm.bias", [128, 1]),
        ("self_attn.indexer.weights_proj.weight", [32, 6144]),
        ("mlp.gate.weight", [256, 6144]),
        ("mlp.gate.e_score_correction_bias", [256, 1]),
        ("mlp.shared_experts.gate_proj.weight", [2048, 6144]),
        ("mlp.experts.*.up_proj.weight", [2048, 6144]),
        ("mlp.experts.*.down_proj.weight", [6144, 2048]),
    ];
    for (name, shape) in expect {
        assert_eq!(find(&table, name).shape, shape, "{name}");
    }
    assert_eq!(find(&table, "mlp.experts.*.gate_proj.weight").count, 256);

    let dense = shapes.layer_weights(&layer(MlpKind::Dense, IndexerKind::Full));
    assert_eq!(find(&dense, "mlp.gate_proj.weight").shape, [12288, 6144]);
    assert_eq!(find(&dense, "mlp.down_proj.weight").shape, [6144, 12288]);

    let tail = shapes.tail_weights();
    assert_eq!(find(&tail, "lm_head.weight").shape, [154880, 6144]);
    assert_eq!(shapes.embedding().shape, [154880, 6144]);
}

#[test]
fn tp8_splits_heads_and_intermediates_and_replicates_the_rest() {
    let shapes = RankShapes::new(&Preset::Glm5.config(), 8).unwrap();
    assert_eq!(shapes.heads, 8);
    let table = shapes.layer_weights(&layer(MlpKind::Moe, IndexerKind::Full));
    let expect = [
        (
            "self_attn.q_a_proj.weight",
            [2048, 6144],
            WeightClass::Replicated,
        ),
        (
            "self_attn.q_b_proj.weight",
            [2048, 2048],
            WeightClass::Sharded,
        ),
        (
            "self_attn.kv_a_proj_with_mqa.weight",
            [576, 6144],
            WeightClass::Replicated,
        ),
        (
            "self_attn.kv_b_proj.weight",
            [3584, 512],
            WeightClass::Sharded,
        ),
        (
            "self_attn.o_proj.weight",
            [6144, 2048],
            WeightClass::Sharded,
        ),
        (
            "self_attn.indexer.wq_b.weight",
            [4096, 2048],
            WeightClass::Replicated,
        ),
        (
            "self_attn.indexer.wk.weight",
            [128, 6144],
            WeightClass::Replicated,
        ),
        ("mlp.gate.weight", [256, 6144], WeightClass::Replicated),
        (
            "mlp.shared_experts.up_proj.weight",
            [256, 6144],
            WeightClass::SharedExpert,
        ),
        (
            "mlp.experts.*.down_proj.weight",
            [6144, 256],
            WeightClass::RoutedExpert,
        ),
    ];
    for (name, shape, class) in expect {
        let w = find(&table, name);
        assert_eq!((w.shape, w.class), (shape, class), "{name}");
    }
    let dense = shapes.layer_weights(&layer(MlpKind::Dense, IndexerKind::Full));
    assert_eq!(find(&dense, "mlp.up_proj.weight").shape, [1536, 6144]);
    let lm_head = find(&shapes.tail_weights(), "lm_head.weight").clone();
    assert_eq!(
        (lm_head.shape, lm_head.class),
        ([19360, 6144], WeightClass::Sharded)
    );
}

#[test]
fn shared_layers_have_no_indexer_weights() {
    let shapes = RankShapes::new(&Preset::Glm52.config(), 1).unwrap();
    let shared = IndexerKind::Shared { source_layer: 2 };
    let table = shapes.layer_weights(&layer(MlpKind::Moe, shared));
    assert!(table.iter().all(|w| !w.name.contains("indexer")));
    let full = shapes.layer_weights(&layer(MlpKind::Moe, IndexerKind::Full));
    assert_eq!(full.len() - table.len(), 5);
}

#[test]
fn never_quantised_tensors_stay_bf16_or_f32() {
    let shapes = RankShapes::new(&Preset::Glm5.config(), 1).unwrap();
    let mut table = shapes.layer_weights(&layer(MlpKind::Moe, IndexerKind::Full));
    table.extend(shapes.tail_weights());
    table.push(shapes.embedding());
    for w in &table {
        let quantisable = w.storage == Storage::Quantisable;
        let never = w.name.contains("norm")
            || w.name.contains("weights_proj")
            || w.name.starts_with("mlp.gate.")
            || w.name.contains("embed")
            || w.name.contains("lm_head");
        assert_eq!(quantisable, !never, "{}", w.name);
    }
    let bias = find(&table, "mlp.gate.e_score_correction_bias");
    assert_eq!(bias.storage, Storage::F32);
    assert_eq!(bias.bytes(WeightFormat::Fp8), 256 * 4);
}

#[test]
fn every_preset_shards_at_every_supported_tp() {
    for preset in Preset::ALL {
        for tp in model::SUPPORTED_TP {
            let shapes = RankShapes::new(&preset.config(), tp).unwrap();
            assert_eq!(shapes.heads * tp, preset.config().num_attention_heads);
        }
    }
}

#[test]
fn unsupported_or_indivisible_tp_is_an_error() {
    let glm5 = Preset::Glm5.config();
    for tp in [0, 3, 16] {
        assert!(matches!(
            RankShapes::new(&glm5, tp),
            Err(ModelError::Sharding { .. })
        ));
    }
    let cfg = ModelConfig {
        num_attention_heads: 12,
        ..Preset::Tiny.config()
    };
    let err = RankShapes::new(&cfg, 8).unwrap_err();
    assert!(err.to_string().contains("num_attention_heads"), "{err}");
    let cfg = ModelConfig {
        vocab_size: 2044,
        ..Preset::Tiny.config()
    };
    let err = RankShapes::new(&cfg, 8).unwrap_err();
    assert!(err.to_string().contains("vocab_size"), "{err}");
}
