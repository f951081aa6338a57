//! The head's parts planned on a `LaunchGraph` and their fused kernel (the generated source:
//! linear and head stages) run on CPU threads through the host prelude, at tiny
//! shapes: layer 0's embedding then the dense MLP (FP8, the down adding the embedded rows), and the
//! tail (bf16 and FP8 lm_head of 200 rows, not a multiple of the 16-row tile, split over the CTAs;
//! equal lm_head rows across tile and task boundaries winning row 0, a zero row whose logits all
//! tie); every stage checked on the device's own input (`executor::fused::head_check`). Negative
//! controls that must fail: ties to the higher id and the embedding's next row (faults built in),
//! two scale blocks of lm_head swapped. Runs through `executor::fused::host`. Needs g++ with C++20,
//! so ignored:
//! `cargo test --release -p executor --test fused_head -- --ignored --nocapture`

use executor::fused::head::{
    dense_mlp_part, embed_part, head_source, head_stages, tail_part, DensePlan, DenseShape,
    DenseWeights, EmbedPlan, HeadDescriptors, HeadLists, TailPlan, TailShape, TailWeights,
};
use executor::fused::head_check::{DenseCase, EmbedCase, TailCase};
use executor::fused::host::{HostImage, HostKernel};
use executor::fused::{ArenaSlice, CtaShape, Handoff, LaunchGraph, PlannedLaunch, ENTRY};
use head::gpu::HeadArgs;
use linear::gpu::{LinArgs, LinMatrix};
use mailbox::gpu::Variant;
use mailbox::layout::{BoxRange, Tags};
use model::weights::packed::PackedWeight;
use model::WeightFormat;

/// Four groups of 32: a small CTA, so that the emulated threads stay few.
const SHAPE: CtaShape = CtaShape {
    threads: 128,
    shared_bytes: 16 * 1024,
};
const CTAS: u32 = 3;
const ROWS: u32 = 4;
const HIDDEN: u32 = 256;
const VOCAB_ROWS: u32 = 200;
const TIED: [u32; 7] = [15, 16, 31, 32, 79, 80, 127];
const FAULT_TIES_HIGH: u32 = 601;
const FAULT_NEXT_ROW: u32 = 602;
const STALL_SECONDS: u32 = 60;

/// The fused head kernel on CPU threads, with `MONO_FAULT = fault` (0: none).
fn kernel(fault: u32) -> HostKernel {
    let source = head_source(SHAPE, Variant::default())
        .unwrap()
        .define("MONO_FAULT", fault);
    HostKernel::build(&source, &head_stages(), SHAPE).unwrap()
}

fn as_bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// A packed weight put into the image: its bytes' and its scales' addresses.
fn put_weight(image: &mut HostImage, w: &PackedWeight) -> (u64, u64) {
    let scales = if w.scales.is_empty() {
        image.zeroed(4)
    } else {
        image.put(&as_bytes(&w.scales))
    };
    (image.put(&w.bytes), scales)
}

/// A list put into the image (one zeroed element when empty, so that its address is valid).
fn put_list<T: bytemuck::Pod + Default>(image: &mut HostImage, list: &[T]) -> u64 {
    if list.is_empty() {
        return image.put(&as_bytes(&[T::default()]));
    }
    image.put(&as_bytes(list))
}

fn read<T: bytemuck::Pod>(image: &HostImage, at: u64, n: usize) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    image
        .read(at, (n * size) as u64)
        .unwrap()
        .chunks_exact(size)
        .map(bytemuck::pod_read_unaligned)
        .collect()
}

/// A planned launch in its image, bound: the launch arena (poisoned) at `arena`.
struct Bound {
    planned: PlannedLaunch,
    image: HostImage,
    arena: u64,
    mats: Vec<LinMatrix>,
    d: HeadDescriptors,
}

