//! `mono trace` of the tiny step on the host backend (the step's kernels on CPU threads, traced
//! builds): every task of every launch has its record, times run forward within each CTA and
//! launches follow one another, the Chrome JSON parses with an event per task and a process per
//! launch, the pictures have a row per CTA; a trace missing one record, or with two launches out
//! of order, is rejected, naming the launch. With the tiles' stamps (`--tiles`): every linear task
//! of each kind's last launch has its milestones, in the order the tile passes them; a row with two
//! of them swapped is rejected.
//!
//! Needs g++ with C++20, so ignored:
//! `cargo test --release -p executor --test trace_host -- --ignored --nocapture`

use device::{BackendChoice, Device};
use executor::step::cli::{trace_step, StepShape};
use executor::step::graph::TracedLaunch;
use executor::trace::step::decode_step;
use executor::trace::tiles::TileRow;
use mailbox::gpu::{DebugBound, Variant};
use mailbox::trace::RECORD_WORDS;
use model::{ModelConfig, WeightFormat};

#[test]
#[ignore = "needs g++ (host emulation)"]
fn every_task_of_the_tiny_step_is_traced_and_drawn() {
    let dev = Device::open_with(0, BackendChoice::Host).expect("the host backend");
    let cfg = ModelConfig::preset("tiny").unwrap();
    let shape = StepShape {
        preset: "tiny".into(),
        seed: 5,
        requests: 1,
        rows: 1,
        context: 20,
        tp: 1,
    };
    // Debug builds: a wait that gives up names its task instead of hanging the test. On CPU
    // threads a wait gives up once the launcher sees the launch make no progress; the count is a
    // backstop only: polls there sleep up to 200 us each, so 2^20 of them gave up after a few
    // minutes on a loaded machine where a launch takes longer.
    let variant = Variant {
        debug: Some(DebugBound {
            poll_limit: 1 << 26,
            trap: false,
        }),
        ..Default::default()
    };
    let out = std::env::temp_dir().join(format!("mono-trace-step-{}", std::process::id()));
    let t = trace_step(&dev, &shape, WeightFormat::Bf16, variant, &out, true, None).unwrap();
    eprint!("{}", t.summary);

    assert_eq!(t.launches.len(), cfg.num_hidden_layers + 1);
    let ctas = dev.info().multiprocessors;
    let mut tasks = 0;
    for (raw, l) in t.raw.iter().zip(&t.launches) {
        assert_eq!(
            l.trace.spans.len(),
            raw.records.table.tasks.len(),
            "{}",
            l.name
        );
        assert_eq!(l.trace.ctas, ctas, "{}", l.name);
        for pair in l.trace.spans.windows(2).filter(|p| p[0].cta == p[1].cta) {
            assert!(pair[0].end_ns <= pair[1].start_ns, "{}", l.name);
        }
        assert!(l.trace.spans.iter().all(|s| s.start_ns <= s.end_ns));
        tasks += l.trace.spans.len();
    }
    let mut kinds: Vec<&str> = t.launches.iter().map(|l| l.kind.as_str()).collect();
    kinds.dedup();
    kinds.sort();
    kinds.dedup();
    assert!(kinds.len() >= 3, "{kinds:?}");
    for kind in &kinds {
        assert!(t.summary.contains(&format!("{kind}: ")), "{kind}");
    }

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&t.files.json).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let spans: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(spans.len(), tasks);
    // Every task named in words by its stage and kind.
    assert!(spans.iter().all(|e| {
        let name = e["name"].as_str().unwrap();
        !name.is_empty() && !name.starts_with("kind ")
    }));
    let processes = events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .count();
    assert_eq!(processes, t.launches.len());
    for path in [&t.files.svg, &t.files.kinds_svg] {
        let svg = std::fs::read_to_string(path).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches(r#"<rect class="row""#).count(),
            ctas as usize,
            "{}",
            path.display()
        );
    }
    check_tiles(&t.raw, &t.tiles).unwrap();
    let tsv = std::fs::read_to_string(t.tiles_tsv.as_ref().unwrap()).unwrap();
    assert_eq!(tsv.lines().count(), t.tiles.len() + 1);
    assert!(t
        .summary
        .contains("linear tiles of each kind's last launch"));
    std::fs::remove_dir_all(&out).unwrap();

    // Negative controls: a tile's milestones out of order, its slowest group's last batch after
    // its epilogue stored, one task's record unwritten, and two launches out of order.
    let mut swapped_tile = t.tiles.clone();
    let row = swapped_tile.iter_mut().find(|r| r.us[0] < r.us[5]).unwrap();
    row.us.swap(0, 5);
    let err = check_tiles(&t.raw, &swapped_tile).unwrap_err();
    assert!(err.contains("out of order"), "{err}");
    let mut late_slowest = t.tiles.clone();
    late_slowest[0].us[6] = late_slowest[0].us[4].map(|stored| stored + 1.0);
    let err = check_tiles(&t.raw, &late_slowest).unwrap_err();
    assert!(err.contains("out of order"), "{err}");
    let mut missing = t.raw.clone();
    let last = missing.len() - 1;
    let at = missing[last].records.table.tasks.len() / 2 * RECORD_WORDS;
    missing[last].records.words[at..at + RECORD_WORDS].fill(0);
    let err = decode_step(&missing).unwrap_err();
    assert!(
        err.contains("has no record") && err.contains(&t.raw[last].name),
        "{err}"
    );
    let mut swapped = t.raw.clone();
    swapped.swap(0, 1);
    let err = decode_step(&swapped).unwrap_err();
    assert!(err.contains("before"), "{err}");
}

