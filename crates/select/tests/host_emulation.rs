//! The select stage's own source (`kernels/select.hip`, `select.h` and the headers it includes,
//! found through `-I kernels`) run on CPU threads through the host stand-in of the prelude
//! (`kernels/host/prelude.h` of the workspace) and a driver (`tests/host/`): the standalone entry's
//! task-list loop over the plan the host builds (`SelectPlan`), compared entry by entry with the
//! reference: wave sizes 32 and 64, every task kind, every pattern (masked rows included), page
//! tables, a build with many small slices, and one at production k and slicing. Then the hand-off:
//! select tasks that wait on a producer's completion box read the producer's fresh scores, and a
//! build whose tasks skip the wait reads the stale ones, which the check catches. This checks the
//! device code itself without a GPU (block barriers, ballots, shuffles, tagged-pair waits between
//! CTAs, the placement of gangs), but not the GPU's memory model or speed.
//! Needs g++ with C++20, and takes about a minute, so ignored:
//! `cargo test --release -p select --test host_emulation -- --ignored --nocapture`

use device::host::build_driver;
use mailbox::gpu::{DebugBound, Variant};
use mailbox::layout::{BoxRange, ScratchLayout};
use mailbox::{Limits, Stage, Task};
use model::paging::{PageTable, PAGE_TOKENS};
use select::cases::{self, Pattern};
use select::check::check_output;
use select::gpu::Shape;
use select::layout::{SelectBoxes, SelectKind, SelectPlan, Slicing, TopK, SLICE_TARGET};
use select::reference::{select_row, RowPages, Rows};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The launcher around the stage's entry (`tests/host/driver.cpp`).
const DRIVER: &str = include_str!("host/driver.cpp");

const KINDS: [SelectKind; 3] = [SelectKind::OneCta, SelectKind::Slice, SelectKind::Registers];

struct Build {
    name: &'static str,
    wave: u32,
    /// `MONO_CTA_THREADS`.
    threads: u32,
    k: u32,
    /// The plan's slice target: small in the first builds, so that short rows take several slices.
    slice_target: u32,
    slice_keys: u32,
    /// `SEL_REG_KEYS`: the registers task runs the batches whose rows all fit `threads * reg_keys`.
    reg_keys: u32,
    /// CTAs of a launch: fewer than the tasks, so lists hold several and gangs take turns.
    ctas: u32,
    /// Row lengths of the batches it runs.
    batches: &'static [&'static [u32]],
}

/// What each build covers (every pattern of `select::cases`, every kind that holds its rows, with
/// and without a page table). The work is kept to about a minute of a 2-core machine: a launch's
/// cost grows with its threads (the CTAs' polls yield to each other), so builds use few CTAs.
/// - wave32: 32-lane waves; rows of no keys, k, k + 1 and of 1 to 3 slices; 5 CTAs for up to
///   6 tasks, so a CTA's list holds several tasks.
/// - wave64: 64-lane waves (gfx950's), 128 threads; the registers kind over 3000 keys, 2 slices.
/// - many-slices: slices of about 64 keys, so the plan's spread rule cuts both rows into gangs of
///   6 (the most a row gets from 12 CTAs), each gathering every member's histograms and
///   candidates.
/// - k2048: GLM-5's k and production slicing: rows of k, k + 1, and 20000 keys in 3 slices.
/// - regs20: GLM-5's k with the production build's 20 keys a registers thread (not a power of
///   two), rows of k to the 2560 keys 128 threads hold.
const BUILDS: [Build; 5] = [
    Build {
        name: "wave32",
        wave: 32,
        threads: 64,
        k: 16,
        slice_target: 1024,
        slice_keys: 2048,
        reg_keys: 32,
        ctas: 5,
        batches: &[&[2000, 16, 17, 0], &[5133, 1025, 257, 5]],
    },
    Build {
        name: "wave64",
        wave: 64,
        threads: 128,
        k: 16,
        slice_target: 1024,
        slice_keys: 2048,
        reg_keys: 32,
        ctas: 4,
        batches: &[&[3000, 16, 17, 0]],
    },
    Build {
        name: "many-slices",
        wave: 32,
        threads: 64,
        k: 16,
        slice_target: 64,
        slice_keys: 2048,
        reg_keys: 32,
        ctas: 12,
        batches: &[&[3000, 1100]],
    },
    Build {
        name: "k2048",
        wave: 32,
        // A thread places at most 64 keys: slices of SLICE_TARGET keys need 128 threads.
        threads: 128,
        k: 2048,
        slice_target: SLICE_TARGET,
        slice_keys: SLICE_TARGET,
        reg_keys: 32,
        ctas: 4,
        batches: &[&[20000, 3000, 2049, 2048]],
    },
    Build {
        name: "regs20",
        wave: 32,
        threads: 128,
        k: 2048,
        slice_target: SLICE_TARGET,
        slice_keys: SLICE_TARGET,
        reg_keys: 20,
        ctas: 4,
        batches: &[&[2560, 2049, 2048, 2100]],
    },
];

