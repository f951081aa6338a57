//! The head's task source (`kernels/head.hip`, `head_tasks.h`, the workspace's `ops/rows.h`) run
//! on CPU threads through the host stand-in of the prelude (`kernels/host/prelude.h`) and a driver
//! (`tests/host/`): one launch of the embedding (repeated tokens, a zero row, a row of outliers, and
//! a token past the table, which must give NaN), the norm of the embedded rows waiting on the
//! embedding's boxes, the argmax over two vocabulary shards of adversarial logits (equal largest
//! logits at several ids on both sides of the shard boundary, a row all equal, -0 against +0) and
//! the pick over the shards waiting on the argmax's boxes; checked against the reference
//! (`head::reference`) by `head::check`. Then the negative controls, built with a fault, which must
//! fail: ties to the higher id, the embedding's row after the token's.
//! Needs g++ with C++20, so ignored:
//! `cargo test --release -p head --test host_emulation -- --ignored --nocapture`

use device::host::build_driver;
use head::check::{check_norm, check_pairs, check_tokens};
use head::gpu::{source, HeadArgmax, HeadEmbed, HeadNorm, HeadPick};
use head::layout::{pair_id, task, KIND_ARGMAX, KIND_EMBED, KIND_NORM, KIND_PICK};
use head::reference::{argmax, embed, rms_norm_rows, shard_pair};
use mailbox::gpu::{DebugBound, Variant};
use mailbox::layout::{BoxRange, BOXES_PER_LINE};
use mailbox::{Placement, Task};
use model::numerics::bf16_round;
use model::weights::Matrix;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The launcher around the stage's entry (`tests/host/driver.cpp`).
const DRIVER: &str = include_str!("host/driver.cpp");

/// Four groups of 32: a small CTA, so that the emulated threads stay few.
const THREADS: u32 = 128;
const CTAS: u32 = 3;
const VOCAB: usize = 40;
const HIDDEN: usize = 256;
const TOKENS: [u32; 5] = [3, 39, 3, 0, 17];
const LOGIT_ROWS: usize = 5;
const SHARD: usize = 150;

/// The driver (`tests/host/driver.cpp`) around the stage's own source and defines, with polls
/// bounded so that a wrong wait reports instead of hanging; `fault`: `MONO_FAULT`.
fn compile(dir: &Path, fault: u32) -> PathBuf {
    let variant = Variant {
        debug: Some(DebugBound {
            poll_limit: 200_000_000,
            trap: false,
        }),
        ..Variant::default()
    };
    let exe = dir.join(format!("head_host_{fault}"));
    let src = source(THREADS, variant).define("MONO_FAULT", fault);
    build_driver(&src, ("driver.cpp", DRIVER), &exe).unwrap_or_else(|e| panic!("{e}"));
    exe
}

