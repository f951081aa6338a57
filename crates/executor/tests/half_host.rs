//! The attention half as a part of a fused launch (`HalfPlan::plan` on a `LaunchGraph`), its
//! kernel (the linear and MLA stages' own source, the generated task loop) run on CPU threads by
//! the fused launch's host emulation (`executor::fused::host`), at the tiny preset's widths with
//! 8 heads (TP2): bf16 records, and GLM-5's latent and rope (512 + 64) with FP8 records. Against
//! the reference chain (`mla::reference` with the engines' numerics, the residual rounded as the
//! linear's epilogue): one row, four verify rows (in a group, and a group each), three requests of 1 + 3 + 12 rows (a context of
//! one token, fewer than k selected), a score outlier of 1e4, every slot the same position.
//! Negative controls that must fail: the half-split rope, each row's slots shifted by one, the
//! softmax scale 1/sqrt(576).
//! Needs g++ with C++20, so ignored:
//! `cargo test --release -p executor --test half_host -- --ignored --nocapture`

mod support;

use executor::fused::attention::{half_source, half_stages, HalfBuild, HalfDims, HalfPlan};
use executor::fused::host::{HostImage, HostKernel};
use executor::fused::{CtaShape, Handoff, LaunchGraph};
use linear::gpu::LinArgs;
use mailbox::gpu::Variant;
use mailbox::layout::{BoxRange, Tags};
use mla::layout::SplitChoice;
use model::numerics::RopeStyle;
use model::{CacheFormat, ModelConfig};
use support::half::{place, u16s, Case, Pick, Request, Twist, Weights};

/// Largest relative L2 error of a row's attention part (output - x) against the reference. The
/// kernel sums in fp32 where the reference sums in f64, so a bf16 rounding of an intermediate
/// (q, the latents, q_abs, the softmax weights, the heads' outputs) lands on the other side now
/// and then, and the FP8 cache rounds the new tokens' latents from those values; the attention's
/// own tolerance on its latent output (`crates/mla/tests/gpu.rs`) is the same 3e-2.
const TOLERANCE: f64 = 3e-2;
const CTAS: u32 = 6;
const THREADS: u32 = 128;
const TOPK: usize = 64;

fn dims(latent_glm: bool) -> HalfDims {
    let mut cfg = ModelConfig::preset("tiny").unwrap();
    let format = if latent_glm {
        cfg.kv_lora_rank = 512;
        cfg.qk_rope_head_dim = 64;
        CacheFormat::Fp8
    } else {
        CacheFormat::Bf16
    };
    HalfDims::new(&cfg, 2, format).unwrap()
}

/// Groups of up to 4 rows; [`APART`]: a group a row, whose splits read the earlier rows' new
/// records only after their cache writes.
const BUILD: HalfBuild = HalfBuild {
    topk: TOPK as u32,
    union: 128,
    choice: SplitChoice {
        group_rows: 4,
        block: 16,
        combine_queries: 1,
    },
};
const APART: HalfBuild = HalfBuild {
    choice: SplitChoice {
        group_rows: 1,
        block: 16,
        combine_queries: 1,
    },
    ..BUILD
};

/// A kernel for `d`'s attention shape and rope `style`, with shared memory for 16 rows.
fn kernel(d: &HalfDims, style: RopeStyle) -> (HostKernel, CtaShape) {
    let attend = d.attend_shape(BUILD.union).unwrap();
    let widest = [d.hidden, d.q_lora, d.uk_k(), d.latent, d.heads * d.v]
        .into_iter()
        .max()
        .unwrap();
    let lin = linear::layout::lds_bytes(THREADS, widest, 16).unwrap() as usize;
    let shape = CtaShape {
        threads: THREADS,
        shared_bytes: lin.max(attend.lds_bytes()) as u32,
    };
    let src = half_source(shape, &attend, style, Variant::default()).unwrap();
    let stages = half_stages(shape, &attend, style).unwrap();
    (HostKernel::build(&src, &stages, shape).unwrap(), shape)
}

fn req(context: usize, rows: usize) -> Request {
    Request { context, rows }
}