impl Build {
    fn top(&self) -> TopK {
        TopK::new(self.k).unwrap()
    }

    fn slicing(&self) -> Slicing {
        Slicing {
            target: self.slice_target,
            keys: self.slice_keys,
        }
    }

    fn holds_in_registers(&self, lens: &[u32]) -> bool {
        lens.iter().all(|&len| len <= self.threads * self.reg_keys)
    }
}

/// The driver built for `b` from the stage's own source and defines (`select::gpu::source` of
/// the build's shape); `fault`: `SEL_FAULT`; `debug`: polls bounded (`MBX_DEBUG`, as every check
/// but the hang detector's control runs).
fn compile(b: &Build, dir: &Path, fault: u32, debug: bool) -> PathBuf {
    let shape = Shape {
        top: b.top(),
        threads: b.threads,
        slice_keys: b.slice_keys,
        reg_keys: b.reg_keys,
        trace: false,
    };
    let variant = Variant {
        debug: debug.then_some(DebugBound {
            poll_limit: 20_000_000,
            trap: false,
        }),
        ..Variant::default()
    };
    let src = select::gpu::source(shape, variant)
        .define("MONO_WAVE", b.wave)
        .define("SEL_FAULT", fault);
    std::fs::create_dir_all(dir).unwrap();
    let exe = dir.join(format!("select-{}-{fault}-{debug}", b.name));
    build_driver(&src, ("driver.cpp", DRIVER), &exe).unwrap_or_else(|e| panic!("{e}"));
    exe
}

/// One launch: its task lists, the scratch, and (for the hand-off) the fresh scores a producer
/// writes after `delay_ms`.
struct Launch<'a> {
    lists: Vec<Vec<Task>>,
    scratch: u32,
    boxes: SelectBoxes,
    rows: &'a Rows<'a>,
    pages: Option<&'a RowPages<'a>>,
    fresh: Option<&'a [f32]>,
    delay_ms: u32,
}

/// The plan of `kind` for the rows, checked by the placement rule, on the build's CTAs.
fn planned<'a>(
    b: &Build,
    kind: SelectKind,
    rows: &'a Rows<'a>,
    pages: Option<&'a RowPages<'a>>,
) -> Launch<'a> {
    let mut builder = ScratchLayout::builder();
    let boxes = SelectBoxes::add(&mut builder, "sel", rows.count() as u32, b.top()).unwrap();
    let scratch = builder.build().boxes();
    let plan = SelectPlan::new(rows.lens, kind, b.top(), b.ctas, b.slicing(), 0).unwrap();
    let placement = plan.placement();
    placement
        .validate(Limits {
            max_resident: b.ctas,
            scratch_boxes: scratch,
        })
        .unwrap();
    Launch {
        lists: placement.lists().to_vec(),
        scratch,
        boxes,
        rows,
        pages,
        fresh: None,
        delay_ms: 0,
    }
}

