//! The kernels' own source (`kernels/select.hip`, `select.h` and the headers it includes, found
//! through `-I kernels`) run on CPU threads through the host stand-in of the prelude
//! (`kernels/host/prelude.h` of the workspace) and a driver (`tests/host/`),
//! compared entry by entry with the reference: wave sizes 32 and 64, all three kernels, every pattern,
//! page tables, a build with many small slices, and one at production k and slicing. This checks the device
//! code itself without a GPU (block barriers, ballots, shuffles, tagged-pair waits between CTAs),
//! but not the GPU's memory model or speed.
//! Slow (each CTA is a process of the block's threads) and needs g++ with C++20, so ignored:
//! `cargo test --release -p select --test host_emulation -- --ignored --nocapture`

use mailbox::layout::ScratchLayout;
use select::cases::{self, Pattern};
use select::check::check_output;
use select::layout::{place_slices, slice_count, SelectBoxes, TaskOrder, TopK, SLICE_TARGET};
use select::reference::{select_row, Pages, Rows};
use std::path::{Path, PathBuf};
use std::process::Command;

const KERNELS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
const HOST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/host");
/// The host prelude, found before the real one; then the ops layer beside the real one.
const HOST_PRELUDE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels/host");
const OPS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels");
const MAILBOX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../mailbox/kernels");

struct Build {
    name: &'static str,
    wave: u32,
    block: u32,
    k: u32,
    /// `SEL_SLICE_TARGET`: small in the first builds, so that short rows take several slices.
    slice_target: u32,
    slice_keys: u32,
    /// `SEL_REG_BLOCK` and `SEL_REG_KEYS` of the registers kernel: it runs the batches whose rows
    /// all fit in `reg_block * reg_keys` keys.
    reg_block: u32,
    reg_keys: u32,
    /// Row lengths of the batches it runs.
    batches: &'static [&'static [u32]],
}

const BUILDS: [Build; 4] = [
    Build {
        name: "wave32",
        wave: 32,
        block: 64,
        k: 16,
        slice_target: 1024,
        slice_keys: 2048,
        reg_block: 256,
        reg_keys: 28,
        batches: &[&[3000, 16, 17, 0], &[7000, 700], &[5133, 1025, 257, 5]],
    },
    Build {
        name: "wave64",
        wave: 64,
        block: 128,
        k: 16,
        slice_target: 1024,
        slice_keys: 2048,
        reg_block: 256,
        reg_keys: 32,
        batches: &[&[3000, 16, 17, 0], &[7000, 700]],
    },
    Build {
        name: "many-slices",
        wave: 32,
        block: 64,
        k: 16,
        slice_target: 64,
        slice_keys: 2048,
        reg_block: 64,
        reg_keys: 32,
        batches: &[&[3000, 1100]],
    },
    Build {
        name: "k2048",
        wave: 32,
        // A thread places at most 64 keys: slices of SLICE_TARGET keys need 128 threads.
        block: 128,
        k: 2048,
        slice_target: SLICE_TARGET,
        slice_keys: SLICE_TARGET,
        reg_block: 1024,
        reg_keys: 20,
        batches: &[&[20000, 3000, 2049, 2048]],
    },
];

