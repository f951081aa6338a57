//! `mono step` without a GPU path: the CPU reference step on a small model, with per-layer
//! progress and the argmax tokens.

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, ValueEnum};
use model::weights::{checkpoint_tensors, Checkpoint, Synthetic, WeightSource};
use model::{IndexerKind, MlpKind, ModelConfig, WeightFormat};

use super::{DecodeState, ReferenceModel, ReferenceOptions, Row};

/// Refuse configs whose weights would not fit in memory as f32 (the reference holds them so).
pub const MAX_REFERENCE_PARAMETERS: u64 = 1 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Numerics {
    /// bf16 activations, FP8 MLA cache, FP8 index keys with Hadamard, latent eps = rms_norm_eps.
    Engines,
    /// transformers' choices in bf16.
    TransformersBf16,
    /// transformers' choices in fp32 (what the goldens check).
    TransformersFp32,
}

#[derive(Debug, Clone, Args)]
pub struct StepArgs {
    /// Model preset (the CPU reference holds every weight as f32: tiny, or a small config.json).
    #[arg(long, default_value = "tiny", conflicts_with = "config")]
    pub preset: String,
    /// A Hugging Face config.json instead of a preset.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A checkpoint folder as Hugging Face writes one: model.safetensors.index.json and the
    /// shards it names, else model.safetensors (other files are not read), with the published
    /// tensor names and its config.json (used unless --config is given). Synthetic weights
    /// without it.
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// Seed of the synthetic weights and of the prompt tokens.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Synthetic weights as FP8 (128 x 128 block scales) instead of bf16; on a GPU a bf16
    /// checkpoint's (--weights) are quantised to FP8 as they are uploaded. An FP8 checkpoint's
    /// matrices stay FP8 on a GPU, codes and scales as stored, with or without this flag.
    #[arg(long)]
    pub fp8_weights: bool,
    /// Rows of the step: consecutive positions of one request (1 = plain decode, 4 = MTP verify
    /// of 3 drafts).
    #[arg(long, default_value_t = 1)]
    pub rows: usize,
    /// Tokens already cached when the step runs (fed before it as one prefill step).
    #[arg(long, default_value_t = 63)]
    pub context: usize,
    #[arg(long, value_enum, default_value = "engines")]
    pub numerics: Numerics,
}

/// The parameters of the whole model, which the CPU reference holds as f32.
pub fn reference_parameters(cfg: &ModelConfig) -> Result<u64, String> {
    Ok(checkpoint_tensors(cfg)
        .map_err(|e| e.to_string())?
        .iter()
        .map(|t| t.shape.iter().product::<usize>() as u64)
        .sum())
}