/// Runs a launch: the error words and the lists.
fn run(exe: &Path, l: &Launch) -> Result<(Vec<u32>, Vec<i32>), String> {
    let rows = l.rows;
    let tasks: Vec<Task> = l.lists.iter().flatten().copied().collect();
    let pages = match l.pages {
        Some(p) => Some(p.device_form(rows.lens).map_err(|e| e.to_string())?),
        None => None,
    };
    let mut words = vec![
        rows.count() as u32,
        rows.stride as u32,
        pages.as_ref().map_or(0, |p| p.list.len() as u32),
        l.lists.len() as u32,
        tasks.len() as u32,
        l.scratch,
        l.boxes.hist.offset(),
        l.boxes.cand.offset(),
        l.boxes.cand.stride(),
        l.fresh.is_some() as u32,
        l.delay_ms,
        pages.as_ref().map_or(0, |p| p.requests.len() as u32),
    ];
    let mut end = 0;
    words.push(0);
    for list in &l.lists {
        end += list.len() as u32;
        words.push(end);
    }
    words.extend(
        tasks
            .iter()
            .flat_map(|t| bytemuck::cast::<Task, [u32; 16]>(*t)),
    );
    words.extend(rows.lens);
    words.extend(
        rows.scores[..rows.count() * rows.stride]
            .iter()
            .map(|s| s.to_bits()),
    );
    if let Some(fresh) = l.fresh {
        words.extend(fresh.iter().map(|s| s.to_bits()));
    }
    if let Some(p) = &pages {
        words.extend(&p.list);
        words.extend(bytemuck::cast_slice::<_, u32>(&p.requests));
        words.extend(bytemuck::cast_slice::<_, u32>(&p.rows));
    }
    let (input, output) = (exe.with_extension("input"), exe.with_extension("output"));
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    std::fs::write(&input, bytes).unwrap();
    let out = Command::new(exe).arg(&input).arg(&output).output().unwrap();
    if !out.status.success() {
        let what = match out.status.code() {
            Some(3) => "the launch hung (a wait that never ends)".to_string(),
            code => format!("status {code:?}"),
        };
        return Err(format!("{what}: {}", String::from_utf8_lossy(&out.stderr)));
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

/// The launch's lists checked against the reference of `rows` (errors flagged fail it too).
fn checked(exe: &Path, l: &Launch, top: TopK) -> Result<(), String> {
    let (flags, out) = run(exe, l)?;
    if flags.iter().any(|&f| f != 0) {
        return Err(format!("flags {flags:?}"));
    }
    check_output(l.rows, top, l.pages, &out).map_err(|e| e.to_string())
}

#[test]
#[ignore = "slow; needs g++ with C++20"]
fn kernel_source_on_cpu_threads_matches_the_reference() {
    let dir = std::env::temp_dir().join(format!("select-host-{}", std::process::id()));
    let mut failures = Vec::new();
    let mut runs = 0;
    // Where the rows that the one CTA keeps in LDS (wide digits) stopped, and the others.
    let mut lds_stops = BTreeSet::new();
    let mut other_stops = BTreeSet::new();
    let mut reg_stops = BTreeSet::new();
    for b in &BUILDS {
        let exe = compile(b, &dir, 0, true);
        let top = b.top();
        for (i, lens) in b.batches.iter().enumerate() {
            for (p, pattern) in Pattern::ALL.into_iter().enumerate() {
                let stride = (*lens.iter().max().unwrap() as usize + 5).div_ceil(4) * 4;
                let scores = cases::rows(pattern, lens, stride, top, (i * 32 + p) as u64);
                let rows = Rows {
                    scores: &scores,
                    stride,
                    lens,
                };
                // A request a row, in reverse order after a request of no row (so that a row's
                // request and its pages' offset differ from the row), its pages spread over the
                // cache out of order.
                let per_row = (stride as u32).div_ceil(PAGE_TOKENS);
                let n = lens.len() as u32;
                let total = (n + 1) * per_row;
                let table: Vec<Vec<u32>> = (0..=n)
                    .map(|q| {
                        (0..per_row)
                            .map(|p| ((q * per_row + p) * 37) % total + 5)
                            .collect()
                    })
                    .collect();
                let table = PageTable::new(&table).unwrap();
                let requests: Vec<u32> = (0..n).map(|r| n - r).collect();
                let pages = RowPages {
                    table: &table,
                    requests: &requests,
                };
                let pages = (p % 2 == 1).then_some(&pages);
                let in_regs = b.holds_in_registers(lens);
                for (r, &len) in lens.iter().enumerate() {
                    let Some(t) = select_row(rows.row(r), top).unwrap().threshold else {
                        continue;
                    };
                    if in_regs {
                        reg_stops.insert(t.prefix_bits);
                    }
                    if len <= b.slice_keys {
                        &mut lds_stops
                    } else {
                        &mut other_stops
                    }
                    .insert(t.prefix_bits);
                }
                for kind in KINDS {
                    if kind == SelectKind::Registers && !in_regs {
                        continue;
                    }
                    runs += 1;
                    if let Err(e) = checked(&exe, &planned(b, kind, &rows, pages), top) {
                        let case = format!("{} {kind:?} {} {lens:?}", b.name, pattern.name());
                        eprintln!("{case}: {e}");
                        failures.push(case);
                    }
                }
            }
        }
        // A negative NaN among the keys of a row the one CTA keeps in LDS (and that one or two
        // slices load) is flagged on that row alone, by every kind.
        let lens = [100, 1500];
        let stride = 1504;
        let mut scores = cases::rows(Pattern::Random, &lens, stride, b.top(), 77);
        scores[stride + 1234] = f32::from_bits(0xffc0_0001);
        let rows = Rows {
            scores: &scores,
            stride,
            lens: &lens,
        };
        for kind in KINDS {
            runs += 1;
            let flags = run(&exe, &planned(b, kind, &rows, None)).map(|(flags, _)| flags);
            if flags != Ok(vec![0, 0, 0, 0, 1, 0, 0, 0]) {
                eprintln!("{} {kind:?}: NaN in row 1: {flags:?}", b.name);
                failures.push(format!("{} {kind:?} NaN", b.name));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{runs} emulated launches, {} failed", failures.len());
    eprintln!(
        "stops: rows in the one CTA's LDS {lds_stops:?}, longer rows {other_stops:?}, rows the \
         registers task took {reg_stops:?}"
    );
    assert!(failures.is_empty(), "{failures:?}");
    // Every path ran: wide digits from 12 and from 24 bits, and ties placed at 32, on both sides
    // of the one CTA's LDS edge and in the registers task.
    let all: BTreeSet<u32> = [12, 24, 32].into();
    assert_eq!(
        (lds_stops, other_stops, reg_stops),
        (all.clone(), all.clone(), all)
    );
}

/// The launch of `kind` over `stale` scores with a producer a row, on CTAs of their own after the
/// select tasks' (so nothing orders a producer before a consumer but the wait), each writing its
/// row's fresh scores after `delay_ms` and putting one completion box, which the row's tasks wait on.
fn with_producers<'a>(
    b: &Build,
    kind: SelectKind,
    stale: &'a Rows<'a>,
    fresh: &'a [f32],
) -> Launch<'a> {
    let rows = stale.count() as u32;
    let mut builder = ScratchLayout::builder();
    let boxes = SelectBoxes::add(&mut builder, "sel", rows, b.top()).unwrap();
    let done = builder.region::<u32>("scored", rows, 1).unwrap();
    let scratch = builder.build().boxes();
    let mut plan = SelectPlan::new(stale.lens, kind, b.top(), b.ctas, b.slicing(), rows).unwrap();
    let ctas = plan.ctas();
    for t in plan.tasks_mut() {
        let input = done.slot(t.row).unwrap();
        t.task = Task::new(t.task.kind, t.task.order, t.task.out, &[input], t.task.args).unwrap();
    }
    let mut placement = plan.placement();
    for row in 0..rows {
        let out: BoxRange = done.slot(row).unwrap();
        let producer = Task::new(
            Task::kind_of(Stage::Synthetic, 1),
            row,
            out,
            &[],
            [row, 0, 0],
        );
        placement.lists_mut().push(vec![producer.unwrap()]);
    }
    placement
        .validate(Limits {
            max_resident: ctas + rows,
            scratch_boxes: scratch,
        })
        .unwrap();
    Launch {
        lists: placement.lists().to_vec(),
        scratch,
        boxes,
        rows: stale,
        pages: None,
        fresh: Some(fresh),
        delay_ms: 1000,
    }
}

/// Select tasks that wait on their inputs read what the producers wrote; a build whose tasks skip
/// the wait (`SEL_FAULT_SKIP_WAIT`) reads the stale scores, and the check of the fresh ones fails.
#[test]
#[ignore = "slow; needs g++ with C++20"]
fn select_tasks_wait_for_the_scores_they_read() {
    let dir = std::env::temp_dir().join(format!("select-handoff-{}", std::process::id()));
    let b = &BUILDS[0];
    let lens = [2000u32, 700];
    let stride = 2004;
    let stale = cases::rows(Pattern::Random, &lens, stride, b.top(), 1);
    let fresh = cases::rows(Pattern::Random, &lens, stride, b.top(), 2);
    let stale_rows = Rows {
        scores: &stale,
        stride,
        lens: &lens,
    };
    let fresh_rows = Rows {
        scores: &fresh,
        ..stale_rows
    };
    let waits = compile(b, &dir, 0, true);
    let skips = compile(b, &dir, 1, true);
    for kind in KINDS {
        let launch = with_producers(b, kind, &stale_rows, &fresh);
        let (flags, out) = run(&waits, &launch).unwrap();
        assert_eq!(flags, vec![0; 8], "{kind:?}");
        check_output(&fresh_rows, b.top(), None, &out)
            .unwrap_or_else(|e| panic!("{kind:?} waiting: {e}"));
        let (_, skipped) = run(&skips, &launch).unwrap();
        let caught = check_output(&fresh_rows, b.top(), None, &skipped);
        eprintln!("{kind:?}, the wait skipped: {caught:?}");
        assert!(
            caught.is_err(),
            "{kind:?}: a task that skipped its wait passed the check"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The hang detector's negative control: tasks waiting on a box that no task writes (the placement
/// rule bypassed), with unbounded polls, never end; the driver must stop the launch and say so
/// rather than pass or hang the test.
#[test]
#[ignore = "slow; needs g++ with C++20"]
fn a_wait_that_never_ends_is_reported_as_a_hang() {
    let dir = std::env::temp_dir().join(format!("select-hang-{}", std::process::id()));
    let b = &BUILDS[0];
    let lens = [2000u32];
    let scores = cases::rows(Pattern::Random, &lens, 2000, b.top(), 3);
    let rows = Rows {
        scores: &scores,
        stride: 2000,
        lens: &lens,
    };
    let mut launch = planned(b, SelectKind::Registers, &rows, None);
    let never = BoxRange::new(launch.scratch, 1);
    launch.scratch += 1;
    for t in launch.lists.iter_mut().flatten() {
        *t = Task::new(t.kind, t.order, t.out, &[never], t.args).unwrap();
    }
    let exe = compile(b, &dir, 0, false);
    let result = run(&exe, &launch);
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Err(e) => assert!(e.contains("hung"), "{e}"),
        Ok(out) => panic!("a launch that waits forever ended: {out:?}"),
    }
}
