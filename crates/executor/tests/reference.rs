//! The reference step's own contract: prefill as one step, MTP verify rows and interleaved
//! requests all give what single-row steps give; rows that break the cache order are refused;
//! shared layers reuse their source's top-k; a step given its own top-k lists and experts back is
//! the step, other ones change what the layers attend over and route to, and lists or experts
//! that are not choices of the rows are refused; each "difference on purpose" switch has an effect;
//! a config of widths no kernel tiles runs with every format that can hold it (through `mono step`
//! too, from a folder as Hugging Face writes one), and the others refuse it naming the option that
//! asked for them.

use executor::reference::cli::{self, Numerics, StepArgs};
use executor::reference::{
    Choices, DecodeState, ReferenceModel, ReferenceOptions, Row, StepOutput,
};
use indexer::reference::IndexerOptions;
use mla::reference::{CacheStore, MlaOptions};
use model::weights::{write_checkpoint, Synthetic, SINGLE_FILE};
use model::{CacheFormat, IndexerKind, ModelConfig, WeightFormat};

fn tiny() -> ModelConfig {
    ModelConfig::preset("tiny").unwrap()
}

fn model() -> ReferenceModel {
    let cfg = tiny();
    ReferenceModel::load(&cfg, &Synthetic::new(&cfg, 21, WeightFormat::Bf16).unwrap()).unwrap()
}

fn rows(request: usize, positions: std::ops::Range<usize>) -> Vec<Row> {
    rows_of_vocab(2048, request, positions)
}

fn rows_of_vocab(vocab: usize, request: usize, positions: std::ops::Range<usize>) -> Vec<Row> {
    positions
        .map(|p| Row {
            request,
            token: ((p * 733 + request * 97 + 5) % vocab) as u32,
            position: p,
        })
        .collect()
}

/// Row `r` of a step's output: every layer's hidden state and the logits.
fn row_of(out: &StepOutput, r: usize) -> (Vec<Vec<f32>>, Vec<f32>) {
    (
        out.hidden.iter().map(|l| l[r].clone()).collect(),
        out.logits[r].clone(),
    )
}

fn one_by_one(
    model: &ReferenceModel,
    state: &mut DecodeState,
    rows: &[Row],
) -> Vec<(Vec<Vec<f32>>, Vec<f32>)> {
    rows.iter()
        .map(|r| row_of(&model.step(state, std::slice::from_ref(r)).unwrap(), 0))
        .collect()
}

#[test]
fn batched_rows_equal_single_row_steps_bit_for_bit() {
    let model = model();
    let cfg = tiny();
    for options in [
        ReferenceOptions::transformers(&cfg, false),
        ReferenceOptions::engines(&cfg),
    ] {
        // 24 + 4 > index_topk = 16, so selection drops tokens.
        let prompt = rows(0, 0..24);
        let verify = rows(0, 24..28);
        let mut batched = DecodeState::new(&model, 1, options).unwrap();
        let prefill = model.step(&mut batched, &prompt).unwrap();
        let step = model.step(&mut batched, &verify).unwrap();
        let mut single = DecodeState::new(&model, 1, options).unwrap();
        let expected_prefill = one_by_one(&model, &mut single, &prompt);
        let expected_verify = one_by_one(&model, &mut single, &verify);
        for (r, expected) in expected_prefill.iter().enumerate() {
            assert_eq!(&row_of(&prefill, r), expected, "prefill row {r}");
        }
        for (r, expected) in expected_verify.iter().enumerate() {
            assert_eq!(&row_of(&step, r), expected, "verify row {r}");
        }
        assert_eq!(batched.cached(0), Some(28));
    }
}

#[test]
fn interleaved_requests_equal_each_request_alone() {
    let model = model();
    let options = ReferenceOptions::engines(&tiny());
    let (a, b) = (rows(0, 0..20), rows(1, 0..20));
    let mut both = DecodeState::new(&model, 2, options).unwrap();
    let mixed: Vec<Row> = a.iter().zip(&b).flat_map(|(x, y)| [*x, *y]).collect();
    let out = model.step(&mut both, &mixed).unwrap();
    for (request, rows) in [(0, &a), (1, &b)] {
        let mut alone = DecodeState::new(&model, 1, options).unwrap();
        let rows: Vec<Row> = rows.iter().map(|r| Row { request: 0, ..*r }).collect();
        let expected = model.step(&mut alone, &rows).unwrap();
        for r in 0..rows.len() {
            assert_eq!(
                row_of(&out, 2 * r + request),
                row_of(&expected, r),
                "request {request} row {r}"
            );
        }
    }
}

