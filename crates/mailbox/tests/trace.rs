//! The emulator's trace: every task of a valid placement gets one record, the records decode
//! against the placement's table into spans ordered per CTA, and the drawings have a bar per task.

use mailbox::emulator::{evaluate_sequential, run_traced, EmuConfig, Scratch};
use mailbox::placement::Limits;
use mailbox::synth::{DagShape, SynthDag, Synthetic};
use mailbox::trace::{chrome, decode, kind_name, svg, Recorder, TimeBase, Timeline, TraceError};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn an_emulated_launch_traces_every_task_once(
        seed in any::<u64>(),
        tasks in 1u32..60,
        ctas in 1u32..7,
        window in 1u32..24,
    ) {
        let shape = DagShape { tasks, leaves: (tasks / 5).max(1), max_inputs: 4, max_row: 20, window };
        let d = SynthDag::random(seed, shape).unwrap();
        let limits = Limits { max_resident: ctas, scratch_boxes: d.layout.boxes() };
        let valid = d.place_random(ctas, seed).check(limits).unwrap();
        let inputs = d.random_inputs(seed);
        let task_fn = Synthetic { inputs: &inputs, step: 0 };
        let scratch = Scratch::new(d.layout.boxes());
        let before = scratch.snapshot();
        let rec = Recorder::new(valid.placement());
        run_traced(&valid, &scratch, 1, &EmuConfig::default(), &task_fn, &rec).unwrap();
        // Tracing leaves the results as they are.
        let oracle = evaluate_sequential(valid.placement(), &before, 1, &task_fn).unwrap();
        prop_assert_eq!(scratch.snapshot(), oracle);

        let table = valid.placement().table();
        let trace = decode(&table, &rec.words()).unwrap();
        let mut orders: Vec<u32> = trace.spans.iter().map(|s| s.order).collect();
        orders.sort_unstable();
        prop_assert_eq!(orders, (0..tasks).collect::<Vec<_>>());
        for pair in trace.spans.windows(2).filter(|w| w[0].cta == w[1].cta) {
            prop_assert!(pair[0].end_ns <= pair[1].start_ns);
            prop_assert!(pair[0].order < pair[1].order);
        }
        let timeline = Timeline::new(&trace, TimeBase::Timer, "emulated", &kind_name);
        prop_assert_eq!(svg::svg(&timeline).matches(r#"<rect class="span""#).count(), tasks as usize);
        let doc: serde_json::Value = serde_json::from_str(&chrome::json(&timeline)).unwrap();
        let spans = doc["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").count();
        prop_assert_eq!(spans, tasks as usize);
    }
}

/// Records of one placement do not pass for another's: decoding names the first task they disagree on.
#[test]
fn records_of_another_placement_are_rejected() {
    let shape = DagShape {
        tasks: 12,
        leaves: 3,
        max_inputs: 3,
        max_row: 8,
        window: 4,
    };
    let d = SynthDag::random(7, shape).unwrap();
    let limits = Limits {
        max_resident: 3,
        scratch_boxes: d.layout.boxes(),
    };
    let valid = d.place_round_robin(3).check(limits).unwrap();
    let inputs = d.random_inputs(7);
    let rec = Recorder::new(valid.placement());
    let task_fn = Synthetic {
        inputs: &inputs,
        step: 0,
    };
    let scratch = Scratch::new(d.layout.boxes());
    run_traced(&valid, &scratch, 1, &EmuConfig::default(), &task_fn, &rec).unwrap();
    let other = d.place_round_robin(2).table();
    let err = decode(&other, &rec.words()).unwrap_err();
    assert!(
        matches!(err, TraceError::WrongTask { position: 1, .. }),
        "{err}"
    );
}