/// One emulated launch of the half alone: the output rows.
fn launch(
    k: &HostKernel,
    build: HalfBuild,
    case: &Case,
    w: &Weights,
    slots: &[i32],
    scale: Option<f32>,
) -> Result<Vec<u16>, String> {
    let rows: u32 = case.requests.iter().map(|r| r.rows).sum();
    let mut g = LaunchGraph::new(CTAS).unwrap();
    let x = g
        .arena("x", u64::from(rows) * case.dims.hidden as u64 * 2)
        .unwrap();
    let input = Handoff {
        data: x,
        ready: BoxRange::default(),
    };
    let plan = HalfPlan::plan(&mut g, case.dims, &case.requests, build, input, "attn").unwrap();
    let launch = g.finish().unwrap();
    let mut image = HostImage::new();
    let placed = place(&plan, launch.arena.bytes, case, slots, w, &mut |b| {
        image.put(b)
    });
    let tags = Tags::new(1).unwrap();
    let table = image
        .launch_table(&launch.placement, launch.layout.boxes(), tags, 0, 0)
        .unwrap();
    let mats = plan.matrices(placed.arena, &placed.weights).unwrap();
    let lin = LinArgs {
        mats: image.put(bytemuck::cast_slice(&mats)),
        experts: 0,
        n_mats: mats.len() as u32,
        n_experts: 0,
    };
    let args = plan.mla_args(
        placed.arena,
        placed.cache,
        &placed.weights,
        scale.unwrap_or(plan.model_scale()),
    );
    k.run(
        &mut image,
        &table,
        &[bytemuck::bytes_of(&lin), bytemuck::bytes_of(&args)],
        60,
    )
    .map_err(|e| e.to_string())?;
    let out = image
        .read(placed.arena + plan.out.data.offset, plan.out.data.bytes)
        .map_err(|e| e.to_string())?;
    Ok(u16s(out))
}

#[test]
#[ignore = "slow; needs g++ with C++20"]
fn attention_half_on_cpu_threads_matches_the_reference() {
    let cases: [(&str, HalfBuild, Vec<Request>, Pick, Twist); 6] = [
        ("1 row", BUILD, vec![req(150, 1)], Pick::Random, Twist::None),
        (
            "4 verify rows",
            BUILD,
            vec![req(120, 4)],
            Pick::Random,
            Twist::None,
        ),
        (
            "4 verify rows a group each",
            APART,
            vec![req(120, 4)],
            Pick::Random,
            Twist::None,
        ),
        (
            "3 requests, 1 + 3 + 12 rows, one of a single token",
            BUILD,
            vec![req(0, 1), req(40, 3), req(200, 12)],
            Pick::Random,
            Twist::None,
        ),
        (
            "score outlier 1e4",
            BUILD,
            vec![req(100, 2)],
            Pick::Random,
            Twist::Outlier(1e4),
        ),
        (
            "every slot the same position",
            BUILD,
            vec![req(80, 2)],
            Pick::SamePosition,
            Twist::None,
        ),
    ];
    let mut failures = Vec::new();
    for (name, latent_glm) in [("bf16 cache, tiny", false), ("FP8 cache, latent 512", true)] {
        let d = dims(latent_glm);
        let (k, _) = kernel(&d, d.rope_style);
        let w = Weights::new(&d, 1);
        for (i, (case_name, build, requests, pick, twist)) in cases.iter().enumerate() {
            let case = Case::new(&d, &w, TOPK, requests, *pick, *twist, 10 + i as u64);
            let start = std::time::Instant::now();
            let line = match launch(&k, *build, &case, &w, &case.slots, None) {
                Ok(out) => {
                    let err = case.error(&out);
                    if err >= TOLERANCE {
                        failures.push(format!("{name} {case_name}"));
                    }
                    format!("error {err:.2e} (tolerance {TOLERANCE:e})")
                }
                Err(e) => {
                    failures.push(format!("{name} {case_name}"));
                    e
                }
            };
            eprintln!(
                "{name}, {case_name}: {line} ({:.1} s)",
                start.elapsed().as_secs_f64()
            );
        }
    }
    // Negative controls on the FP8 build, four verify rows.
    let d = dims(true);
    let w = Weights::new(&d, 1);
    let case = Case::new(&d, &w, TOPK, &[req(120, 4)], Pick::Random, Twist::None, 99);
    let (k, _) = kernel(&d, d.rope_style);
    let shifted: Vec<i32> = case
        .slots
        .iter()
        .map(|&s| if s > 0 { s - 1 } else { s })
        .collect();
    let shifted_err = case.error(&launch(&k, BUILD, &case, &w, &shifted, None).unwrap());
    let scale_err =
        case.error(&launch(&k, BUILD, &case, &w, &case.slots, Some(1.0 / 576f32.sqrt())).unwrap());
    let (neox, _) = kernel(&d, RopeStyle::HalfSplit);
    let neox_err = case.error(&launch(&neox, BUILD, &case, &w, &case.slots, None).unwrap());
    eprintln!(
        "controls (must exceed {TOLERANCE:e}): slots shifted by one {shifted_err:.2e}, scale 1/sqrt(576) {scale_err:.2e}, half-split rope {neox_err:.2e}"
    );
    assert!(failures.is_empty(), "{failures:?}");
    assert!(shifted_err > TOLERANCE, "the shifted slots passed");
    assert!(scale_err > TOLERANCE, "the scale 1/sqrt(576) passed");
    assert!(neox_err > TOLERANCE, "the half-split rope passed");
}