#[test]
fn rows_that_break_the_cache_order_are_refused() {
    let model = model();
    let mut state = DecodeState::new(&model, 1, ReferenceOptions::engines(&tiny())).unwrap();
    let error =
        |state: &mut DecodeState, rows: &[Row]| model.step(state, rows).unwrap_err().to_string();
    assert!(error(&mut state, &[]).contains("at least one row"));
    let skip = error(&mut state, &rows(0, 1..2));
    assert!(skip.contains("next row must be at 0, not 1"), "{skip}");
    let unknown = error(&mut state, &rows(3, 0..1));
    assert!(
        unknown.contains("request 3 but the state holds 1"),
        "{unknown}"
    );
    let token = error(
        &mut state,
        &[Row {
            request: 0,
            token: 2048,
            position: 0,
        }],
    );
    assert!(token.contains("outside the vocabulary"), "{token}");
    model.step(&mut state, &rows(0, 0..3)).unwrap();
    let repeat = error(&mut state, &rows(0, 2..3));
    assert!(repeat.contains("must be at 3, not 2"), "{repeat}");
}

#[test]
fn shared_layers_reuse_their_source_top_k_and_short_rows_select_everything() {
    let model = model();
    let cfg = tiny();
    let mut state = DecodeState::new(&model, 1, ReferenceOptions::engines(&cfg)).unwrap();
    let out = model.step(&mut state, &rows(0, 0..40)).unwrap();
    for plan in cfg.layer_plan().unwrap() {
        match plan.indexer {
            IndexerKind::Shared { source_layer } => {
                assert_eq!(
                    out.topk[plan.index], out.topk[source_layer],
                    "layer {}",
                    plan.index
                );
                assert!(out.index_scores[plan.index].is_none());
            }
            IndexerKind::Full => assert!(out.index_scores[plan.index].is_some()),
        }
    }
    let k = cfg.index_topk;
    for (p, list) in out.topk[0].iter().enumerate() {
        let selected: Vec<i32> = list.iter().copied().filter(|&t| t >= 0).collect();
        assert_eq!(list.len(), k);
        if p < k {
            assert_eq!(selected, (0..=p as i32).collect::<Vec<_>>(), "row {p}");
        } else {
            assert_eq!(selected.len(), k);
            assert!(
                selected.iter().all(|&t| t <= p as i32),
                "row {p} selected a future key"
            );
        }
    }
}

/// A step taking the lists and experts of `choices`, from the state after 40 prefilled tokens.
fn choosing(model: &ReferenceModel, choices: &Choices) -> Result<StepOutput, String> {
    let mut state = DecodeState::new(model, 1, ReferenceOptions::engines(&tiny())).unwrap();
    model.step(&mut state, &rows(0, 0..40)).unwrap();
    model
        .step_choosing(&mut state, &rows(0, 40..42), choices)
        .map_err(|e| e.to_string())
}

