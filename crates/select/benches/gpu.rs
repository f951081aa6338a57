//! The select stage on the GPU in the fused CTA shape (512 threads, one CTA a multiprocessor, the
//! task-list entry): rows 1 / 4 / 8 at 8K, 32K, 128K, 512K and 1M keys (random scores) by the
//! multi-slice and one-CTA kinds, the registers kind at 8K and 16K, each launch checked once
//! against the reference, then timed as graph replays (one epoch node and R selects per graph; the
//! median replay over R), with the floor of reading the scores at the copy bandwidth measured in
//! the same run; then the launch floor (rows of k keys); then the phases of one select as stamped
//! by a `SEL_TRACE` build (the CTA of row 0 that writes the list, 4 rows). The one-CTA and
//! registers kinds are timed twice, "on/off": launches overlapping the one before them
//! (`Selector::set_overlapping`, their default), then plain launches.
//! Prints "skipped" without a GPU. torch.topk on the same shapes:
//! `python3 tools/bench/select_torch.py`.
//!
//! `cargo bench -p select --bench gpu`. To time fewer cases, set comma lists:
//! `SELECT_BENCH_PARTS` (multi-slice, one-cta, registers, short-rows, trace),
//! `SELECT_BENCH_KEYS` (8192, ..., 1048576; registers: 8192, 16384), `SELECT_BENCH_ROWS` (1, 4, 8);
//! an unset variable takes every case.
//! With `MONO_BENCH_JSON=file` the figures of the exact cases are also appended there as records
//! (`device::report`): table "select" (with its floor) and "select, launch floor" (the short
//! rows); the phases are printed only. A case that is not exact, or not timed, is printed but not
//! recorded. Such a case, a traced select that is not exact and a build that fails each make the
//! run exit non-zero once everything is printed, so that a run short of records says so.

use device::report::{rows_case, Figure, Reporter};
use device::timing::median;
use device::{BenchFilter, Device, Stream};
use mailbox::gpu::Variant;
use model::Preset;
use select::cases::{self, Pattern};
use select::gpu::{Batch, Method, Selector, Shape};
use select::layout::TopK;
use select::reference::{select_rows, Rows};

/// k of GLM-5, from its preset.
fn glm5() -> TopK {
    TopK::preset(Preset::Glm5).unwrap()
}

const LENS: [u32; 5] = [8192, 32768, 131072, 524_288, 1 << 20];
/// Rows the registers kind holds (keys a thread: as few as hold the row).
const REG_LENS: [u32; 2] = [8192, 16384];
const ROWS: [usize; 3] = [1, 4, 8];
const REPLAYS: usize = 15;
/// The H200's SM clock in the runs of BENCHMARKS.md (nvidia-smi), to put trace cycles in us.
const H200_SM_MHZ: f64 = 1980.0;

const PARTS: [&str; 5] = ["multi-slice", "one-cta", "registers", "short-rows", "trace"];

/// The cases the `SELECT_BENCH_*` variables pick.
struct Picked {
    parts: BenchFilter,
    keys: BenchFilter,
    rows: BenchFilter,
}

impl Picked {
    fn from_env() -> Result<Self, String> {
        let names = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>();
        let mut keys: Vec<u32> = LENS.iter().chain(&REG_LENS).copied().collect();
        keys.sort_unstable();
        keys.dedup();
        let rows: Vec<u32> = ROWS.iter().map(|&r| r as u32).collect();
        Ok(Self {
            parts: BenchFilter::from_env("SELECT_BENCH_PARTS", &PARTS.map(String::from))?,
            keys: BenchFilter::from_env("SELECT_BENCH_KEYS", &names(&keys))?,
            rows: BenchFilter::from_env("SELECT_BENCH_ROWS", &names(&rows))?,
        })
    }

    fn case(&self, part: &str, len: u32, rows: usize) -> bool {
        self.parts.allows(part)
            && self.keys.allows(&len.to_string())
            && self.rows.allows(&rows.to_string())
    }