impl Bound {
    fn new(
        planned: PlannedLaunch,
        lists: &HeadLists,
        mut image: HostImage,
        binder: impl FnOnce(u64, &mut [LinMatrix], &mut HeadDescriptors),
    ) -> Bound {
        let arena = image.put(&vec![0xff; planned.arena.bytes as usize]);
        let mut mats = vec![LinMatrix::default(); planned.matrices as usize];
        let mut d = HeadDescriptors::new(lists);
        binder(arena, &mut mats, &mut d);
        Bound {
            planned,
            image,
            arena,
            mats,
            d,
        }
    }

    fn at(&self, s: ArenaSlice) -> u64 {
        self.arena + s.offset
    }

    /// One launch on `kernel`: the image after it.
    fn run(&self, kernel: &HostKernel) -> Result<HostImage, String> {
        let mut image = self.image.clone();
        let table = image
            .launch_table(
                &self.planned.placement,
                self.planned.layout.boxes(),
                Tags::new(1).unwrap(),
                0,
                0,
            )
            .map_err(|e| e.to_string())?;
        let lin = LinArgs {
            mats: put_list(&mut image, &self.mats),
            n_mats: self.mats.len() as u32,
            experts: 0,
            n_experts: 0,
        };
        let head = HeadArgs {
            embeds: put_list(&mut image, &self.d.embeds),
            norms: put_list(&mut image, &self.d.norms),
            argmaxes: put_list(&mut image, &self.d.argmaxes),
            picks: put_list(&mut image, &self.d.picks),
            n_embeds: self.d.embeds.len() as u32,
            n_norms: self.d.norms.len() as u32,
            n_argmaxes: self.d.argmaxes.len() as u32,
            n_picks: self.d.picks.len() as u32,
        };
        let args = [bytemuck::bytes_of(&lin), bytemuck::bytes_of(&head)];
        kernel
            .run(&mut image, &table, &args, STALL_SECONDS)
            .map_err(|e| e.to_string())?;
        Ok(image)
    }
}

/// Layer 0: the embedding, then the dense MLP on the embedded rows.
struct Layer0 {
    embed: EmbedCase,
    dense: DenseCase,
    embed_plan: EmbedPlan,
    dense_plan: DensePlan,
    bound: Bound,
}

fn layer0() -> Layer0 {
    let mut g = LaunchGraph::new(CTAS).unwrap();
    let mut lists = HeadLists::default();
    let embed_plan = embed_part(&mut g, &mut lists, ROWS, HIDDEN).unwrap();
    let shape = DenseShape {
        rows: ROWS,
        hidden: HIDDEN,
        intermediate: 384,
        eps: 1e-5,
        format: WeightFormat::Fp8,
        residual: true,
    };
    let dense_plan = dense_mlp_part(&mut g, &mut lists, shape, embed_plan.out).unwrap();
    assert!(dense_plan.lds_bytes(SHAPE.threads).unwrap() <= SHAPE.shared_bytes);
    let embed = EmbedCase::new(50, HIDDEN as usize, ROWS as usize, 11);
    let dense = DenseCase::new(shape, Some(embed.reference().unwrap()), 12).unwrap();
    let mut image = HostImage::new();
    let table = image.put(&as_bytes(&embed.table));
    let tokens = image.put(&as_bytes(&embed.tokens));
    let post_norm = image.put(&as_bytes(&dense.post_norm));
    let (gate_up, gate_up_scales) = put_weight(&mut image, &dense.gate_up_packed);
    let (down, down_scales) = put_weight(&mut image, &dense.down_packed);
    let w = DenseWeights {
        post_norm,
        gate_up,
        gate_up_scales,
        down,
        down_scales,
    };
    let vocab = embed.vocab as u32;
    let planned = g.finish().unwrap();
    let bound = Bound::new(planned, &lists, image, |arena, mats, d| {
        embed_plan.bind(arena, table, vocab, tokens, d);
        dense_plan.bind(arena, &w, mats, d);
    });
    Layer0 {
        embed,
        dense,
        embed_plan,
        dense_plan,
        bound,
    }
}