#[test]
fn a_step_takes_given_lists_and_experts() {
    let model = model();
    let cfg = tiny();
    let own = choosing(&model, &Choices::default()).unwrap();
    let layers = cfg.num_hidden_layers;
    let given = Choices {
        lists: (0..layers)
            .map(|l| own.index_scores[l].as_ref().map(|_| own.topk[l].clone()))
            .collect(),
        experts: (0..layers)
            .map(|l| {
                own.routes[l].as_ref().map(|rows| {
                    rows.iter()
                        .map(|r| r.iter().map(|x| x.expert).collect())
                        .collect()
                })
            })
            .collect(),
    };
    assert!(given.lists[0].is_some() && given.experts.iter().any(Option::is_some));
    assert_eq!(
        choosing(&model, &given).unwrap(),
        own,
        "its own choices given back"
    );

    // Layer 0's list of row 1 with its first key swapped for one it did not select: the layer
    // attends over it (and the layers sharing layer 0's lists, if any, too), its scores stay.
    let mut list = given.clone();
    let row = &mut list.lists[0].as_mut().unwrap()[1];
    let outside = (0..=41).find(|p| !row.contains(p)).unwrap();
    row[0] = outside;
    let other = choosing(&model, &list).unwrap();
    assert_eq!(other.topk[0][1][0], outside);
    assert_eq!(other.index_scores[0], own.index_scores[0]);
    assert_ne!(other.hidden[0][1], own.hidden[0][1]);
    assert_eq!(other.hidden[0][0], own.hidden[0][0], "row 0 keeps its list");

    // The first MoE layer's row 0 routed to an expert it did not choose.
    let moe = given.experts.iter().position(Option::is_some).unwrap();
    let mut routed = given.clone();
    let experts = &mut routed.experts[moe].as_mut().unwrap()[0];
    let unchosen = (0..cfg.n_routed_experts)
        .find(|e| !experts.contains(e))
        .unwrap();
    experts[0] = unchosen;
    let other = choosing(&model, &routed).unwrap();
    assert_eq!(other.routes[moe].as_ref().unwrap()[0][0].expert, unchosen);
    assert_eq!(other.router_scores[moe], own.router_scores[moe]);
    assert_ne!(other.hidden[moe][0], own.hidden[moe][0]);

    // Lists and experts that are not choices of the rows are refused, naming the layer.
    let refused = |edit: &dyn Fn(&mut Choices)| {
        let mut c = given.clone();
        edit(&mut c);
        choosing(&model, &c).unwrap_err()
    };
    let e = refused(&|c| c.lists[0].as_mut().unwrap()[0][0] = 41);
    assert!(
        e.contains("layer 0: row 0 lists position 41, past its own (40)"),
        "{e}"
    );
    let e = refused(&|c| {
        let r = &mut c.lists[0].as_mut().unwrap()[0];
        r[1] = r[0];
    });
    assert!(e.contains("twice"), "{e}");
    let e = refused(&|c| {
        c.lists[0].as_mut().unwrap()[0].pop();
    });
    assert!(e.contains("not k = 16"), "{e}");
    let e = refused(&|c| c.experts[moe].as_mut().unwrap()[1][0] = cfg.n_routed_experts);
    assert!(
        e.contains(&format!("layer {moe}: row 1 routes to expert 16 of 16")),
        "{e}"
    );
    let e = refused(&|c| {
        c.experts[moe].as_mut().unwrap().pop();
    });
    assert!(e.contains("experts for 1 rows, not 2"), "{e}");
    let shared = cfg
        .layer_plan()
        .unwrap()
        .iter()
        .find(|p| matches!(p.indexer, IndexerKind::Shared { .. }))
        .map(|p| p.index);
    if let Some(l) = shared {
        let e = refused(&|c| c.lists[l] = Some(own.topk[l].clone()));
        assert!(e.contains("shares another layer's"), "{e}");
    }
}

/// Relative L2 distance of layer `layer`'s hidden states, all rows.
fn distance(a: &StepOutput, b: &StepOutput, layer: usize) -> f64 {
    let (mut diff, mut norm) = (0.0, 0.0);
    for (x, y) in a.hidden[layer].iter().zip(&b.hidden[layer]) {
        for (&u, &v) in x.iter().zip(y) {
            diff += (f64::from(u) - f64::from(v)).powi(2);
            norm += f64::from(v).powi(2);
        }
    }
    (diff / norm).sqrt()
}