/// An arbitrary but fixed token for position `i`.
fn token(seed: u64, i: usize, vocab: usize) -> u32 {
    let mixed = (i as u64 + 1)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(seed.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    ((mixed >> 33) % vocab as u64) as u32
}

fn describe(plan: &model::LayerPlan) -> String {
    let mlp = match plan.mlp {
        MlpKind::Dense => "dense",
        MlpKind::Moe => "MoE",
    };
    match plan.indexer {
        IndexerKind::Full => format!("{mlp}, full indexer"),
        IndexerKind::Shared { source_layer } => {
            format!("{mlp}, top-k shared from layer {source_layer}")
        }
    }
}

impl StepArgs {
    /// The weight format `--fp8-weights` asks for.
    pub fn weight_format(&self) -> WeightFormat {
        if self.fp8_weights {
            WeightFormat::Fp8
        } else {
            WeightFormat::Bf16
        }
    }
}

/// The model of a step, the CPU's or the GPU's: `--config`, else the config.json beside
/// `--weights`, else the preset; and where it came from.
pub fn step_config(args: &StepArgs) -> Result<(ModelConfig, String), String> {
    let beside_weights = args
        .weights
        .as_ref()
        .map(|dir| dir.join("config.json"))
        .filter(|path| path.is_file());
    Ok(match args.config.clone().or(beside_weights) {
        Some(path) => (
            ModelConfig::from_file(&path).map_err(|e| e.to_string())?,
            path.display().to_string(),
        ),
        None => (
            ModelConfig::preset(&args.preset).map_err(|e| e.to_string())?,
            format!("preset {}", args.preset),
        ),
    })
}

/// Refuses rows and a context the model cannot take, whichever step runs them.
pub fn check_rows(args: &StepArgs, cfg: &ModelConfig) -> Result<(), String> {
    if args.rows == 0 {
        return Err("--rows must be at least 1".to_owned());
    }
    if args.context + args.rows > cfg.max_position_embeddings {
        return Err(format!(
            "--context {} + --rows {} is past max_position_embeddings {}",
            args.context, args.rows, cfg.max_position_embeddings
        ));
    }
    Ok(())
}

/// Runs the step and prints what it did; errors say what was wrong.
pub fn run(args: &StepArgs) -> Result<(), String> {
    let (cfg, config_from) = step_config(args)?;
    check_rows(args, &cfg)?;
    let parameters = reference_parameters(&cfg)?;
    if parameters > MAX_REFERENCE_PARAMETERS {
        return Err(format!(
            "this model has {parameters} parameters; the CPU reference holds them all as f32 and \
             takes at most {MAX_REFERENCE_PARAMETERS}. Use --preset tiny here; on a GPU, `mono step \
             --tp 8` (the same flags) runs one rank's step on weights made on the device."
        ));
    }
    let options = match args.numerics {
        Numerics::Engines => ReferenceOptions::engines(&cfg),
        Numerics::TransformersBf16 => ReferenceOptions::transformers(&cfg, true),
        Numerics::TransformersFp32 => ReferenceOptions::transformers(&cfg, false),
    };
    let flag = format!(
        "`--numerics {}`",
        args.numerics
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned())
    );
    options.check(&cfg, &flag).map_err(|e| {
        format!("{e} (--numerics transformers-fp32 and transformers-bf16 ask for neither)")
    })?;

    let started = Instant::now();
    let (source, from): (Box<dyn WeightSource>, String) = match &args.weights {
        Some(dir) => (
            Box::new(Checkpoint::open(dir).map_err(|e| e.to_string())?),
            format!("checkpoint {}", dir.display()),
        ),
        None => {
            let format = args.weight_format();
            let weights = Synthetic::new(&cfg, args.seed, format).map_err(|e| e.to_string())?;
            (
                Box::new(weights),
                format!("synthetic weights (seed {}, {format:?})", args.seed),
            )
        }
    };
    let model = ReferenceModel::load(&cfg, source.as_ref()).map_err(|e| e.to_string())?;
    println!(
        "mono step: the CPU reference step, {config_from}: {} layers, {parameters} \
         parameters from {from}, loaded in {:.0} ms",
        cfg.num_hidden_layers,
        started.elapsed().as_secs_f64() * 1e3
    );
    println!("numerics: {:?}: {options:?}", args.numerics);

    let mut state = DecodeState::new(&model, 1, options).map_err(|e| e.to_string())?;
    let vocab = cfg.vocab_size;
    if args.context > 0 {
        let prompt: Vec<Row> = (0..args.context)
            .map(|p| Row {
                request: 0,
                token: token(args.seed, p, vocab),
                position: p,
            })
            .collect();
        let started = Instant::now();
        model.step(&mut state, &prompt).map_err(|e| e.to_string())?;
        println!(
            "prefill: {} tokens as one step of {} rows, {:.1} ms",
            args.context,
            args.context,
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    let rows: Vec<Row> = (args.context..args.context + args.rows)
        .map(|p| Row {
            request: 0,
            token: token(args.seed, p, vocab),
            position: p,
        })
        .collect();
    println!(
        "step: {} row(s) at positions {}..={} (each sees keys up to its own position)",
        rows.len(),
        args.context,
        args.context + args.rows - 1
    );
    let started = Instant::now();
    let out = model
        .step_with_progress(&mut state, &rows, &mut |p| {
            println!(
                "  layer {:>2} ({}): {:.2} ms",
                p.layer.index,
                describe(p.layer),
                p.elapsed.as_secs_f64() * 1e3
            );
        })
        .map_err(|e| e.to_string())?;
    println!(
        "step done in {:.2} ms; argmax tokens (CPU reference): {:?}",
        started.elapsed().as_secs_f64() * 1e3,
        out.argmax
    );
    Ok(())
}
