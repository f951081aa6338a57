//! The head's parts planned on a `LaunchGraph` and their fused kernel (the generated source:
//! linear and head stages) run on CPU threads through the host prelude and `tests/host/`, at tiny
//! shapes: layer 0's embedding then the dense MLP (FP8, the down adding the embedded rows), and the
//! tail (bf16 and FP8 lm_head of 200 rows, not a multiple of the 16-row tile, split over the CTAs;
//! equal lm_head rows across tile and task boundaries winning row 0, a zero row whose logits all
//! tie); every stage checked on the device's own input (`executor::fused::head_check`). Negative
//! controls that must fail: ties to the higher id and the embedding's next row (faults built in),
//! two scale blocks of lm_head swapped. Needs g++ with C++20, so ignored:
//! `cargo test --release -p executor --test fused_head -- --ignored --nocapture`

use executor::fused::head::{
    dense_mlp_part, embed_part, head_source, tail_part, DensePlan, DenseShape, DenseWeights,
    EmbedPlan, HeadDescriptors, HeadLists, TailPlan, TailShape, TailWeights,
};
use executor::fused::head_check::{DenseCase, EmbedCase, TailCase};
use executor::fused::{CtaShape, Handoff, LaunchGraph, PlannedLaunch, ENTRY};
use linear::gpu::LinMatrix;
use mailbox::gpu::{DebugBound, Variant};
use mailbox::layout::BoxRange;
use model::weights::packed::PackedWeight;
use model::WeightFormat;
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
const HOST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/host");

/// Four groups of 32: a small CTA, so that the emulated threads stay few.
const THREADS: u32 = 128;
const CTAS: u32 = 3;
const ROWS: u32 = 4;
const HIDDEN: u32 = 256;
const VOCAB_ROWS: u32 = 200;
const TIED: [u32; 7] = [15, 16, 31, 32, 79, 80, 127];
const FAULT_TIES_HIGH: u32 = 601;
const FAULT_NEXT_ROW: u32 = 602;
const LDS: u32 = 16 * 1024;

