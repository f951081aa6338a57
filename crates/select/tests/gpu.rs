//! The select stage on the GPU through its standalone entry (the task-list loop over the plan the
//! host builds, in the fused CTA shape of 512 threads), entry by entry against the reference of
//! its own input: every pattern of `select::cases` (masked rows included) over rows shorter than k, exactly k, k + 1,
//! 8K, 32K, 128K, 300K and 1M keys, in batches of 1, 4 and 8 rows, all three kinds (the registers
//! task on the batches whose rows it holds, up to 16384 keys); cache slots through a page table;
//! NaN reported; and the three negative controls shown to fail the checker. Prints a table last.
//!
//! The one CTA keeps rows of up to `one_cta_room` keys (32768 on the H200) in LDS and selects
//! them with wide digits; longer rows stream. The batches cover both sides of that edge, and the
//! patterns make the in-LDS rows stop at every P (random 8K: 12, dense: 24, narrow / ties: 32);
//! the matrix prints which stops each batch's rows took.
//!
//! `cargo test --release -p select --test gpu -- --ignored --nocapture`
//!
//! The matrix runs on the debug build (polls bounded by MBX_POLL_LIMIT, so a hang becomes a report
//! naming the box), and its random rows again on the production build (the benchmark checks every
//! case it times on that build too).

use device::{Device, Stream};
use mailbox::gpu::{DebugBound, Variant};
use model::paging::{PageTable, PAGE_TOKENS};
use model::Preset;
use select::cases::{self, Pattern};
use select::check::{check_output, controls, expected_sets, missed, CheckError};
use select::gpu::{Batch, GpuError, Method, Selector, Shape};
use select::layout::{TopK, MAX_ROW_KEYS, REG_MAX_ROW};
use select::reference::{select_row, select_rows, RowPages, Rows};
use std::time::Instant;

/// k of GLM-5, from its preset.
fn glm5() -> TopK {
    TopK::preset(Preset::Glm5).unwrap()
}

const DEBUG: Variant = Variant {
    poll_acquire: false,
    debug: Some(DebugBound {
        poll_limit: 1 << 22,
        trap: false,
    }),
    epoch_clear: true,
};

/// Batches of the matrix: 1, 4 and 8 rows with mixed lengths, the short-row edge cases, the one
/// CTA's LDS edge (32768 keys in LDS, 32769 streamed on the H200), and rows the registers kernel
/// holds (its edge: 16384).
const BATCHES: [&[u32]; 7] = [
    &[1 << 20],
    &[8192, 32768, 131072, 300_000],
    &[1000, 2048, 2049, 8192, 32768, 131072, 300_000, 1 << 20],
    &[0, 1, 2047, 4095],
    &[2049, 16384, 32768, 32769],
    &[8192],
    &[8192, 16384, 2049, 4096, 12345, 8193, 16383, 100],
];
const METHODS: [Method; 3] = [Method::OneCta, Method::MultiSlice, Method::Registers];

/// Whether `method` takes rows of these lengths (the registers kernel: up to [`REG_MAX_ROW`]).
fn takes(method: Method, lens: &[u32]) -> bool {
    method != Method::Registers || lens.iter().all(|&l| l <= REG_MAX_ROW)
}

struct Host {
    lens: Vec<u32>,
    stride: usize,
    scores: Vec<f32>,
}

impl Host {
    fn new(pattern: Pattern, lens: &[u32], seed: u64) -> Host {
        // A stride past the longest row, so every row has NaN padding a kernel must not read.
        let stride = (*lens.iter().max().unwrap() as usize + 8).div_ceil(4) * 4;
        Host {
            lens: lens.to_vec(),
            stride,
            scores: cases::rows(pattern, lens, stride, glm5(), seed),
        }
    }

    fn rows(&self) -> Rows<'_> {
        Rows {
            scores: &self.scores,
            stride: self.stride,
            lens: &self.lens,
        }
    }
}

struct Kernels {
    dev: Device,
    stream: Stream,
    built: Vec<(Method, Variant, Selector)>,
}

impl Kernels {
    /// The three kernels, debug and production builds, for the longest rows they take (and any
    /// shorter).
    fn new() -> Kernels {
        let dev = Device::open(0).unwrap_or_else(|e| panic!("{e}"));
        let stream = dev.new_stream().unwrap();
        let mut built = Vec::new();
        let shared = dev.info().max_shared_per_block;
        for method in METHODS {
            for variant in [DEBUG, Variant::default()] {
                let top = glm5();
                let longest = match method {
                    Method::Registers => REG_MAX_ROW,
                    Method::OneCta | Method::MultiSlice => MAX_ROW_KEYS,
                };
                let shape = Shape::for_rows_within(method, top, longest, shared).unwrap();
                let sel =
                    Selector::build(&dev, method, shape, variant).unwrap_or_else(|e| panic!("{e}"));
                eprintln!(
                    "{} {}: {:?}, {} CTAs, {} keys in LDS, {} B of LDS",
                    method.name(),
                    if variant == DEBUG { "debug" } else { "prod" },
                    sel.kernel().resources(),
                    sel.ctas(),
                    shape.slice_keys,
                    shape.lds_bytes()
                );
                built.push((method, variant, sel));
            }
        }
        Kernels { dev, stream, built }
    }

