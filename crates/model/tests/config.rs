use model::{CacheFormat, IndexerKind, IndexerType, MlpKind, ModelConfig, ModelError, Preset};
use serde_json::{json, Value};

/// GLM-5's config.json as published (spec §1.1, CFG5), trimmed of fields this crate ignores but
/// keeping a few of them to show they are skipped.
const GLM5_CONFIG_JSON: &str = r#"{
  "architectures": ["GlmMoeDsaForCausalLM"],
  "model_type": "glm_moe_dsa",
  "attention_bias": false,
  "dtype": "bfloat16",
  "eos_token_id": [154820, 154827, 154829],
  "first_k_dense_replace": 3,
  "hidden_act": "silu",
  "hidden_size": 6144,
  "index_head_dim": 128,
  "index_n_heads": 32,
  "index_topk": 2048,
  "indexer_rope_interleave": true,
  "intermediate_size": 12288,
  "kv_lora_rank": 512,
  "max_position_embeddings": 202752,
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 1,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 64,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 78,
  "num_key_value_heads": 64,
  "num_nextn_predict_layers": 1,
  "pad_token_id": 154820,
  "q_lora_rank": 2048,
  "qk_head_dim": 256,
  "qk_nope_head_dim": 192,
  "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-05,
  "rope_interleave": true,
  "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
  "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid",
  "tie_word_embeddings": false,
  "topk_group": 1,
  "topk_method": "noaux_tc",
  "transformers_version": "5.0.2.dev0",
  "use_cache": true,
  "v_head_dim": 256,
  "vocab_size": 154880
}"#;

fn edited(preset: Preset, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> String {
    let mut value: Value = serde_json::from_str(&preset.config().to_json().unwrap()).unwrap();
    let map = value.as_object_mut().unwrap();
    // Drop the explicit list so the freq/offset fields decide, as in the released configs.
    map.remove("indexer_types");
    edit(map);
    value.to_string()
}

fn full_layers(cfg: &ModelConfig) -> Vec<usize> {
    cfg.layer_plan()
        .unwrap()
        .iter()
        .filter(|l| l.indexer == IndexerKind::Full)
        .map(|l| l.index)
        .collect()
}

fn invalid_field(result: Result<ModelConfig, ModelError>) -> &'static str {
    match result {
        Err(ModelError::InvalidConfig { field, .. }) => field,
        other => panic!("expected an invalid-config error, got {other:?}"),
    }
}

#[test]
fn published_glm5_config_reads_as_the_preset() {
    let cfg = ModelConfig::from_json_str(GLM5_CONFIG_JSON).unwrap();
    assert_eq!(cfg, Preset::Glm5.config());
}

#[test]
fn every_preset_is_valid_and_round_trips_through_json() {
    for preset in Preset::ALL {
        let cfg = preset.config();
        cfg.validate().unwrap();
        let back = ModelConfig::from_json_str(&cfg.to_json().unwrap()).unwrap();
        assert_eq!(back, cfg, "{preset}");
        assert_eq!(ModelConfig::preset(preset.name()).unwrap(), cfg);
    }
}

#[test]
fn unknown_preset_lists_the_valid_names() {
    let err = ModelConfig::preset("glm-4").unwrap_err();
    let text = err.to_string();
    for preset in Preset::ALL {
        assert!(text.contains(preset.name()), "{text}");
    }
}

#[test]
fn export_spells_out_what_transformers_needs() {
    let value: Value = serde_json::from_str(&Preset::Glm52.config().to_json().unwrap()).unwrap();
    assert_eq!(value["model_type"], "glm_moe_dsa");
    assert_eq!(value["architectures"], json!(["GlmMoeDsaForCausalLM"]));
    assert_eq!(
        value["rope_parameters"],
        json!({"rope_theta": 8e6, "rope_type": "default"})
    );
    assert_eq!(value["head_dim"], 64);
    let types = value["indexer_types"].as_array().unwrap();
    assert_eq!(types.len(), 78);
    assert_eq!(types[3], "shared");
    assert_eq!(types[6], "full");
}

#[test]
fn glm5_runs_an_indexer_on_every_layer() {
    let plan = Preset::Glm5.config().layer_plan().unwrap();
    assert_eq!(plan.len(), 78);
    assert!(plan.iter().all(|l| l.indexer == IndexerKind::Full));
    let dense: Vec<usize> = plan
        .iter()
        .filter(|l| l.mlp == MlpKind::Dense)
        .map(|l| l.index)
        .collect();
    assert_eq!(dense, [0, 1, 2]);
}