    /// Some row count of `part` at `len` keys is picked: the kernel is worth building.
    fn any_rows(&self, part: &str, len: u32) -> bool {
        ROWS.iter().any(|&rows| self.case(part, len, rows))
    }
}

/// Microseconds per select: the median over replays of a graph of `repeats` selects.
fn time(
    dev: &Device,
    stream: &Stream,
    batch: &Batch,
    sel: &Selector,
    repeats: u32,
) -> Result<f64, String> {
    let text = |e: &dyn std::fmt::Display| e.to_string();
    stream.begin_capture().map_err(|e| text(&e))?;
    let captured = batch.enqueue(sel, stream, repeats);
    let graph = stream.end_capture().map_err(|e| text(&e))?;
    captured.map_err(|e| text(&e))?;
    let replay = || -> device::Result<f32> {
        let (t0, t1) = (dev.timer()?, dev.timer()?);
        t0.record(stream)?;
        graph.launch(stream)?;
        t1.record(stream)?;
        t1.sync()?;
        t0.elapsed_ms(&t1)
    };
    graph.upload(stream).map_err(|e| text(&e))?;
    replay().map_err(|e| text(&e))?;
    let mut us = Vec::with_capacity(REPLAYS);
    for _ in 0..REPLAYS {
        us.push(replay().map_err(|e| text(&e))? as f64 * 1000.0 / repeats as f64);
    }
    Ok(median(&us))
}

/// Microseconds per select of a case that was exact and timed.
struct Timed {
    /// Launches overlapping the one before; `None` for a kind that does not overlap.
    overlapped: Option<f64>,
    plain: f64,
}

/// One case's cell of the table, and its times where it was exact and every timing came back.
struct Measured {
    cell: String,
    timed: Option<Timed>,
}

impl Measured {
    fn failed(cell: String) -> Self {
        Self { cell, timed: None }
    }
}

/// The records of one measured case: overlapped launches (where the kind overlaps), then plain.
fn figures(table: &str, sel: &Selector, rows: usize, len: u32, t: &Timed) -> Vec<Figure> {
    let case = rows_case(u64::from(len), rows as u32);
    let kind = match sel.method() {
        Method::Registers => "registers kind",
        Method::OneCta => "one-CTA kind",
        Method::MultiSlice => "slices (a gang a row)",
    };
    let threads = sel.shape().threads;
    let figure = |launches: &str, us: f64| {
        let what = format!("{kind}, task-list entry ({threads} threads), {launches}");
        Figure::new(table, &case, &what, us, "us")
    };
    t.overlapped
        .map(|us| figure("overlapped", us))
        .into_iter()
        .chain([figure("plain", t.plain)])
        .collect()
}

/// One case: built, checked once against the reference, timed.
fn case(dev: &Device, stream: &Stream, sel: &mut Selector, rows: usize, len: u32) -> Measured {
    let top = glm5();
    let lens = vec![len; rows];
    let scores = cases::rows(
        Pattern::Random,
        &lens,
        len as usize,
        top,
        rows as u64 + len as u64,
    );
    let r = Rows {
        scores: &scores,
        stride: len as usize,
        lens: &lens,
    };
    let batch = match Batch::upload(dev, sel, &r, None) {
        Ok(b) => b,
        Err(e) => return Measured::failed(format!("upload failed: {e}")),
    };
    let checked = batch
        .enqueue(sel, stream, 1)
        .map_err(|e| e.to_string())
        .and_then(|()| stream.sync().map_err(|e| e.to_string()))
        .and_then(|()| batch.read(sel).map_err(|e| e.to_string()))
        .map(|got| {
            if got == select_rows(&r, top, None).expect("reference") {
                "exact"
            } else {
                "MISMATCH"
            }
        });
    // Long one-CTA selects take milliseconds: fewer per graph.
    let repeats = if sel.method() == Method::OneCta && len > 131072 {
        4
    } else {
        20
    };
    if !sel.overlapping() {
        return match (time(dev, stream, &batch, sel, repeats), checked) {
            (Ok(us), Ok(c)) => Measured {
                cell: format!("{us:>13.2} {c:<8}"),
                timed: (c == "exact").then_some(Timed {
                    overlapped: None,
                    plain: us,
                }),
            },
            (us, c) => Measured::failed(format!("failed: {us:?} {c:?}")),
        };
    }
    // Launches that overlap the one before (the default), then plain ones, in the same call.
    let overlapped = time(dev, stream, &batch, sel, repeats);
    sel.set_overlapping(false);
    let plain = time(dev, stream, &batch, sel, repeats);
    sel.set_overlapping(true);
    match (overlapped, plain, checked) {
        (Ok(on), Ok(off), Ok(c)) => Measured {
            cell: format!("{:>13} {c:<8}", format!("{on:.2}/{off:.2}")),
            timed: (c == "exact").then_some(Timed {
                overlapped: Some(on),
                plain: off,
            }),
        },
        (on, off, c) => Measured::failed(format!("failed: {on:?} {off:?} {c:?}")),
    }
}