fn compile(dir: &Path, fault: u32) -> PathBuf {
    let variant = Variant {
        debug: Some(DebugBound {
            poll_limit: 200_000_000,
            trap: false,
        }),
        ..Variant::default()
    };
    let shape = CtaShape {
        threads: THREADS,
        shared_bytes: LDS,
    };
    let source = head_source(shape, variant).unwrap();
    let dynamic = "extern __shared__ __attribute__((aligned(1024))) u8 mono_lds[];";
    assert!(source.text().contains(dynamic));
    let text = source.text().replace(
        dynamic,
        &format!("alignas(1024) static u8 mono_lds[{LDS}];"),
    );
    std::fs::write(dir.join("fused_head.hip"), text).unwrap();
    let exe = dir.join(format!("head_{fault}"));
    let mut cmd = Command::new("g++");
    cmd.args(["-std=c++20", "-O2", "-pthread", "-w"])
        .arg(format!("-I{}", dir.display()))
        .arg(format!("-I{HOST}"))
        .arg(format!("-I{ROOT}/kernels/host"))
        .arg(format!("-I{ROOT}/kernels"))
        .arg(format!("-I{ROOT}/crates/mailbox/kernels"))
        .arg(format!("-I{ROOT}/crates/linear/kernels"))
        .arg(format!("-I{ROOT}/crates/head/kernels"))
        .arg(format!("-DMONO_FAULT={fault}"));
    for (name, value) in source.defines() {
        cmd.arg(format!("-D{name}={value}"));
    }
    let out = cmd
        .arg(format!("{HOST}/head_driver.cpp"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("g++: {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

fn as_bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// Device memory as one byte arena: weights and inputs, then the launch's activation arena;
/// pointers are offsets into it.
#[derive(Default)]
struct Memory {
    bytes: Vec<u8>,
}

impl Memory {
    fn put(&mut self, data: &[u8]) -> u64 {
        let at = self.bytes.len().next_multiple_of(256);
        self.bytes.resize(at, 0);
        self.bytes.extend_from_slice(data);
        at as u64
    }

    fn weight(&mut self, w: &PackedWeight) -> (u64, u64) {
        let scales = if w.scales.is_empty() {
            0
        } else {
            self.put(&as_bytes(&w.scales))
        };
        (self.put(&w.bytes), scales)
    }
}

fn read<T: bytemuck::Pod>(out: &[u8], at: u64, n: usize) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    out[at as usize..at as usize + n * size]
        .chunks_exact(size)
        .map(bytemuck::pod_read_unaligned)
        .collect()
}

/// A planned launch with its memory, bound.
struct Bound {
    planned: PlannedLaunch,
    memory: Memory,
    arena: u64,
    mats: Vec<LinMatrix>,
    d: HeadDescriptors,
}

fn bind(
    planned: PlannedLaunch,
    lists: &HeadLists,
    mut memory: Memory,
    binder: impl FnOnce(u64, &mut [LinMatrix], &mut HeadDescriptors),
) -> Bound {
    let arena = memory.put(&vec![0xff; planned.arena.bytes as usize]);
    let mut mats = vec![LinMatrix::default(); planned.matrices as usize];
    let mut d = HeadDescriptors::new(lists);
    binder(arena, &mut mats, &mut d);
    Bound {
        planned,
        memory,
        arena,
        mats,
        d,
    }
}

fn run(exe: &Path, b: &Bound) -> Result<Vec<u8>, String> {
    let table = b.planned.placement.placement().table();
    let mut input: Vec<u8> = Vec::new();
    for w in [
        CTAS,
        table.tasks.len() as u32,
        b.mats.len() as u32,
        b.d.embeds.len() as u32,
        b.d.norms.len() as u32,
        b.d.argmaxes.len() as u32,
        b.d.picks.len() as u32,
        b.planned.layout.boxes(),
        b.memory.bytes.len() as u32,
    ] {
        input.extend(w.to_le_bytes());
    }
    input.extend(as_bytes(&table.tasks));
    input.extend(as_bytes(&table.offsets));
    input.extend(as_bytes(&b.mats));
    input.extend(as_bytes(&b.d.embeds));
    input.extend(as_bytes(&b.d.norms));
    input.extend(as_bytes(&b.d.argmaxes));
    input.extend(as_bytes(&b.d.picks));
    input.extend(&b.memory.bytes);
    let dir = exe.parent().unwrap();
    let (i, o) = (dir.join("input"), dir.join("output"));
    std::fs::write(&i, input).unwrap();
    let out = Command::new(exe).arg(&i).arg(&o).output().unwrap();
    if !out.status.success() {
        return Err(format!(
            "driver status {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(std::fs::read(&o).unwrap())
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
    assert!(dense_plan.lds_bytes(THREADS).unwrap() <= LDS);
    let embed = EmbedCase::new(50, HIDDEN as usize, ROWS as usize, 11);
    let dense = DenseCase::new(shape, Some(embed.reference().unwrap()), 12).unwrap();
    let mut memory = Memory::default();
    let table = memory.put(&as_bytes(&embed.table));
    let tokens = memory.put(&as_bytes(&embed.tokens));
    let post_norm = memory.put(&as_bytes(&dense.post_norm));
    let (gate_up, gate_up_scales) = memory.weight(&dense.gate_up_packed);
    let (down, down_scales) = memory.weight(&dense.down_packed);
    let w = DenseWeights {
        post_norm,
        gate_up,
        gate_up_scales,
        down,
        down_scales,
    };
    let vocab = embed.vocab as u32;
    let planned = g.finish().unwrap();
    let bound = bind(planned, &lists, memory, |arena, mats, d| {
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

fn check_layer0(l: &Layer0, out: &[u8]) -> Result<(), String> {
    let (rows, hidden) = (ROWS as usize, HIDDEN as usize);
    let at = |s: executor::fused::ArenaSlice| l.bound.arena + s.offset;
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

fn tail(format: WeightFormat, swap_scales: bool) -> Tail {
    let mut g = LaunchGraph::new(CTAS).unwrap();
    let mut lists = HeadLists::default();
    let x = g.arena("tail_x", u64::from(ROWS * HIDDEN) * 2).unwrap();
    let shape = TailShape {
        rows: ROWS,
        hidden: HIDDEN,
        vocab_rows: VOCAB_ROWS,
        shard: 0,
        shards: 1,
        eps: 1e-5,
        format,
    };
    let input = Handoff {
        data: x,
        ready: BoxRange::default(),
    };
    let plan = tail_part(&mut g, &mut lists, shape, input).unwrap();
    assert!(plan.lds_bytes(THREADS).unwrap() <= LDS);
    let case = TailCase::new(shape, &TIED, 21).unwrap();
    let mut memory = Memory::default();
    let final_norm = memory.put(&as_bytes(&case.final_norm));
    let mut packed = case.packed.clone();
    if swap_scales {
        let other = (1..packed.scales.len())
            .find(|&i| packed.scales[i] != packed.scales[0])
            .unwrap();
        packed.scales.swap(0, other);
    }
    let (lm_head, lm_head_scales) = memory.weight(&packed);
    let w = TailWeights {
        final_norm,
        lm_head,
        lm_head_scales,
    };
    let planned = g.finish().unwrap();
    let mut bound = bind(planned, &lists, memory, |arena, mats, d| {
        plan.bind(arena, &w, mats, d)
    });
    let at = (bound.arena + x.offset) as usize;
    let xb = as_bytes(&case.x);
    bound.memory.bytes[at..at + xb.len()].copy_from_slice(&xb);
    Tail { case, plan, bound }
}

fn check_tail(t: &Tail, out: &[u8]) -> Result<(), String> {
    let (rows, p) = (ROWS as usize, &t.plan);
    let at = |s: executor::fused::ArenaSlice| t.bound.arena + s.offset;
    let m = t.case.check(
        &read::<u16>(out, at(p.z), rows * HIDDEN as usize),
        &read::<u16>(out, at(p.logits), rows * VOCAB_ROWS as usize),
        &read::<u64>(out, at(p.pairs), rows),
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
    let dir = std::env::temp_dir().join(format!("fused-head-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = compile(&dir, 0);
    let l0 = layer0();
    check_layer0(&l0, &run(&exe, &l0.bound).unwrap()).unwrap();
    for format in [WeightFormat::Bf16, WeightFormat::Fp8] {
        let t = tail(format, false);
        check_tail(&t, &run(&exe, &t.bound).unwrap()).unwrap();
    }

    let t = tail(WeightFormat::Fp8, true);
    let err = check_tail(&t, &run(&exe, &t.bound).unwrap()).expect_err("swapped scales passed");
    eprintln!("swapped lm_head scales: {err}");
    let exe = compile(&dir, FAULT_TIES_HIGH);
    let t = tail(WeightFormat::Bf16, false);
    let err =
        check_tail(&t, &run(&exe, &t.bound).unwrap()).expect_err("ties to the higher id passed");
    eprintln!("ties to the higher id: {err}");
    let exe = compile(&dir, FAULT_NEXT_ROW);
    let err = check_layer0(&l0, &run(&exe, &l0.bound).unwrap()).expect_err("the next row passed");
    eprintln!("the embedding's next row: {err}");
    let _ = std::fs::remove_dir_all(&dir);
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
