//! The head's fused launches on the GPU at a GLM-5.2 TP-8 rank's shapes (`model::RankShapes`):
//! layer 0's embedding then the dense MLP (FP8, intermediate 1536 on the rank) at 1, 4 and 16
//! rows; the tail (final norm, lm_head's shard of 19360 rows, bf16 as checkpoints keep it and
//! FP8, the argmax pairs and the pick) at 1 and 4 rows, on shard 3 so that token ids carry the
//! shard's offset, with tied lm_head rows across tile boundaries and a zero row; every stage checked
//! on the device's own input (`executor::fused::head_check`), the measured error printed.
//! Negative controls that must fail: two lm_head scale blocks swapped, ties to the higher id.
//! `cargo test --release -p executor --test gpu_head -- --ignored --nocapture --test-threads 1`

use device::{Buffer, Device};
use executor::fused::head::{
    dense_mlp_part, embed_part, tail_part, DenseShape, DenseWeights, HeadDescriptors, HeadLists,
    TailShape, TailWeights,
};
use executor::fused::head_check::{DenseCase, EmbedCase, TailCase};
use executor::fused::head_gpu::{HeadKernel, HeadLaunch};
use executor::fused::{ArenaSlice, Handoff, LaunchGraph};
use linear::gpu::LinMatrix;
use mailbox::gpu::Variant;
use mailbox::layout::BoxRange;
use model::weights::packed::PackedWeight;
use model::{ModelConfig, RankShapes, WeightFormat};

const TIED: [u32; 7] = [15, 16, 31, 32, 79, 80, 127];
const FAULT_TIES_HIGH: u32 = 601;

fn rank() -> RankShapes {
    RankShapes::new(&ModelConfig::preset("glm-5.2").unwrap(), 8).unwrap()
}

fn upload_weight(dev: &Device, w: &PackedWeight) -> (Buffer<u8>, Buffer<f32>) {
    let scales = if w.scales.is_empty() {
        vec![0.0]
    } else {
        w.scales.clone()
    };
    (dev.upload(&w.bytes).unwrap(), dev.upload(&scales).unwrap())
}

fn read<T: bytemuck::Pod>(l: &HeadLaunch, s: ArenaSlice, n: usize) -> Vec<T> {
    l.read(s.offset, n).unwrap()
}

fn run(dev: &Device, kernel: &HeadKernel, launch: &HeadLaunch) {
    launch.enqueue(kernel, dev.stream()).unwrap();
    dev.stream().sync().unwrap();
    launch.check_stall(kernel).unwrap();
}

fn layer0(dev: &Device, kernel: &HeadKernel, rows: u32) -> Result<String, String> {
    let r = rank();
    let hidden = r.config.hidden_size as u32;
    let mut g = LaunchGraph::new(kernel.ctas()).unwrap();
    let mut lists = HeadLists::default();
    let embed_plan = embed_part(&mut g, &mut lists, rows, hidden).unwrap();
    let shape = DenseShape {
        rows,
        hidden,
        intermediate: r.dense_intermediate as u32,
        eps: r.config.rms_norm_eps as f32,
        format: WeightFormat::Fp8,
        residual: true,
    };
    let plan = dense_mlp_part(&mut g, &mut lists, shape, embed_plan.out).unwrap();
    let lds = plan.lds_bytes(kernel.shape().threads).unwrap();
    let planned = g.finish().unwrap();
    // The table's rows are what matters, not its length: a 4096-token table.
    let embed = EmbedCase::new(4096, hidden as usize, rows as usize, 31 + u64::from(rows));
    let case = DenseCase::new(shape, Some(embed.reference()?), 41 + u64::from(rows))?;
    let table = dev.upload(&embed.table).unwrap();
    let tokens = dev.upload(&embed.tokens).unwrap();
    let post_norm = dev.upload(&case.post_norm).unwrap();
    let (gu, gu_s) = upload_weight(dev, &case.gate_up_packed);
    let (dn, dn_s) = upload_weight(dev, &case.down_packed);
    let w = DenseWeights {
        post_norm: post_norm.device_ptr(),
        gate_up: gu.device_ptr(),
        gate_up_scales: gu_s.device_ptr(),
        down: dn.device_ptr(),
        down_scales: dn_s.device_ptr(),
    };
    let launch = HeadLaunch::new(dev, kernel, &planned, lds, |arena| {
        let mut mats = vec![LinMatrix::default(); planned.matrices as usize];
        let mut d = HeadDescriptors::new(&lists);
        embed_plan.bind(
            arena,
            table.device_ptr(),
            embed.vocab as u32,
            tokens.device_ptr(),
            &mut d,
        );
        plan.bind(arena, &w, &mut mats, &mut d);
        (mats, d)
    })
    .unwrap();
    run(dev, kernel, &launch);
    let (n, h) = (rows as usize, hidden as usize);
    embed.check(&read(&launch, embed_plan.out.data, n * h))?;
    let m = case.check(
        &read(&launch, plan.h_hat, n * h),
        &read(&launch, plan.act, n * shape.intermediate as usize),
        &read(&launch, plan.out.data, n * h),
    )?;
    Ok(format!(
        "layer 0 x {rows} rows: embedding exact; post norm {} of {} off the reference (at most {} steps); gate/up {} off (at most {} steps); down {} off (at most {} steps); end to end relative error {:.2e} (allowed {:.2e})",
        m.norm.off_reference, m.norm.outputs, m.norm.max_steps, m.gate_up.off_reference, m.gate_up.max_steps,
        m.down.off_reference, m.down.max_steps, m.relative_error, executor::fused::head_check::DENSE_TOLERANCE
    ))
}