#[test]
fn glm52_full_layers_are_0_1_2_then_every_fourth_from_6() {
    let cfg = Preset::Glm52.config();
    let mut expected = vec![0, 1, 2];
    expected.extend((6..=74).step_by(4));
    assert_eq!(full_layers(&cfg), expected);
    assert_eq!(expected.len(), 21);

    let plan = cfg.layer_plan().unwrap();
    let moe_full = plan
        .iter()
        .filter(|l| l.mlp == MlpKind::Moe && l.indexer == IndexerKind::Full)
        .count();
    assert_eq!(moe_full, 18);
    let source = |i: usize| plan[i].indexer;
    assert_eq!(source(3), IndexerKind::Shared { source_layer: 2 });
    assert_eq!(source(5), IndexerKind::Shared { source_layer: 2 });
    assert_eq!(source(7), IndexerKind::Shared { source_layer: 6 });
    assert_eq!(source(77), IndexerKind::Shared { source_layer: 74 });
}

#[test]
fn tiny_has_dense_full_moe_full_and_moe_shared_layers() {
    let plan = Preset::Tiny.config().layer_plan().unwrap();
    let summary: Vec<(MlpKind, IndexerKind)> = plan.iter().map(|l| (l.mlp, l.indexer)).collect();
    use IndexerKind::{Full, Shared};
    use MlpKind::{Dense, Moe};
    assert_eq!(
        summary,
        [
            (Dense, Full),
            (Dense, Full),
            (Moe, Shared { source_layer: 1 }),
            (Moe, Shared { source_layer: 1 }),
            (Moe, Full),
            (Moe, Shared { source_layer: 4 }),
        ]
    );
}

#[test]
fn missing_offset_takes_transformers_default_of_2() {
    let text = edited(Preset::Glm5, |m| {
        m.insert("index_topk_freq".into(), json!(4));
        m.remove("index_skip_topk_offset");
    });
    let cfg = ModelConfig::from_json_str(&text).unwrap();
    assert_eq!(cfg.index_skip_topk_offset, 2);
    assert_eq!(&full_layers(&cfg)[..5], [0, 1, 5, 9, 13]);
}

#[test]
fn top_level_rope_theta_is_accepted() {
    let text = edited(Preset::Glm5, |m| {
        m.remove("rope_parameters");
        m.insert("rope_theta".into(), json!(1e6));
    });
    assert_eq!(
        ModelConfig::from_json_str(&text).unwrap(),
        Preset::Glm5.config()
    );
}

#[test]
fn explicit_indexer_list_and_pattern_override_the_rule() {
    let text = edited(Preset::Tiny, |m| {
        m.insert(
            "indexer_types".into(),
            json!(["full", "shared", "full", "shared", "shared", "shared"]),
        );
    });
    let cfg = ModelConfig::from_json_str(&text).unwrap();
    assert_eq!(full_layers(&cfg), [0, 2]);
    assert_eq!(cfg.indexer_types()[1], IndexerType::Shared);

    let text = edited(Preset::Tiny, |m| {
        m.insert("index_topk_pattern".into(), json!("FFFSFS"));
    });
    assert_eq!(
        full_layers(&ModelConfig::from_json_str(&text).unwrap()),
        [0, 1, 2, 4]
    );

    let text = edited(Preset::Tiny, |m| {
        m.insert("index_topk_pattern".into(), json!("FFXSFS"));
    });
    assert_eq!(
        invalid_field(ModelConfig::from_json_str(&text)),
        "index_topk_pattern"
    );
}

#[test]
fn missing_shape_field_is_an_error() {
    let text = edited(Preset::Glm5, |m| {
        m.remove("hidden_size");
    });
    let err = ModelConfig::from_json_str(&text).unwrap_err();
    assert!(err.to_string().contains("hidden_size"), "{err}");
}

