use super::*;
use crate::layout::BoxRange;

/// Two CTAs: tasks 0 and 2 on CTA 0, task 1 (an indexer kind) on CTA 1.
fn table() -> TaskTable {
    let task = |kind, order| Task::new(kind, order, BoxRange::new(0, 0), &[], [0; 3]).unwrap();
    Placement::new(vec![
        vec![task(1, 0), task(2, 2)],
        vec![task(Task::kind_of(Stage::Indexer, 3), 1)],
    ])
    .table()
}

fn record(task: &Task, cta: u64, sm: u64, ns: (u64, u64), cycles: (u64, u64)) -> Record {
    Record {
        start_ns: ns.0,
        end_ns: ns.1,
        start_cycles: cycles.0,
        end_cycles: cycles.1,
        sm,
        cta,
        order_kind: ((task.order as u64) << 32) | task.kind as u64,
        mark: RECORD_MARK,
    }
}

fn words(records: &[Record]) -> Vec<u64> {
    bytemuck::cast_slice(records).to_vec()
}

fn good() -> (TaskTable, Vec<Record>) {
    let t = table();
    let records = vec![
        record(&t.tasks[0], 0, 7, (1000, 3000), (50, 2050)),
        record(&t.tasks[1], 0, 7, (3000, 4000), (2100, 3100)),
        record(&t.tasks[2], 1, 9, (1500, 5000), (10, 3510)),
    ];
    (t, records)
}

#[test]
fn decodes_a_hand_made_buffer() {
    let (t, records) = good();
    let trace = decode(&t, &words(&records)).unwrap();
    assert_eq!(trace.ctas, 2);
    let got: Vec<(u32, u32, u32, u32, u64, u64)> = trace
        .spans
        .iter()
        .map(|s| (s.cta, s.position, s.order, s.sm, s.start_ns, s.end_ns))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, 0, 0, 7, 1000, 3000),
            (0, 1, 2, 7, 3000, 4000),
            (1, 2, 1, 9, 1500, 5000)
        ]
    );
    assert_eq!(trace.spans[2].stage(), Some(Stage::Indexer));
    assert_eq!(trace.spans[2].own_kind(), 3);
    assert_eq!(kind_name(trace.spans[2].kind), "indexer 3");
    // Zeroed records past the table (a buffer longer than the launch needed) are not spans.
    let mut longer = words(&records);
    longer.extend([0; RECORD_WORDS]);
    assert_eq!(decode(&t, &longer).unwrap(), trace);
}

#[test]
fn times_on_either_clock() {
    let (t, records) = good();
    let trace = decode(&t, &words(&records)).unwrap();
    assert_eq!(
        trace.times(TimeBase::Timer),
        vec![(0.0, 2000.0), (2000.0, 3000.0), (500.0, 4000.0)]
    );
    // 2 GHz: CTA 0 starts at 1000 ns, then 2000 cycles = 1000 ns; CTA 1 at 1500 ns, 3500 cycles.
    let clock = CycleClock::from_khz(2_000_000).unwrap();
    assert_eq!(
        trace.times(TimeBase::Cycles(clock)),
        vec![(0.0, 1000.0), (1025.0, 1525.0), (500.0, 2250.0)]
    );
    assert_eq!(CycleClock::from_khz(0), None);
}

#[test]
fn every_stage_has_its_bits() {
    for stage in Stage::ALL {
        assert_eq!(Stage::from_bits(stage as u32), Some(stage));
    }
    assert_eq!(Stage::from_bits(Stage::ALL.len() as u32), None);
    assert_eq!(kind_name(99 << STAGE_SHIFT), "kind 0x6300");
}

fn timeline() -> Timeline {
    let (t, records) = good();
    let trace = decode(&t, &words(&records)).unwrap();
    Timeline::new(&trace, TimeBase::Timer, "two <CTAs>", &kind_name)
}

#[test]
fn chrome_json_parses_back() {
    let t = timeline();
    let doc: serde_json::Value = serde_json::from_str(&chrome::json(&t)).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    // The process's name and sort index, a name and a sort index per CTA, an event per span.
    assert_eq!(events.len(), 2 + 2 * 2 + 3);
    let spans: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(spans.len(), 3);
    assert_eq!(spans[2]["tid"], 1);
    assert_eq!(spans[2]["name"], "indexer 3");
    assert_eq!(spans[2]["cat"], "indexer");
    assert_eq!(spans[2]["ts"].as_f64(), Some(0.5));
    assert_eq!(spans[2]["dur"].as_f64(), Some(3.5));
    assert_eq!(spans[2]["args"]["cycles"], 3500);
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["CTA 0 (SM 7)", "CTA 1 (SM 9)"]);
}