/// Builds the production-variant selector of `method` for rows of at most `len` keys.
fn build(dev: &Device, method: Method, len: u32, trace: bool) -> Option<Selector> {
    let shared = dev.info().max_shared_per_block;
    Shape::for_rows_within(method, glm5(), len, shared)
        .and_then(|shape| {
            let shape = Shape { trace, ..shape };
            Selector::build(dev, method, shape, Variant::default())
        })
        .map_err(|e| println!("{} {len}: build failed: {e}", method.name()))
        .ok()
}

fn main() -> Result<(), String> {
    let picked = Picked::from_env()?;
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("skipped: {e}");
            return Ok(());
        }
    };
    let stream = dev.new_stream().expect("stream");
    let bytes_per_us = device::probes::copy_bandwidth(&dev, 1 << 30)
        .expect("copy bandwidth")
        .bytes_per_s
        / 1e6;
    println!(
        "copy bandwidth: {:.2} TB/s (read + written)",
        bytes_per_us / 1e6
    );
    let report = Reporter::from_env(&dev.info().name);
    let floor_how = format!(
        "the scores read once at the copy bandwidth measured in the same call ({:.2} TB/s)",
        bytes_per_us / 1e6
    );
    let write = |figures: Vec<Figure>| -> Result<(), String> {
        figures
            .iter()
            .try_for_each(|f| report.write(f))
            .map_err(|e| e.to_string())
    };
    let mut failed = 0;
    let mut table = Vec::new();
    let cases = [Method::Registers, Method::OneCta, Method::MultiSlice]
        .into_iter()
        .flat_map(|m| {
            let lens: &[u32] = if m == Method::Registers {
                &REG_LENS
            } else {
                &LENS
            };
            lens.iter().map(move |&len| (m, len))
        })
        .filter(|&(m, len)| picked.any_rows(m.name(), len));
    for (method, len) in cases {
        let Some(mut sel) = build(&dev, method, len, false) else {
            failed += 1;
            continue;
        };
        for rows in ROWS
            .into_iter()
            .filter(|&r| picked.case(method.name(), len, r))
        {
            let m = case(&dev, &stream, &mut sel, rows, len);
            let floor = (rows as f64 * len as f64 * 4.0) / bytes_per_us;
            match &m.timed {
                Some(t) => write(
                    figures("select", &sel, rows, len, t)
                        .into_iter()
                        .map(|f| f.floor(floor, &floor_how))
                        .collect(),
                )?,
                None => failed += 1,
            }
            let line = format!(
                "{:<12} {rows:>4} {len:>8} {} {floor:>9.2}",
                method.name(),
                m.cell
            );
            eprintln!("{line}");
            table.push(line);
        }
    }
    // The fixed cost: rows of exactly k keys take the short-row path (the multi-slice kind: one
    // slice a row, in the graph's cooperative launch; the registers kind: one CTA a row, in a
    // plain launch), so a launch with almost no work in it.
    let short_rows = picked.parts.allows("short-rows");
    for method in [Method::MultiSlice, Method::Registers]
        .into_iter()
        .filter(|_| short_rows)
    {
        let Some(mut sel) = build(&dev, method, 8192, false) else {
            failed += 1;
            continue;
        };
        for rows in ROWS
            .into_iter()
            .filter(|r| picked.rows.allows(&r.to_string()))
        {
            let k = glm5().k();
            let m = case(&dev, &stream, &mut sel, rows, k);
            match &m.timed {
                Some(t) => write(figures("select, launch floor", &sel, rows, k, t))?,
                None => failed += 1,
            }
            table.push(format!(
                "{:<12} {rows:>4} {k:>8} {} (launch floor, {})",
                "short-rows",
                m.cell,
                method.name()
            ));
        }
    }
    let traces: Vec<(String, bool)> = [
        (Method::Registers, 8192),
        (Method::OneCta, 8192),
        (Method::MultiSlice, 131072),
    ]
    .into_iter()
    .filter(|&(_, len)| picked.parts.allows("trace") && picked.keys.allows(&len.to_string()))
    .map(|(method, len)| trace(&dev, &stream, method, len))
    .collect();
    println!(
        "\n{:<12} {:>4} {:>8} {:>13} {:<8} {:>9}",
        "kind", "rows", "keys", "us (on/off)", "check", "floor us"
    );
    for l in table {
        println!("{l}");
    }
    println!(
        "\nphases of one select, 4 rows (SEL_TRACE build, one launch): SM cycles since the CTA \
         began (us at {H200_SM_MHZ} MHz, the H200's SM clock in our runs)"
    );
    for (line, exact) in traces {
        println!("{line}");
        failed += usize::from(!exact);
    }
    if failed > 0 {
        return Err(format!(
            "{failed} failed (above): a build, or a case not exact or not timed"
        ));
    }
    Ok(())
}