fn check_layer0(l: &Layer0, out: &HostImage) -> Result<(), String> {
    let (rows, hidden) = (ROWS as usize, HIDDEN as usize);
    let at = |s| l.bound.at(s);
    let embedded: Vec<u16> = read(out, at(l.embed_plan.out.data), rows * hidden);
    l.embed.check(&embedded)?;
    let p = &l.dense_plan;
    let m = l.dense.check(
        &read::<u16>(out, at(p.h_hat), rows * hidden),
        &read::<u16>(out, at(p.act), rows * p.shape.intermediate as usize),
        &read::<u16>(out, at(p.out.data), rows * hidden),
    )?;
    eprintln!(
        "layer 0: embedding exact; post norm {} off the reference (at most {} steps); gate/up {} off (at most {} steps); down {} off (at most {} steps); end to end relative error {:.2e}",
        m.norm.off_reference, m.norm.max_steps, m.gate_up.off_reference, m.gate_up.max_steps,
        m.down.off_reference, m.down.max_steps, m.relative_error
    );
    Ok(())
}

/// The tail of a `format` lm_head, its input rows written by the host.
struct Tail {
    case: TailCase,
    plan: TailPlan,
    bound: Bound,
}

/// The tail of rank `shard` of `shards` (its pick reads its own pairs only: the other shards'
/// slots keep the arena's poison, which beats every pair).
fn tail(format: WeightFormat, swap_scales: bool, (shard, shards): (u32, u32)) -> Tail {
    let mut g = LaunchGraph::new(CTAS).unwrap();
    let mut lists = HeadLists::default();
    let x = g.arena("tail_x", u64::from(ROWS * HIDDEN) * 2).unwrap();
    let shape = TailShape {
        rows: ROWS,
        hidden: HIDDEN,
        vocab_rows: VOCAB_ROWS,
        shard,
        shards,
        eps: 1e-5,
        format,
    };
    let input = Handoff {
        data: x,
        ready: BoxRange::default(),
    };
    let plan = tail_part(&mut g, &mut lists, shape, input).unwrap();
    assert!(plan.lds_bytes(SHAPE.threads).unwrap() <= SHAPE.shared_bytes);
    let case = TailCase::new(shape, &TIED, 21).unwrap();
    let mut image = HostImage::new();
    let final_norm = image.put(&as_bytes(&case.final_norm));
    let mut packed = case.packed.clone();
    if swap_scales {
        let other = (1..packed.scales.len())
            .find(|&i| packed.scales[i] != packed.scales[0])
            .unwrap();
        packed.scales.swap(0, other);
    }
    let (lm_head, lm_head_scales) = put_weight(&mut image, &packed);
    let w = TailWeights {
        final_norm,
        lm_head,
        lm_head_scales,
    };
    let planned = g.finish().unwrap();
    let mut bound = Bound::new(planned, &lists, image, |arena, mats, d| {
        plan.bind(arena, &w, mats, d)
    });
    let at = bound.at(x);
    bound.image.write(at, &as_bytes(&case.x)).unwrap();
    Tail { case, plan, bound }
}

fn check_tail(t: &Tail, out: &HostImage) -> Result<(), String> {
    let (rows, p) = (ROWS as usize, &t.plan);
    let at = |s| t.bound.at(s);
    let m = t.case.check(
        &read::<u16>(out, at(p.z), rows * HIDDEN as usize),
        &read::<u16>(out, at(p.logits), rows * VOCAB_ROWS as usize),
        &read::<u64>(out, at(p.pairs), rows * p.shape.shards as usize),
        &read::<u32>(out, at(p.tokens.data), rows),
    )?;
    eprintln!(
        "tail {:?}: final norm {} off the reference (at most {} steps); logits {} off (at most {} steps); tokens {:?}, {} near ties",
        p.shape.format,
        m.norm.off_reference,
        m.norm.max_steps,
        m.logits.off_reference,
        m.logits.max_steps,
        read::<u32>(out, at(p.tokens.data), rows),
        m.tokens.near_ties
    );
    Ok(())
}