#[test]
fn svg_has_a_bar_per_span_and_a_key_per_kind() {
    let t = timeline();
    let doc = svg::svg(&t);
    assert!(doc.starts_with("<svg") && doc.trim_end().ends_with("</svg>"));
    assert_eq!(doc.matches(r#"<rect class="span""#).count(), 3);
    assert_eq!(doc.matches(r#"<rect class="key""#).count(), 3);
    assert_eq!(doc.matches(r#"<rect class="row""#).count(), 2);
    assert!(doc.contains("two &lt;CTAs&gt;") && !doc.contains("<CTAs>"));
    assert!(doc.contains(">indexer 3</text>"));
}

fn rejects(records: &[Record], expect: &str) {
    let err = decode(&table(), &words(records)).unwrap_err().to_string();
    assert!(err.contains(expect), "{err:?} does not say {expect:?}");
}

#[test]
fn an_end_before_its_start_is_named() {
    let (_, mut records) = good();
    records[1].end_cycles = records[1].start_cycles - 1;
    rejects(&records, "task 2 on CTA 0 ends before it starts (cycles");
    let (_, mut records) = good();
    records[2].end_ns = 1;
    rejects(&records, "task 1 on CTA 1 ends before it starts (ns");
}

#[test]
fn a_record_past_the_table_is_named() {
    let (t, mut records) = good();
    records.push(record(&t.tasks[1], 0, 7, (5000, 6000), (4000, 5000)));
    rejects(
        &records,
        "record 3 (task 2 on CTA 0) is past the table's 3 tasks",
    );
}

#[test]
fn a_missing_or_misplaced_record_is_named() {
    let (t, mut records) = good();
    records[1] = Record::default();
    rejects(&records, "task 2 on CTA 0 (position 1) has no record");
    let (_, mut records) = good();
    records.swap(0, 1);
    rejects(
        &records,
        "record 0 is of task 2 (kind 0x2) on CTA 0; the table has task 0",
    );
    let (_, mut records) = good();
    records[2].cta = 0;
    rejects(&records, "record 2 is of task 1 (kind 0x103) on CTA 0");
    let (_, records) = good();
    rejects(
        &records[..2],
        "the trace holds 2 records; the table has 3 tasks",
    );
    let mut ragged = words(&good().1);
    ragged.pop();
    assert_eq!(
        decode(&t, &ragged).unwrap_err(),
        TraceError::Ragged { words: 23 }
    );
}

#[test]
fn overlapping_tasks_of_one_cta_are_named() {
    let (_, mut records) = good();
    records[1].start_ns = 2999;
    rejects(
        &records,
        "task 2 on CTA 0 starts (ns 2999) before the CTA's previous task 0 ends (3000)",
    );
}

#[test]
fn a_table_with_broken_offsets_is_named() {
    let (mut t, records) = good();
    t.offsets = vec![0, 3, 2];
    assert!(matches!(
        decode(&t, &words(&records)),
        Err(TraceError::Table { .. })
    ));
}

#[test]
fn the_header_has_the_same_record() {
    let header = crate::gpu::HEADER.1;
    assert!(header.contains(&format!("#define MBX_TRACE_WORDS {RECORD_WORDS}\n")));
    assert!(header.contains(&format!("#define MBX_TRACE_MARK {RECORD_MARK:#x}ull\n")));
}

#[test]
fn the_recorder_writes_what_decode_reads() {
    let table = table();
    let placement = Placement::new(vec![table.tasks[..2].to_vec(), table.tasks[2..].to_vec()]);
    let rec = Recorder::new(&placement);
    for (cta, list) in placement.lists().iter().enumerate() {
        for (i, task) in list.iter().enumerate() {
            let start = rec.start();
            rec.finish(cta as u32, i, task, start);
        }
    }
    let trace = decode(&table, &rec.words()).unwrap();
    let orders: Vec<u32> = trace.spans.iter().map(|s| s.order).collect();
    assert_eq!(orders, [0, 2, 1]);
    // A recorder that missed a task: decoding names it.
    let rec = Recorder::new(&placement);
    let start = rec.start();
    rec.finish(0, 0, &table.tasks[0], start);
    assert_eq!(
        decode(&table, &rec.words()).unwrap_err(),
        TraceError::Missing {
            task: 2,
            cta: 0,
            position: 1
        }
    );
}

#[test]
fn joined_launches_are_sections_in_time_order() {
    let a = timeline();
    let b = timeline().name_tasks(&|s| format!("task {} of CTA {}", s.order, s.cta));
    let end = a.end_us();
    let joined = Timeline::join("a step", vec![(a, 0.0), (b, end + 2.0)]);
    assert_eq!(joined.sections.len(), 2);
    assert_eq!(joined.sections[1].start_us, end + 2.0);
    assert_eq!(joined.end_us(), 2.0 * end + 2.0);
    assert_eq!(joined.bars.len(), 6);
    assert!(joined.bars[3..].iter().all(|b| b.section == 1));
    let doc: serde_json::Value = serde_json::from_str(&chrome::json(&joined)).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let processes: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .collect();
    assert_eq!(processes.len(), 2);
    let last = events.iter().rfind(|e| e["ph"] == "X").unwrap();
    assert_eq!(last["pid"], 1);
    assert_eq!(last["name"], "task 1 of CTA 1");
    assert_eq!(last["args"]["kind"], "indexer 3");
    let picture = svg::svg(&joined);
    assert_eq!(picture.matches(r#"<rect class="span""#).count(), 6);
    assert_eq!(picture.matches(r#"<rect class="row""#).count(), 2);
    assert_eq!(picture.matches(r#"<rect class="section""#).count(), 1);
}

#[test]
fn a_picture_of_many_bars_merges_neighbours_of_one_kind() {
    let (table, records) = good();
    let trace = decode(&table, &words(&records)).unwrap();
    let one = Timeline::new(&trace, TimeBase::Timer, "one", &kind_name);
    let end = one.end_us();
    let parts: Vec<(Timeline, f64)> = (0..2000).map(|i| (one.clone(), i as f64 * end)).collect();
    let many = Timeline::join("many", parts);
    assert_eq!(many.bars.len(), 6000);
    let picture = svg::svg(&many);
    // CTA 0 alternates two kinds: every bar drawn; CTA 1's one kind back to back: one bar.
    assert_eq!(picture.matches(r#"<rect class="span""#).count(), 4000);
    assert_eq!(picture.matches(r#"<rect class="spans""#).count(), 1);
    assert!(picture.contains("2000 tasks of indexer 3 CTA 1"));
}