/// One select of 4 random rows by a `SEL_TRACE` build of `shape`, warm (a select before it): its
/// marks, and whether it was exact.
fn trace(dev: &Device, stream: &Stream, method: Method, len: u32) -> (String, bool) {
    let name = format!("{} 4 x {len}", method.name());
    let run = || -> Result<(String, bool), String> {
        let text = |e: &dyn std::fmt::Display| e.to_string();
        let sel = build(dev, method, len, true).ok_or("no build")?;
        let lens = vec![len; 4];
        let scores = cases::rows(Pattern::Random, &lens, len as usize, glm5(), 99);
        let r = Rows {
            scores: &scores,
            stride: len as usize,
            lens: &lens,
        };
        let batch = Batch::upload(dev, &sel, &r, None).map_err(|e| text(&e))?;
        let mut got = Vec::new();
        for _ in 0..2 {
            batch.clear().map_err(|e| text(&e))?;
            batch.enqueue(&sel, stream, 1).map_err(|e| text(&e))?;
            stream.sync().map_err(|e| text(&e))?;
            got = batch.read(&sel).map_err(|e| text(&e))?;
        }
        let exact = got == select_rows(&r, glm5(), None).expect("reference");
        let marks = batch.trace().map_err(|e| text(&e))?;
        let phases: Vec<String> = marks
            .iter()
            .skip(1)
            .map(|(phase, cycles)| {
                let us = *cycles as f64 / H200_SM_MHZ;
                format!("{phase} {cycles} ({us:.2} us)")
            })
            .collect();
        let line = format!(
            "{} | {}",
            if exact { "exact" } else { "MISMATCH" },
            phases.join(" | ")
        );
        Ok((line, exact))
    };
    match run() {
        Ok((line, exact)) => (format!("{name:<24} {line}"), exact),
        Err(e) => (format!("{name:<24} failed: {e}"), false),
    }
}