#[test]
#[ignore = "slow; needs g++ with C++20"]
fn fused_head_parts_on_cpu_threads_match_the_references() {
    let exe = kernel(0);
    let l0 = layer0();
    check_layer0(&l0, &l0.bound.run(&exe).unwrap()).unwrap();
    for format in [WeightFormat::Bf16, WeightFormat::Fp8] {
        let t = tail(format, false, (0, 1));
        check_tail(&t, &t.bound.run(&exe).unwrap()).unwrap();
    }
    let t = tail(WeightFormat::Bf16, false, (3, 8));
    check_tail(&t, &t.bound.run(&exe).unwrap()).unwrap();

    let t = tail(WeightFormat::Fp8, true, (0, 1));
    let err = check_tail(&t, &t.bound.run(&exe).unwrap()).expect_err("swapped scales passed");
    eprintln!("swapped lm_head scales: {err}");
    let t = tail(WeightFormat::Bf16, false, (0, 1));
    let out = t.bound.run(&kernel(FAULT_TIES_HIGH)).unwrap();
    let err = check_tail(&t, &out).expect_err("ties to the higher id passed");
    eprintln!("ties to the higher id: {err}");
    let out = l0.bound.run(&kernel(FAULT_NEXT_ROW)).unwrap();
    let err = check_layer0(&l0, &out).expect_err("the next row passed");
    eprintln!("the embedding's next row: {err}");
}

/// Both targets build; on sm_90a without spills. gfx950's spills are the linear tile's own (its
/// standalone entry spills as many: `cargo test -p linear --test compile -- --nocapture`).
#[test]
fn the_fused_head_builds_for_both_targets() {
    for target in ["sm_90a", "gfx950"] {
        let shape = CtaShape::for_target(target).unwrap();
        let source = head_source(shape, Variant::default()).unwrap();
        let Some(compiler) = device::optional_compiler(target).unwrap() else {
            continue;
        };
        let compiled = compiler
            .compile(&source)
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        let entry = compiled
            .resources
            .iter()
            .find(|r| r.kernel == ENTRY)
            .unwrap_or_else(|| panic!("{target}: no {ENTRY} in {:?}", compiled.resources));
        println!("{target}: {entry:?}");
        if target == "sm_90a" {
            assert_eq!(entry.spills, 0, "{target}: spills");
        }
    }
}

/// Bad shapes are errors before anything is planned.
#[test]
fn bad_head_shapes_are_refused() {
    let mut g = LaunchGraph::new(CTAS).unwrap();
    let mut lists = HeadLists::default();
    assert!(embed_part(&mut g, &mut lists, 0, HIDDEN).is_err());
    assert!(embed_part(&mut g, &mut lists, 17, HIDDEN).is_err());
    assert!(embed_part(&mut g, &mut lists, 1, 100).is_err());
    let input = Handoff::default();
    let tail = TailShape {
        rows: 1,
        hidden: HIDDEN,
        vocab_rows: VOCAB_ROWS,
        shard: 1,
        shards: 1,
        eps: 1e-5,
        format: WeightFormat::Bf16,
    };
    assert!(tail_part(&mut g, &mut lists, tail, input).is_err());
    let odd_k = TailShape {
        shard: 0,
        hidden: 200,
        ..tail
    };
    assert!(tail_part(&mut g, &mut lists, odd_k, input).is_err());
    let dense = DenseShape {
        rows: 1,
        hidden: HIDDEN,
        intermediate: 200,
        eps: 1e-5,
        format: WeightFormat::Fp8,
        residual: true,
    };
    assert!(dense_mlp_part(&mut g, &mut lists, dense, input).is_err());
}