    fn run(
        &self,
        method: Method,
        variant: Variant,
        rows: &Rows,
        pages: Option<&RowPages>,
    ) -> Result<Vec<i32>, GpuError> {
        let sel = &self
            .built
            .iter()
            .find(|(m, v, _)| *m == method && *v == variant)
            .expect("built in new()")
            .2;
        let batch = Batch::upload(&self.dev, sel, rows, pages)?;
        batch.enqueue(sel, &self.stream, 1)?;
        self.stream.sync()?;
        batch.read(sel)
    }
}

struct Line {
    case: String,
    result: String,
    ok: bool,
}

#[test]
#[ignore = "needs a GPU"]
fn check_matrix_on_the_gpu() {
    let top = glm5();
    let k = Kernels::new();
    let mut lines: Vec<Line> = Vec::new();
    let started = Instant::now();
    for (b, lens) in BATCHES.iter().enumerate() {
        for (p, pattern) in Pattern::ALL.into_iter().enumerate() {
            let host = Host::new(pattern, lens, 1000 * b as u64 + p as u64);
            let rows = host.rows();
            let stops: Vec<String> = (0..lens.len())
                .map(|r| match select_row(rows.row(r), top).unwrap().threshold {
                    Some(t) => t.prefix_bits.to_string(),
                    None => "-".into(),
                })
                .collect();
            eprintln!("{} {lens:?}: stops {}", pattern.name(), stops.join(" "));
            let want = select_rows(&rows, top, None).unwrap();
            let sets = expected_sets(&rows, top, None).unwrap();
            for method in METHODS.into_iter().filter(|&m| takes(m, lens)) {
                let variants: &[(&str, Variant)] = if pattern == Pattern::Random {
                    &[("debug", DEBUG), ("prod", Variant::default())]
                } else {
                    &[("debug", DEBUG)]
                };
                for &(vname, variant) in variants {
                    let case = format!(
                        "{} {:<12} {} rows {:?} {vname}",
                        method.name(),
                        pattern.name(),
                        lens.len(),
                        lens
                    );
                    let (result, ok) = match k.run(method, variant, &rows, None) {
                        Err(e) => (format!("error: {e}"), false),
                        Ok(got) if got == want => {
                            let kk = glm5().k() as usize;
                            let missed: usize = sets
                                .iter()
                                .enumerate()
                                .map(|(r, set)| missed(&got[r * kk..(r + 1) * kk], set))
                                .sum();
                            (format!("exact, missed {missed}"), missed == 0)
                        }
                        // Not equal: the checker names the first difference.
                        Ok(got) => match check_output(&rows, top, None, &got) {
                            Err(e) => (format!("FAIL {e}"), false),
                            Ok(()) => (
                                "FAIL differs from the reference, yet the checker passed it".into(),
                                false,
                            ),
                        },
                    };
                    let failed_debug = vname == "debug" && !ok;
                    lines.push(Line { case, result, ok });
                    // The production build has no bound on its polls: never run it after its
                    // debug twin failed.
                    if failed_debug {
                        break;
                    }
                }
            }
        }
    }
    eprintln!("matrix done in {:.1} s", started.elapsed().as_secs_f64());
    lines.extend(slots_case(&k));
    lines.extend(nan_case(&k));
    lines.extend(negative_controls(&k));
    println!("\n{:<92} result", "case");
    for l in &lines {
        println!(
            "{:<92} {}{}",
            l.case,
            if l.ok { "" } else { "<-- " },
            l.result
        );
    }
    let failed = lines.iter().filter(|l| !l.ok).count();
    println!(
        "{} cases, {failed} failed, {:.1} s",
        lines.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(failed, 0);
}

/// Cache slots through a scrambled page table, every kernel.
fn slots_case(k: &Kernels) -> Vec<Line> {
    METHODS
        .into_iter()
        .map(|method| {
            let lens: &[u32] = match method {
                Method::Registers => &[5000, 16384, 2000, 9000],
                Method::OneCta | Method::MultiSlice => &[5000, 131072, 2000, 300_000],
            };
            slots_of(k, method, lens)
        })
        .collect()
}

fn slots_of(k: &Kernels, method: Method, lens: &[u32]) -> Line {
    let top = glm5();
    let host = Host::new(Pattern::Random, lens, 77);
    let (table, requests) = shuffled_pages(&host.lens);
    let pages = RowPages {
        table: &table,
        requests: &requests,
    };
    let rows = host.rows();
    let got = k.run(method, DEBUG, &rows, Some(&pages));
    let (result, ok) = match got.map(|g| check_output(&rows, top, Some(&pages), &g)) {
        Ok(Ok(())) => ("exact".to_string(), true),
        Ok(Err(e)) => (format!("FAIL {e}"), false),
        Err(e) => (format!("error: {e}"), false),
    };
    Line {
        case: format!("{} page-table slots, rows {lens:?}", method.name()),
        result,
        ok,
    }
}

/// A page table whose requests' pages are spread over a cache without order (rows 2i and 2i + 1
/// share request i, as verify rows do), and each row's request.
fn shuffled_pages(lens: &[u32]) -> (PageTable, Vec<u32>) {
    let requests: Vec<u32> = (0..lens.len() as u32).map(|r| r / 2).collect();
    let per_request = lens
        .iter()
        .map(|&l| l.div_ceil(PAGE_TOKENS))
        .max()
        .unwrap_or(1);
    let count = requests.last().map_or(0, |&r| r + 1);
    let total = count * per_request;
    let table: Vec<Vec<u32>> = (0..count)
        .map(|r| {
            (0..per_request)
                .map(|p| ((r * per_request + p) * 7919) % total)
                .collect()
        })
        .collect();
    (PageTable::new(&table).unwrap(), requests)
}

/// A NaN among the keys of row 1 must be reported (NaN past a row's length never is: every case
/// above has it in the padding): a positive NaN in a row the one CTA streams, a negative one in a
/// row it keeps in LDS, and one in a row the registers kernel holds (each kernel checks NaN where
/// it loads the keys).
fn nan_case(k: &Kernels) -> Vec<Line> {
    let cases = [
        (&[3000, 131072, 100][..], 70_000, f32::NAN),
        (&[100, 20000, 3000][..], 12_345, f32::from_bits(0xffc0_0001)),
        (&[100, 16000, 3000][..], 12_345, f32::from_bits(0xffc0_0001)),
    ];
    cases
        .into_iter()
        .flat_map(|(lens, pos, nan)| {
            let mut host = Host::new(Pattern::Random, lens, 5);
            let at = host.stride + pos;
            host.scores[at] = nan;
            METHODS
                .into_iter()
                .filter(|&m| takes(m, lens))
                .map(|method| {
                    let got = k.run(method, DEBUG, &host.rows(), None);
                    let ok = matches!(&got, Err(GpuError::Flagged { row: 1, what }) if what.contains("NaN"));
                    Line {
                        case: format!(
                            "{} NaN ({:#010x}) at row 1 of {lens:?} position {pos} is reported",
                            method.name(),
                            nan.to_bits()
                        ),
                        result: match got {
                            Ok(_) => "not reported".into(),
                            Err(e) => e.to_string(),
                        },
                        ok,
                    }
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The checker rejects each corruption of a kernel's correct output.
fn negative_controls(k: &Kernels) -> Vec<Line> {
    let top = glm5();
    let host = Host::new(Pattern::Ties, &[8192, 32768, 131072, 300_000], 9);
    let rows = host.rows();
    let got = match k.run(Method::MultiSlice, DEBUG, &rows, None) {
        Ok(g) => g,
        Err(e) => {
            return vec![Line {
                case: "negative controls".into(),
                result: format!("error: {e}"),
                ok: false,
            }]
        }
    };
    let row = 2usize;
    let k = glm5().k() as usize;
    let span = row * k..(row + 1) * k;
    let mut lines = Vec::new();
    let mut push = |name: &str, applied: bool, outcome: Result<(), CheckError>| {
        let ok = applied && outcome.is_err();
        lines.push(Line {
            case: format!("negative control: {name}"),
            result: match outcome {
                Err(e) => format!("fails as it must: {e}"),
                Ok(()) => format!("PASSED the checker (applied: {applied})"),
            },
            ok,
        });
    };
    let mut replaced = got.clone();
    let applied =
        controls::replace_with_best_unselected(&mut replaced[span.clone()], rows.row(row));
    push(
        "a slot replaced by the best unselected key",
        applied,
        check_output(&rows, top, None, &replaced),
    );
    let mut swapped = got.clone();
    let applied = controls::swap_two(&mut swapped[span]);
    push(
        "two entries swapped",
        applied,
        check_output(&rows, top, None, &swapped),
    );
    let mut flipped = host.scores.clone();
    let start = row * host.stride;
    let bit = controls::flip_score_bit(&mut flipped[start..start + host.lens[row] as usize], top);
    let corrupt = Rows {
        scores: &flipped,
        ..rows
    };
    push(
        &format!("one score's bit flipped ({bit:?})"),
        bit.is_some(),
        check_output(&corrupt, top, None, &got),
    );
    lines
}