/// The tail on `kernel`, lm_head's scale blocks 0 and another swapped when asked.
fn tail(
    dev: &Device,
    kernel: &HeadKernel,
    case: &TailCase,
    swap_scales: bool,
) -> Result<String, String> {
    let s = case.shape;
    let mut g = LaunchGraph::new(kernel.ctas()).unwrap();
    let mut lists = HeadLists::default();
    let x = g.arena("tail_x", u64::from(s.rows * s.hidden) * 2).unwrap();
    let input = Handoff {
        data: x,
        ready: BoxRange::default(),
    };
    let plan = tail_part(&mut g, &mut lists, s, input).unwrap();
    let lds = plan.lds_bytes(kernel.shape().threads).unwrap();
    let planned = g.finish().unwrap();
    let mut packed = case.packed.clone();
    if swap_scales {
        let other = (1..packed.scales.len())
            .find(|&i| packed.scales[i] != packed.scales[0])
            .unwrap();
        packed.scales.swap(0, other);
    }
    let final_norm = dev.upload(&case.final_norm).unwrap();
    let (lm, lm_s) = upload_weight(dev, &packed);
    let w = TailWeights {
        final_norm: final_norm.device_ptr(),
        lm_head: lm.device_ptr(),
        lm_head_scales: lm_s.device_ptr(),
    };
    let launch = HeadLaunch::new(dev, kernel, &planned, lds, |arena| {
        let mut mats = vec![LinMatrix::default(); planned.matrices as usize];
        let mut d = HeadDescriptors::new(&lists);
        plan.bind(arena, &w, &mut mats, &mut d);
        (mats, d)
    })
    .unwrap();
    launch.write(x.offset, &case.x).unwrap();
    run(dev, kernel, &launch);
    let (n, h, v) = (s.rows as usize, s.hidden as usize, s.vocab_rows as usize);
    let tokens: Vec<u32> = read(&launch, plan.tokens.data, n);
    let m = case.check(
        &read(&launch, plan.z, n * h),
        &read(&launch, plan.logits, n * v),
        &read(&launch, plan.pairs, n * s.shards as usize),
        &tokens,
    )?;
    Ok(format!(
        "tail {:?} x {} rows: final norm {} of {} off the reference (at most {} steps); logits {} of {} off (at most {} steps); tokens {tokens:?}, {} near ties",
        s.format, s.rows, m.norm.off_reference, m.norm.outputs, m.norm.max_steps,
        m.logits.off_reference, m.logits.outputs, m.logits.max_steps, m.tokens.near_ties
    ))
}

fn tail_case(format: WeightFormat, rows: u32, seed: u64) -> TailCase {
    let r = rank();
    let shape = TailShape {
        rows,
        hidden: r.config.hidden_size as u32,
        vocab_rows: r.vocab_rows as u32,
        shard: 3,
        shards: 8,
        eps: r.config.rms_norm_eps as f32,
        format,
    };
    TailCase::new(shape, &TIED, seed).unwrap()
}

#[test]
#[ignore = "needs a GPU"]
fn head_parts_match_the_references_at_rank_shapes() {
    let dev = Device::open(0).unwrap();
    let kernel = HeadKernel::build(&dev, Variant::default(), None).unwrap();
    let mut failures = Vec::new();
    for rows in [1, 4, 16] {
        match layer0(&dev, &kernel, rows) {
            Ok(line) => eprintln!("{line}"),
            Err(e) => failures.push(e),
        }
    }
    for (format, rows) in [(WeightFormat::Bf16, 4), (WeightFormat::Fp8, 1)] {
        let case = tail_case(format, rows, 50 + u64::from(rows));
        match tail(&dev, &kernel, &case, false) {
            Ok(line) => eprintln!("{line}"),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "needs a GPU"]
fn head_negative_controls_fail() {
    let dev = Device::open(0).unwrap();
    let kernel = HeadKernel::build(&dev, Variant::default(), None).unwrap();
    let case = tail_case(WeightFormat::Fp8, 1, 61);
    let err = tail(&dev, &kernel, &case, true).expect_err("swapped scales passed");
    eprintln!("swapped lm_head scales: {err}");
    let faulty = HeadKernel::build(&dev, Variant::default(), Some(FAULT_TIES_HIGH)).unwrap();
    let err = tail(&dev, &faulty, &case, false).expect_err("ties to the higher id passed");
    eprintln!("ties to the higher id: {err}");
}