#[test]
fn each_switch_changes_the_result_by_its_own_amount() {
    let model = model();
    let cfg = tiny();
    let base = ReferenceOptions::transformers(&cfg, false);
    let run = |options: ReferenceOptions| {
        let mut state = DecodeState::new(&model, 1, options).unwrap();
        model.step(&mut state, &rows(0, 0..32)).unwrap()
    };
    let reference = run(base);
    let switches: [(&str, ReferenceOptions, f64, f64); 5] = [
        (
            "bf16 MLA cache",
            ReferenceOptions {
                mla_cache: CacheStore::Format(CacheFormat::Bf16),
                ..base
            },
            1e-4,
            2e-2,
        ),
        (
            "FP8 MLA cache",
            ReferenceOptions {
                mla_cache: CacheStore::Format(CacheFormat::Fp8),
                ..base
            },
            1e-3,
            1e-1,
        ),
        (
            "latent eps 1e-5",
            ReferenceOptions {
                mla: MlaOptions {
                    latent_norm_eps: 1e-5,
                    ..base.mla
                },
                ..base
            },
            0.0,
            1e-4,
        ),
        (
            "bf16 activations",
            ReferenceOptions::transformers(&cfg, true),
            1e-4,
            3e-2,
        ),
        (
            "FP8 + Hadamard indexer",
            ReferenceOptions {
                indexer: IndexerOptions {
                    bf16_projections: false,
                    ..IndexerOptions::deepseek(&cfg)
                },
                ..base
            },
            // Measured 1.23e-1: the scores move by a few percent (checked below), enough to swap
            // near-tied keys at the k-th place, and a row past k = 16 keys then attends other
            // tokens. The margin is a factor of two either way.
            6e-2,
            2.5e-1,
        ),
    ];
    for (name, options, lower, upper) in switches {
        let out = run(options);
        // Layer 0 before any top-k can differ much; the indexer switch shows in the scores.
        let d = distance(&out, &reference, 0);
        println!("{name}: layer-0 distance {d:.3e}");
        assert!(
            d > lower && d < upper,
            "{name}: layer-0 distance {d:e} outside ({lower:e}, {upper:e})"
        );
        assert_ne!(out.logits, reference.logits, "{name} changed nothing");
    }
    let fp8_indexer = run(ReferenceOptions {
        indexer: IndexerOptions {
            bf16_projections: false,
            ..IndexerOptions::deepseek(&cfg)
        },
        ..base
    });
    let (ours, theirs) = (
        fp8_indexer.index_scores[0].as_ref().unwrap(),
        reference.index_scores[0].as_ref().unwrap(),
    );
    let worst = ours
        .iter()
        .flatten()
        .zip(theirs.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    let largest = theirs
        .iter()
        .flatten()
        .filter(|v| v.is_finite())
        .fold(0.0, |m: f32, v| m.max(v.abs()));
    let relative = worst / largest;
    println!(
        "FP8 + Hadamard indexer: worst layer-0 score error {relative:.3e} of the largest score"
    );
    // Measured 3.2e-2 (E4M3 keeps 3 mantissa bits: each of q and k rounds by up to 2^-4); the
    // margin is a factor of two either way, so a change to the quantisation shows.
    assert!(
        (1.6e-2..6.4e-2).contains(&relative),
        "FP8 + Hadamard index scores: worst error {relative:e} of the largest score, measured 3.2e-2"
    );
}

/// kv_lora_rank 48, hidden 200, 3 heads, index_head_dim 48, vocab 301: a model transformers
/// runs, though the FP8 MLA cache (128-element tiles) and the Hadamard rotation (powers of two)
/// cannot hold it.
fn odd_widths() -> (ModelConfig, ReferenceModel) {
    let cfg =
        ModelConfig::from_json_str(include_str!("../../model/tests/fixtures/odd_widths.json"))
            .unwrap();
    let model =
        ReferenceModel::load(&cfg, &Synthetic::new(&cfg, 5, WeightFormat::Bf16).unwrap()).unwrap();
    (cfg, model)
}

/// The formats that hold any width: transformers' numerics in fp32 and bf16, and the engines'
/// with a bf16 MLA cache and FP8 index keys without the rotation (SGLang's fused path).
fn options_for_any_width(cfg: &ModelConfig) -> [ReferenceOptions; 3] {
    [
        ReferenceOptions::transformers(cfg, false),
        ReferenceOptions::transformers(cfg, true),
        ReferenceOptions {
            mla_cache: CacheStore::Format(CacheFormat::Bf16),
            indexer: IndexerOptions::sglang_fused(cfg),
            ..ReferenceOptions::engines(cfg)
        },
    ]
}

#[test]
fn odd_widths_run_the_reference_step() {
    let (cfg, model) = odd_widths();
    for options in options_for_any_width(&cfg) {
        // 12 + 3 > index_topk = 8, so selection drops tokens.
        let prompt = rows_of_vocab(cfg.vocab_size, 0, 0..12);
        let verify = rows_of_vocab(cfg.vocab_size, 0, 12..15);
        let mut batched = DecodeState::new(&model, 1, options).unwrap();
        model.step(&mut batched, &prompt).unwrap();
        let step = model.step(&mut batched, &verify).unwrap();
        let mut single = DecodeState::new(&model, 1, options).unwrap();
        one_by_one(&model, &mut single, &prompt);
        let expected = one_by_one(&model, &mut single, &verify);
        for (r, expected) in expected.iter().enumerate() {
            assert_eq!(&row_of(&step, r), expected, "{options:?}: row {r}");
        }
        for (r, logits) in step.logits.iter().enumerate() {
            assert_eq!(logits.len(), cfg.vocab_size);
            assert!(logits.iter().all(|v| v.is_finite()), "row {r}");
            assert!((step.argmax[r] as usize) < cfg.vocab_size);
        }
        let last = &step.topk[0][verify.len() - 1];
        assert_eq!(last.len(), cfg.index_topk);
        assert!(last.iter().all(|&t| (0..15).contains(&t)), "{last:?}");
    }
}

/// k is the config's, whatever select's kernels build for: an `index_topk` past their bound (the
/// first slice's candidates in LDS) runs the reference, each row listing its tokens, then -1.
#[test]
fn an_index_topk_past_the_kernels_bound_runs_the_reference() {
    let cfg = ModelConfig {
        index_topk: select::layout::MAX_K as usize + 1,
        ..odd_widths().0
    };
    let model =
        ReferenceModel::load(&cfg, &Synthetic::new(&cfg, 5, WeightFormat::Bf16).unwrap()).unwrap();
    let options = ReferenceOptions::transformers(&cfg, false);
    let mut state = DecodeState::new(&model, 1, options).unwrap();
    let step = model
        .step(&mut state, &rows_of_vocab(cfg.vocab_size, 0, 0..5))
        .unwrap();
    let last = &step.topk[0][4];
    assert_eq!(last.len(), cfg.index_topk);
    assert_eq!(&last[..5], &[0, 1, 2, 3, 4]);
    assert!(last[5..].iter().all(|&t| t == -1));
}

/// `mono step --weights DIR` on a folder as Hugging Face leaves one for the odd widths: the
/// config as transformers saves it, `model.safetensors`, and beside them another safetensors file
/// whose tensors share the model's names at the tiny preset's shapes (a loader that read it would
/// fail on them). transformers' numerics run; the engines' refuse the widths naming the switch.
#[test]
fn mono_step_runs_an_odd_width_folder_and_names_what_refuses_it() {
    let (cfg, _) = odd_widths();
    let dir = std::env::temp_dir().join(format!("mono-odd-widths-{}", std::process::id()));
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    write_checkpoint(
        &cfg,
        &Synthetic::new(&cfg, 5, WeightFormat::Bf16).unwrap(),
        &dir,
    )
    .unwrap();
    write_checkpoint(
        &tiny(),
        &Synthetic::new(&tiny(), 5, WeightFormat::Bf16).unwrap(),
        &other,
    )
    .unwrap();
    std::fs::rename(other.join(SINGLE_FILE), dir.join("outputs.safetensors")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        include_str!("../../model/tests/fixtures/odd_widths.json"),
    )
    .unwrap();
    let step = |numerics| {
        cli::run(&StepArgs {
            preset: "tiny".to_owned(),
            config: None,
            weights: Some(dir.clone()),
            seed: 5,
            fp8_weights: false,
            rows: 2,
            context: 12,
            numerics,
        })
    };
    let ran = step(Numerics::TransformersFp32);
    let refused = step(Numerics::Engines);
    std::fs::remove_dir_all(&dir).ok();
    ran.unwrap();
    let refused = refused.unwrap_err();
    for part in [
        "`kv_lora_rank` is 48",
        "FP8 MLA cache",
        "`--numerics engines`",
    ] {
        assert!(refused.contains(part), "{part}: {refused}");
    }
}

#[test]
fn fp8_cache_and_hadamard_refuse_odd_widths_naming_the_switch() {
    let (cfg, odd) = odd_widths();
    let refusal = |options: ReferenceOptions| {
        DecodeState::new(&odd, 1, options)
            .expect_err("refused")
            .to_string()
    };
    let fp8_cache = refusal(ReferenceOptions::engines(&cfg));
    for part in ["FP8 MLA cache", "`mla_cache`", "`kv_lora_rank` is 48"] {
        assert!(fp8_cache.contains(part), "{part}: {fp8_cache}");
    }
    let hadamard = refusal(ReferenceOptions {
        mla_cache: CacheStore::Format(CacheFormat::Bf16),
        ..ReferenceOptions::engines(&cfg)
    });
    for part in ["Hadamard", "`indexer.hadamard`", "`index_head_dim` is 48"] {
        assert!(hadamard.contains(part), "{part}: {hadamard}");
    }
    // The same options take the widths they are written for.
    DecodeState::new(&model(), 1, ReferenceOptions::engines(&tiny())).unwrap();
}

#[test]
fn tied_embeddings_project_through_the_embedding() {
    let cfg = ModelConfig {
        tie_word_embeddings: true,
        ..tiny()
    };
    let tied =
        ReferenceModel::load(&cfg, &Synthetic::new(&cfg, 21, WeightFormat::Bf16).unwrap()).unwrap();
    assert_eq!(tied.lm_head, tied.embedding);
    let untied = model();
    assert_ne!(untied.lm_head, untied.embedding);
}