/// A deterministic stream of uniform values in [-1, 1).
struct Draw(u64);
impl Draw {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn bits(v: f32) -> u16 {
    (bf16_round(v).to_bits() >> 16) as u16
}

fn value(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

fn as_bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// A launch's device memory as one byte arena; pointers become offsets into it.
#[derive(Default)]
struct Arena {
    bytes: Vec<u8>,
}

impl Arena {
    fn put(&mut self, data: &[u8]) -> u64 {
        let at = self.bytes.len().next_multiple_of(16);
        self.bytes.resize(at, 0);
        self.bytes.extend_from_slice(data);
        at as u64
    }

    fn read<T: bytemuck::Pod>(out: &[u8], at: u64, n: usize) -> Vec<T> {
        let at = at as usize;
        out[at..at + n * std::mem::size_of::<T>()]
            .chunks_exact(std::mem::size_of::<T>())
            .map(bytemuck::pod_read_unaligned)
            .collect()
    }
}

/// The inputs: the table (a zero row at token 0, outliers at 17), the norm weight, the logits.
struct Inputs {
    table: Vec<u16>,
    weight: Vec<u16>,
    logits: Vec<u16>,
}

fn inputs() -> Inputs {
    let mut d = Draw(7);
    let table = (0..VOCAB * HIDDEN)
        .map(|i| match i / HIDDEN {
            0 => 0,
            17 if i % 5 == 0 => bits(3000.0 * d.next().signum()),
            _ => bits(d.next()),
        })
        .collect();
    let weight = (0..HIDDEN).map(|_| bits(0.5 + d.next())).collect();
    let n = 2 * SHARD;
    let mut logits: Vec<f32> = (0..LOGIT_ROWS * n).map(|_| 4.0 * d.next()).collect();
    let mut row = |r: usize, f: &dyn Fn(usize) -> Option<f32>| {
        for c in 0..n {
            if let Some(v) = f(c) {
                logits[r * n + c] = v;
            }
        }
    };
    // Equal largest logits on both sides of the boundary: the first wins.
    row(0, &|c| {
        [5, SHARD - 1, SHARD, n - 1].contains(&c).then_some(9.0)
    });
    // All equal: token 0.
    row(1, &|_| Some(-1.0));
    // The largest only in shard 1, twice.
    row(2, &|c| [SHARD + 1, n - 10].contains(&c).then_some(8.5));
    // -0 everywhere but one +0, which total_cmp puts above.
    row(3, &|c| Some(if c == SHARD + 50 { 0.0 } else { -0.0 }));
    Inputs {
        table,
        weight,
        logits: logits.into_iter().map(bits).collect(),
    }
}

/// Where the outputs live in the arena.
struct Outputs {
    embedded: u64,
    bad_row: u64,
    z: u64,
    pairs: u64,
    tokens: u64,
}

/// A task as the test lays it out: (CTA, kind, op, rows, waits).
type Planned = (u32, u32, u32, std::ops::Range<u32>, Vec<BoxRange>);

struct Launch {
    tasks: Vec<Vec<Task>>,
    boxes: u32,
    embeds: Vec<HeadEmbed>,
    norms: Vec<HeadNorm>,
    argmaxes: Vec<HeadArgmax>,
    picks: Vec<HeadPick>,
    arena: Arena,
    out: Outputs,
}

fn build(x: &Inputs) -> Launch {
    let mut arena = Arena::default();
    let rows = TOKENS.len();
    let table = arena.put(&as_bytes(&x.table));
    let tokens = arena.put(&as_bytes(&TOKENS));
    let bad_token = arena.put(&as_bytes(&[VOCAB as u32]));
    let embedded = arena.put(&vec![0u8; rows * HIDDEN * 2]);
    let bad_row = arena.put(&vec![0u8; HIDDEN * 2]);
    let weight = arena.put(&as_bytes(&x.weight));
    let z = arena.put(&vec![0xffu8; rows * HIDDEN * 2]);
    let logits = arena.put(&as_bytes(&x.logits));
    let pairs = arena.put(&[0u8; LOGIT_ROWS * 2 * 8]);
    let tokens_out = arena.put(&[0xffu8; LOGIT_ROWS * 4]);
    let embed_op = |tokens, y| HeadEmbed {
        table,
        tokens,
        y,
        vocab: VOCAB as u32,
        hidden: HIDDEN as u32,
        y_stride: HIDDEN as u32,
        pad: 0,
    };
    let shard = |s: u32| HeadArgmax {
        logits: logits + u64::from(s) * SHARD as u64 * 2,
        pairs,
        n: SHARD as u32,
        stride: 2 * SHARD as u32,
        first_id: s * SHARD as u32,
        shard: s,
        shards: 2,
        pad: 0,
    };
    let line = |i: u32| BoxRange::new(i * BOXES_PER_LINE, BOXES_PER_LINE);
    let lines = |first: u32, n: u32| BoxRange::new(first * BOXES_PER_LINE, n * BOXES_PER_LINE);
    let r = rows as u32;
    let lr = LOGIT_ROWS as u32;
    // (cta, kind, op, rows, waits): rank and line are the position in this list.
    let plan: Vec<Planned> = vec![
        (0, KIND_EMBED, 0, 0..2, vec![]),
        (1, KIND_EMBED, 0, 2..r, vec![]),
        (2, KIND_EMBED, 1, 0..1, vec![]),
        (2, KIND_NORM, 0, 0..3, vec![lines(0, 2)]),
        (0, KIND_NORM, 0, 3..r, vec![lines(0, 2)]),
        (1, KIND_ARGMAX, 0, 0..lr, vec![]),
        (0, KIND_ARGMAX, 1, 0..2, vec![]),
        (2, KIND_ARGMAX, 1, 2..lr, vec![]),
        (1, KIND_PICK, 0, 0..lr, vec![lines(5, 3)]),
    ];
    let mut tasks = vec![Vec::new(); CTAS as usize];
    for (i, (cta, kind, op, rows, waits)) in plan.into_iter().enumerate() {
        let i = i as u32;
        tasks[cta as usize].push(task(kind, i, op, rows, line(i), &waits).unwrap());
    }
    Launch {
        boxes: 9 * BOXES_PER_LINE,
        tasks,
        embeds: vec![embed_op(tokens, embedded), embed_op(bad_token, bad_row)],
        norms: vec![HeadNorm {
            x: embedded,
            weight,
            y: z,
            n: HIDDEN as u32,
            x_stride: HIDDEN as u32,
            y_stride: HIDDEN as u32,
            eps: 1e-5,
        }],
        argmaxes: vec![shard(0), shard(1)],
        picks: vec![HeadPick {
            pairs,
            tokens: tokens_out,
            shards: 2,
            first: 0,
            count: 2,
            pad: 0,
        }],
        arena,
        out: Outputs {
            embedded,
            bad_row,
            z,
            pairs,
            tokens: tokens_out,
        },
    }
}

fn run(exe: &Path, l: &Launch) -> Vec<u8> {
    let table = Placement::new(l.tasks.clone()).table();
    let mut input: Vec<u8> = Vec::new();
    for w in [
        CTAS,
        table.tasks.len() as u32,
        l.embeds.len() as u32,
        l.norms.len() as u32,
        l.argmaxes.len() as u32,
        l.picks.len() as u32,
        l.boxes,
        l.arena.bytes.len() as u32,
    ] {
        input.extend(w.to_le_bytes());
    }
    input.extend(as_bytes(&table.tasks));
    input.extend(as_bytes(&table.offsets));
    input.extend(as_bytes(&l.embeds));
    input.extend(as_bytes(&l.norms));
    input.extend(as_bytes(&l.argmaxes));
    input.extend(as_bytes(&l.picks));
    input.extend(&l.arena.bytes);
    let (i, o) = (exe.with_extension("input"), exe.with_extension("output"));
    std::fs::write(&i, input).unwrap();
    let out = Command::new(exe).arg(&i).arg(&o).output().unwrap();
    assert!(
        out.status.success(),
        "driver status {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(&o).unwrap()
}

/// Every check of the launch's outputs; the first failure.
fn check(x: &Inputs, l: &Launch, out: &[u8]) -> Result<(), String> {
    let rows = TOKENS.len();
    let table = Matrix::new(VOCAB, HIDDEN, x.table.iter().map(|&b| value(b)).collect())
        .map_err(|e| e.to_string())?;
    let want = embed(&table, &TOKENS).map_err(|e| e.to_string())?;
    let got: Vec<f32> = Arena::read::<u16>(out, l.out.embedded, rows * HIDDEN)
        .into_iter()
        .map(value)
        .collect();
    if let Some(i) = (0..want.len()).find(|&i| want[i].to_bits() != got[i].to_bits()) {
        return Err(format!(
            "embedding: value {i} (row {}) = {}, the table's {}",
            i / HIDDEN,
            got[i],
            want[i]
        ));
    }
    let bad = Arena::read::<u16>(out, l.out.bad_row, HIDDEN);
    if !bad.iter().all(|&b| value(b).is_nan()) {
        return Err("a token past the table did not give a NaN row".into());
    }
    let weight: Vec<f32> = x.weight.iter().map(|&b| value(b)).collect();
    let z_ref = rms_norm_rows(&want, &weight, 1e-5, rows).map_err(|e| e.to_string())?;
    let z: Vec<f32> = Arena::read::<u16>(out, l.out.z, rows * HIDDEN)
        .into_iter()
        .map(value)
        .collect();
    let m = check_norm(&z_ref, &z)?;
    eprintln!(
        "norm: {} outputs, {} off the reference (at most {} bf16 steps)",
        m.outputs, m.off_reference, m.max_steps
    );
    let logits: Vec<f32> = x.logits.iter().map(|&b| value(b)).collect();
    let pairs = Arena::read::<u64>(out, l.out.pairs, LOGIT_ROWS * 2);
    for s in 0..2 {
        let shard: Vec<f32> = logits
            .chunks_exact(2 * SHARD)
            .flat_map(|row| row[s * SHARD..(s + 1) * SHARD].to_vec())
            .collect();
        let mine: Vec<u64> = pairs.iter().skip(s).step_by(2).copied().collect();
        check_pairs(&shard, SHARD, (s * SHARD) as u32, &mine)
            .map_err(|e| format!("shard {s}: {e}"))?;
    }
    let tokens = Arena::read::<u32>(out, l.out.tokens, LOGIT_ROWS);
    let expected: Vec<u32> = logits.chunks_exact(2 * SHARD).map(argmax).collect();
    eprintln!("tokens {tokens:?}, the reference's {expected:?}");
    if tokens[..4] != [5, 0, (SHARD + 1) as u32, (SHARD + 50) as u32] {
        return Err(format!(
            "the adversarial rows' tokens are {:?}",
            &tokens[..4]
        ));
    }
    let m = check_tokens(&logits, 2 * SHARD, &tokens)?;
    if m.near_ties != 0 {
        return Err(format!(
            "{} tokens differ on the reference's own logits",
            m.near_ties
        ));
    }
    // The pick agrees with the whole row's pair.
    for (r, row) in logits.chunks_exact(2 * SHARD).enumerate() {
        if pair_id(shard_pair(row, 0)) != tokens[r] {
            return Err(format!("row {r}: the pick is not the whole row's argmax"));
        }
    }
    Ok(())
}

#[test]
#[ignore = "slow; needs g++ with C++20"]
fn head_source_on_cpu_threads_matches_the_reference() {
    let dir = std::env::temp_dir().join(format!("head-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let x = inputs();
    let l = build(&x);
    let out = run(&compile(&dir, 0), &l);
    check(&x, &l, &out).unwrap();

    for (fault, what) in [
        (601, "ties to the higher id"),
        (602, "the next embedding row"),
    ] {
        let out = run(&compile(&dir, fault), &l);
        let err = check(&x, &l, &out).expect_err(what);
        eprintln!("{what}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