#[test]
fn from_file_reads_and_reports_missing_files() {
    let dir = std::env::temp_dir().join(format!("model-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.json");
    std::fs::write(&path, Preset::Tiny.config().to_json().unwrap()).unwrap();
    assert_eq!(
        ModelConfig::from_file(&path).unwrap(),
        Preset::Tiny.config()
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let err = ModelConfig::from_file(&path).unwrap_err();
    assert!(matches!(err, ModelError::Io { .. }), "{err}");
}

#[test]
fn validation_names_the_offending_field() {
    // (field the error must name, keys to overwrite in GLM-5's config)
    let cases = [
        ("qk_rope_head_dim", vec![("qk_rope_head_dim", json!(63))]),
        // Below the rope part the indexer ropes (any width above it is the model's).
        ("index_head_dim", vec![("index_head_dim", json!(32))]),
        (
            "first_k_dense_replace",
            vec![("first_k_dense_replace", json!(79))],
        ),
        (
            "num_experts_per_tok",
            vec![("num_experts_per_tok", json!(300))],
        ),
        ("index_topk", vec![("index_topk", json!(0))]),
        ("index_topk_freq", vec![("index_topk_freq", json!(0))]),
        ("n_group", vec![("n_group", json!(8))]),
        ("hidden_act", vec![("hidden_act", json!("gelu"))]),
        (
            "rope_parameters.rope_type",
            vec![(
                "rope_parameters",
                json!({"rope_theta": 1e4, "rope_type": "yarn"}),
            )],
        ),
        ("model_type", vec![("model_type", json!("deepseek_v32"))]),
        // Offset 0 with freq 2 makes layer 0 shared, with nothing before it to share.
        (
            "indexer_types",
            vec![
                ("index_topk_freq", json!(2)),
                ("index_skip_topk_offset", json!(0)),
            ],
        ),
    ];
    for (field, overrides) in cases {
        let text = edited(Preset::Glm5, |m| {
            for (key, value) in overrides {
                m.insert(key.to_owned(), value);
            }
        });
        let result = ModelConfig::from_json_str(&text);
        let err = result.as_ref().map(|_| ()).unwrap_err().to_string();
        assert_eq!(invalid_field(result), field, "{err}");
        assert!(err.contains(field), "{err}");
    }
}

/// The tiny preset exported by us, loaded into transformers 5.24's `GlmMoeDsaConfig` and saved
/// back with `save_pretrained`: what the golden generator will hand us.
#[test]
fn tiny_config_saved_by_transformers_reads_back_as_the_preset() {
    let text = include_str!("fixtures/tiny_saved_by_transformers.json");
    assert_eq!(
        ModelConfig::from_json_str(text).unwrap(),
        Preset::Tiny.config()
    );
}

/// Widths no kernel tiles (kv_lora_rank 48, hidden 200, 3 heads, index_head_dim 48, vocab 301),
/// in the form transformers saves a `glm_moe_dsa` config: a valid model, whatever cache or
/// kernel can or cannot hold it.
const ODD_WIDTHS: &str = include_str!("fixtures/odd_widths.json");

#[test]
fn odd_widths_are_a_valid_model() {
    let cfg = ModelConfig::from_json_str(ODD_WIDTHS).unwrap();
    assert_eq!(
        (cfg.kv_lora_rank, cfg.hidden_size, cfg.num_attention_heads),
        (48, 200, 3)
    );
    assert_eq!(cfg.index_head_dim, 48);
    let back = ModelConfig::from_json_str(&cfg.to_json().unwrap()).unwrap();
    assert_eq!(back, cfg);
    model::RankShapes::new(&cfg, 1).unwrap();
    model::weights::checkpoint_tensors(&cfg).unwrap();
    // The bf16 cache takes any width.
    cfg.check_mla_cache(CacheFormat::Bf16, "`--cache bf16`")
        .unwrap();
}

/// The FP8 cache's and the Hadamard rotation's rules fire when a run asks for them, and name
/// the field, the format or kernel, and the option that asked.
#[test]
fn format_and_kernel_rules_name_the_option_that_asked() {
    let cfg = ModelConfig::from_json_str(ODD_WIDTHS).unwrap();
    let err = cfg
        .check_mla_cache(CacheFormat::Fp8, "`--cache fp8`")
        .unwrap_err();
    assert!(
        matches!(
            &err,
            ModelError::Unsuited {
                field: "kv_lora_rank",
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    for part in [
        "`kv_lora_rank` is 48",
        "FP8 MLA cache",
        "`--cache fp8`",
        "multiple of 128",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    let text = cfg
        .check_index_hadamard("`indexer.hadamard`")
        .unwrap_err()
        .to_string();
    for part in ["`index_head_dim` is 48", "Hadamard", "`indexer.hadamard`"] {
        assert!(text.contains(part), "{part}: {text}");
    }
    // The same rules pass the widths they are written for.
    for preset in Preset::ALL {
        let cfg = preset.config();
        cfg.check_mla_cache(CacheFormat::Fp8, "a test").unwrap();
        cfg.check_index_hadamard("a test").unwrap();
    }
}

#[test]
fn first_layers_keep_the_layer_kinds_and_refuse_none_or_too_many() {
    let cfg = ModelConfig::preset("glm-5.2").unwrap();
    let eight = cfg.first_layers(8).unwrap();
    assert_eq!(eight.num_hidden_layers, 8);
    assert_eq!(
        eight.layer_plan().unwrap(),
        cfg.layer_plan().unwrap()[..8].to_vec()
    );
    assert_eq!(full_layers(&eight), vec![0, 1, 2, 6]);
    assert_eq!(invalid_field(cfg.first_layers(0)), "num_hidden_layers");
    assert_eq!(invalid_field(cfg.first_layers(79)), "num_hidden_layers");
}