/// Every linear task of each kind's last launch has its rows (a tiles task one, a pair of a used
/// slot two), each with its wait, x, last batch, store and publish noted, in that order.
fn check_tiles(raw: &[TracedLaunch], tiles: &[TileRow]) -> Result<(), String> {
    let mut kinds: Vec<&str> = Vec::new();
    for l in raw.iter().rev() {
        if kinds.contains(&l.kind.as_str()) {
            continue;
        }
        kinds.push(&l.kind);
        let ranges = l
            .records
            .table
            .tasks
            .iter()
            .filter(|task| task.kind == linear::layout::KIND_TILES)
            .count();
        let rows: Vec<_> = tiles.iter().filter(|r| r.launch == l.name).collect();
        let tiles = rows.iter().filter(|r| r.part == "tiles").count();
        if tiles != ranges {
            return Err(format!("{}: {tiles} tiles rows for {ranges} tasks", l.name));
        }
        if rows.iter().filter(|r| r.part == "gate/up").count()
            != rows.iter().filter(|r| r.part == "down").count()
        {
            return Err(format!("{}: a pair without both rows", l.name));
        }
    }
    if tiles.iter().any(|r| !kinds.contains(&r.kind.as_str())) {
        return Err("a row of no launch kind".into());
    }
    for r in tiles {
        // ready, x, last, stored, published and the slowest group's last: every range passes
        // them; first only where the leader's group has a batch.
        let noted: Vec<f64> = r.us[..6].iter().flatten().copied().collect();
        if [0, 1, 3, 4, 5, 6].iter().any(|&j| r.us[j].is_none()) {
            return Err(format!(
                "{} {}: a milestone missing: {:?}",
                r.task, r.part, r.us
            ));
        }
        // The slowest group's last batch: no sooner than the leader's group's, and before the
        // epilogue that waits on every group has stored.
        let (last, stored, slowest) = (r.us[3], r.us[4], r.us[6]);
        if noted.windows(2).any(|w| w[0] > w[1])
            || noted[0] < 0.0
            || slowest < last
            || slowest > stored
        {
            return Err(format!(
                "{} {}: milestones out of order: {:?}",
                r.task, r.part, r.us
            ));
        }
    }
    Ok(())
}