fn compile(b: &Build, dir: &Path) -> PathBuf {
    // The one line the host cannot take as written: dynamic shared memory becomes a static array.
    let hip = std::fs::read_to_string(format!("{KERNELS}/select.hip")).unwrap();
    let dynamic = "extern __shared__ __attribute__((aligned(16))) u32 sel_lds[];";
    assert!(hip.contains(dynamic));
    let hip = hip.replace(dynamic, "alignas(16) static u32 sel_lds[SEL_LDS_WORDS];");
    std::fs::write(dir.join("select.hip"), hip).unwrap();
    let exe = dir.join(format!("select_{}", b.name));
    let out = Command::new("g++")
        .args(["-std=c++20", "-O2", "-pthread", "-w"])
        .arg(format!("-I{}", dir.display()))
        .arg(format!("-I{HOST}"))
        .arg(format!("-I{HOST_PRELUDE}"))
        .arg(format!("-I{KERNELS}"))
        .arg(format!("-I{MAILBOX}"))
        .arg(format!("-I{OPS}"))
        .arg(format!("-DMONO_WAVE={}", b.wave))
        .arg(format!("-DSEL_BLOCK={}", b.block))
        .arg(format!("-DSEL_K={}", b.k))
        .arg(format!("-DSEL_SLICE_TARGET={}", b.slice_target))
        .arg(format!("-DSEL_SLICE_KEYS={}", b.slice_keys))
        .arg(format!("-DSEL_REG_BLOCK={}", b.reg_block))
        .arg(format!("-DSEL_REG_KEYS={}", b.reg_keys))
        .args([
            "-DMBX_DEBUG=1",
            "-DMBX_DEBUG_TRAP=0",
            "-DMBX_POLL_LIMIT=20000000u",
        ])
        .arg(format!("{HOST}/driver.cpp"))
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

/// One launch of `method` (0 one-CTA, 1 multi-slice, 2 registers): the error words and the lists.
fn launch(
    exe: &Path,
    b: &Build,
    method: u32,
    rows: &Rows,
    pages: Option<&Pages>,
) -> Result<(Vec<u32>, Vec<i32>), String> {
    let top = TopK::new(b.k).unwrap();
    let mut builder = ScratchLayout::builder();
    let boxes = SelectBoxes::add(&mut builder, "sel", rows.count() as u32, top).unwrap();
    let scratch = builder.build().boxes();
    let counts: Vec<u32> = rows
        .lens
        .iter()
        .map(|&l| slice_count(l, b.slice_target))
        .collect();
    let p = place_slices(&counts).unwrap();
    let mut words = vec![
        method,
        rows.count() as u32,
        rows.stride as u32,
        pages.map_or(0, |p| p.stride as u32),
        (p.order() == TaskOrder::Runs) as u32,
        p.tasks(),
        boxes.hist.offset(),
        boxes.cand.offset(),
        boxes.cand.stride(),
        scratch,
    ];
    words.extend(rows.lens);
    words.extend(rows.scores.iter().map(|s| s.to_bits()));
    words.extend(pages.iter().flat_map(|p| p.table.iter().map(|&v| v as u32)));
    let dir = exe.parent().unwrap();
    let (input, output) = (dir.join("input"), dir.join("output"));
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    std::fs::write(&input, bytes).unwrap();
    let run = Command::new(exe).arg(&input).arg(&output).output().unwrap();
    if !run.status.success() {
        // driver.cpp: 3 is its watchdog, 1 a CTA that did not exit cleanly (a trap, a crash).
        let what = match run.status.code() {
            Some(3) => {
                "some CTA had not finished after 60 s: a wait that never ends, or a machine \
                        too loaded to run the emulated threads (rerun alone to tell)"
                    .to_string()
            }
            code => format!("status {code:?}"),
        };
        return Err(format!("{what}: {}", String::from_utf8_lossy(&run.stderr)));
    }
    let words: Vec<u32> = std::fs::read(&output)
        .unwrap()
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let n = rows.count() * 4;
    Ok((
        words[..n].to_vec(),
        words[n..].iter().map(|&w| w as i32).collect(),
    ))
}

#[test]
#[ignore = "slow; needs g++ with C++20"]
fn kernel_source_on_cpu_threads_matches_the_reference() {
    let dir = std::env::temp_dir().join(format!("select-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut failures = Vec::new();
    let mut runs = 0;
    // Where the rows that the one CTA keeps in LDS (wide digits) stopped, and the others.
    let mut lds_stops = std::collections::BTreeSet::new();
    let mut other_stops = std::collections::BTreeSet::new();
    let mut reg_stops = std::collections::BTreeSet::new();
    for b in &BUILDS {
        let exe = compile(b, &dir);
        let top = TopK::new(b.k).unwrap();
        for (i, lens) in b.batches.iter().enumerate() {
            for (p, pattern) in Pattern::ALL.into_iter().enumerate() {
                let stride = (*lens.iter().max().unwrap() as usize + 5).div_ceil(4) * 4;
                let scores = cases::rows(pattern, lens, stride, (i * 16 + p) as u64);
                let rows = Rows {
                    scores: &scores,
                    stride,
                    lens,
                };
                let per_row = stride.div_ceil(64);
                let table: Vec<i32> = (0..lens.len() * per_row)
                    .map(|j| ((j * 37) % (lens.len() * per_row) + 5) as i32)
                    .collect();
                let pages = Pages {
                    table: &table,
                    stride: per_row,
                };
                let pages = (p % 2 == 1).then_some(&pages);
                let in_regs = lens.iter().all(|&len| len <= b.reg_block * b.reg_keys);
                for (r, &len) in lens.iter().enumerate() {
                    let th = select_row(rows.row(r), top).unwrap().threshold;
                    if let (Some(t), true) = (th, in_regs) {
                        reg_stops.insert(t.prefix_bits);
                    }
                    if let Some(t) = th {
                        let in_lds = len <= b.slice_keys;
                        if in_lds {
                            &mut lds_stops
                        } else {
                            &mut other_stops
                        }
                        .insert(t.prefix_bits);
                    }
                }
                for method in [0, 1, 2] {
                    if method == 2 && !in_regs {
                        continue;
                    }
                    runs += 1;
                    let result = launch(&exe, b, method, &rows, pages).and_then(|(flags, out)| {
                        if flags.iter().any(|&f| f != 0) {
                            return Err(format!("flags {flags:?}"));
                        }
                        check_output(&rows, top, pages, &out).map_err(|e| e.to_string())
                    });
                    if let Err(e) = result {
                        let case =
                            format!("{} method {method} {} {lens:?}", b.name, pattern.name());
                        eprintln!("{case}: {e}");
                        failures.push(case);
                    }
                }
            }
        }
        // A negative NaN among the keys of a row the one CTA keeps in LDS (and that one or two
        // slices load, by the build's target) is flagged on that row alone, by both kernels.
        let lens = [100, 1500];
        let stride = 1504;
        let mut scores = cases::rows(Pattern::Random, &lens, stride, 77);
        scores[stride + 1234] = f32::from_bits(0xffc0_0001);
        let rows = Rows {
            scores: &scores,
            stride,
            lens: &lens,
        };
        for method in [0, 1, 2] {
            runs += 1;
            let flags = launch(&exe, b, method, &rows, None).map(|(flags, _)| flags);
            if flags != Ok(vec![0, 0, 0, 0, 1, 0, 0, 0]) {
                eprintln!("{} method {method}: NaN in row 1: {flags:?}", b.name);
                failures.push(format!("{} method {method} NaN", b.name));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{runs} emulated launches, {} failed", failures.len());
    eprintln!(
        "stops: rows in the one CTA's LDS {lds_stops:?}, longer rows {other_stops:?}, rows the \
         registers kernel took {reg_stops:?}"
    );
    assert!(failures.is_empty(), "{failures:?}");
    // Every path ran: wide digits from 12 and from 24 bits, and ties placed at 32, on both sides
    // of the one CTA's LDS edge and in the registers kernel.
    let all: std::collections::BTreeSet<u32> = [12, 24, 32].into();
    assert_eq!(
        (lds_stops, other_stops, reg_stops),
        (all.clone(), all.clone(), all)
    );
}
