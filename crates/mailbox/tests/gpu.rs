//! GPU tests. On a GPU machine, all of them in one run (well under two minutes):
//!
//! ```text
//! cargo test -p mailbox --release --test gpu -- --ignored --nocapture --test-threads=1
//! ```
//!
//! Every test holds one lock, so they never share the GPU even without `--test-threads=1`: a
//! persistent grid needs every CTA resident, which a concurrent kernel could prevent.
//! Correctness tests use the debug build of the header with a poll bound and no trap, so a
//! protocol bug ends in a report instead of a hang; the latency ring uses the production build
//! (and checks every value it hands off).

use device::report::{Figure, Reporter};
use device::timing::median;
use device::{Device, Graph, Stream};
use mailbox::emulator::{self, evaluate_sequential, EmuConfig, Scratch};
use mailbox::gpu::{
    DebugBound, DeviceTable, EpochNode, LatencyRing, SyntheticKernel, SyntheticLaunch, Variant,
};
use mailbox::layout::{pack, tag_of, BoxRange, Tags, BOXES_PER_LINE};
use mailbox::placement::{Limits, Placement, ValidPlacement};
use mailbox::synth::{DagShape, SynthDag, Synthetic, KIND_LEAF, KIND_MIX};
use mailbox::task::Task;
use mailbox::trace::{self, decode, CycleClock, TimeBase, Timeline, TraceError};
use mailbox::{Stall, DIAG_WORDS};
use std::sync::Mutex;
use std::time::Instant;

static GPU: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn open() -> Device {
    Device::open(0).unwrap_or_else(|e| panic!("{e}"))
}

const BOUNDED: Variant = Variant {
    poll_acquire: false,
    debug: Some(DebugBound {
        poll_limit: 1 << 24,
        trap: false,
    }),
    epoch_clear: true,
};

/// Hand-off latency around rings of CTAs (2, and one per SM): relaxed vs acquire polls, one box
/// vs a 64-word row. Prints the figures for BENCHMARKS.md; asserts only that every value arrived
/// right. Each hop is timed between two CTAs; "SMs" says on how many distinct SMs the ring ran.
#[test]
#[ignore = "needs a GPU"]
fn handoff_latency_ring() {
    let _g = lock();
    let dev = open();
    let sms = dev.info().multiprocessors;
    println!(
        "\nhand-off latency ({}), median of 7 runs, ~20,000 hops a run",
        dev.info().name
    );
    println!(
        "{:<8} {:>5} {:>5} {:>8} {:>10} {:>10}",
        "polls", "ring", "row", "SMs", "ns/hop", "kernel ms"
    );
    // (acquire polls, CTAs, row words, ns a hop), for the records written after both kinds ran.
    let mut hops = Vec::new();
    for (name, acquire) in [("relaxed", false), ("acquire", true)] {
        let variant = Variant {
            poll_acquire: acquire,
            ..Variant::default()
        };
        let ring = LatencyRing::build(&dev, variant).unwrap();
        // Correctness first: a payload published beside one box, behind the release/acquire pair.
        let check = ring.run(&dev, sms, 20, 1, 16).unwrap();
        assert_eq!(check.errors, 0, "{name}: payload or value arrived wrong");
        for ctas in [2, sms] {
            let rounds = (20_000 / ctas).max(100);
            for row in [1, 64] {
                let runs: Vec<_> = (0..7)
                    .map(|_| ring.run(&dev, ctas, rounds, row, 0).unwrap())
                    .collect();
                assert!(
                    runs.iter().all(|r| r.errors == 0),
                    "{name} row {row}: values arrived wrong"
                );
                let ns = median(&runs.iter().map(|r| r.ns_per_hop).collect::<Vec<_>>());
                let ms = median(&runs.iter().map(|r| r.kernel_ms as f64).collect::<Vec<_>>());
                let used = runs[0].distinct_sms;
                println!("{name:<8} {ctas:>5} {row:>5} {used:>8} {ns:>10.1} {ms:>10.3}");
                hops.push((acquire, ctas, row, ns));
            }
        }
    }
    // BENCHMARKS.md's "mailbox hand-off" table (`MONO_BENCH_JSON`): relaxed polls against the
    // acquire polls of the same run.
    let report = Reporter::from_env(&dev.info().name);
    let ns_of = |acquire: bool, ctas: u32, row: u32| {
        hops.iter()
            .find(|h| h.0 == acquire && h.1 == ctas && h.2 == row)
            .map(|h| h.3)
            .expect("every case ran with both kinds of poll")
    };
    for row in [1, 64] {
        for ctas in [2, sms] {
            let what = if row == 1 {
                "1 box".to_string()
            } else {
                format!("{row}-word row")
            };
            let on = if ctas == 2 {
                "2 CTAs on 2 SMs".to_string()
            } else {
                format!("{ctas} CTAs (one a SM)")
            };
            let figure = Figure::new(
                "mailbox hand-off",
                &format!("{what}, {on}"),
                "relaxed polls",
                ns_of(false, ctas, row),
                "ns",
            )
            .baseline(ns_of(true, ctas, row), "acquire polls, same run");
            report.write(&figure).unwrap();
        }
    }
}

/// One synthetic launch's device buffers.
struct Launchable {
    table: DeviceTable,
    scratch: device::Buffer<u64>,
    epoch: device::Buffer<u32>,
    step: device::Buffer<u32>,
    inputs: Vec<device::Buffer<u32>>,
    out: device::Buffer<u32>,
    diag: device::Buffer<u32>,
    out_words: u32,
    tags: Tags,
}

impl Launchable {
    fn new(
        dev: &Device,
        d: &SynthDag,
        p: &ValidPlacement,
        inputs: &[Vec<u32>],
        out_slots: u32,
    ) -> Self {
        Launchable {
            table: DeviceTable::upload(dev, p).unwrap(),
            scratch: dev.alloc_zeroed(d.layout.boxes() as usize).unwrap(),
            epoch: dev.alloc_zeroed(1).unwrap(),
            step: dev.alloc_zeroed(1).unwrap(),
            inputs: inputs.iter().map(|i| dev.upload(i).unwrap()).collect(),
            out: dev
                .alloc_zeroed((out_slots * d.out_words) as usize)
                .unwrap(),
            diag: dev.alloc_zeroed(DIAG_WORDS).unwrap(),
            out_words: d.out_words,
            tags: Tags::new(inputs.len() as u32).unwrap(),
        }
    }

    fn launch(&self, k: &SyntheticKernel, s: &Stream, index: u32) {
        let l = SyntheticLaunch {
            table: &self.table,
            scratch: &self.scratch,
            epoch: &self.epoch,
            tags: self.tags,
            launch_index: index,
            inputs: &self.inputs[index as usize],
            step: &self.step,
            out: &self.out,
            out_words: self.out_words,
            diag: &self.diag,
            trace: None,
        };
        k.launch(s, &l).unwrap();
    }

    /// A step: [epoch node], every launch, the step counter.
    fn capture(&self, k: &SyntheticKernel, epoch: Option<&EpochNode>, s: &Stream) -> Graph {
        s.begin_capture().unwrap();
        if let Some(node) = epoch {
            node.enqueue(s, &self.epoch, &self.scratch, self.tags)
                .unwrap();
        }
        for index in 0..self.inputs.len() as u32 {
            self.launch(k, s, index);
        }
        k.advance_step(s, &self.step).unwrap();
        let g = s.end_capture().unwrap();
        g.upload(s).unwrap();
        g
    }

    fn assert_no_stall(&self) {
        if let Some((stall, n)) = Stall::from_diag(&self.diag.download().unwrap(), 1 << 24) {
            panic!("{n} device waits gave up; first: {stall}");
        }
    }
}

fn synthetic_dag(ctas: u32, tasks_per_cta: u32, max_row: u32, seed: u64) -> SynthDag {
    let shape = DagShape {
        tasks: ctas * tasks_per_cta,
        leaves: (ctas / 2).max(1),
        max_inputs: 4,
        max_row,
        window: 2 * ctas,
    };
    let d = SynthDag::random(seed, shape).unwrap();
    assert!(d.out_words > 0, "the last task is always a sink");
    d
}

/// One CTA per SM, or fewer if fewer fit.
fn grid(dev: &Device, k: &SyntheticKernel) -> u32 {
    k.max_resident().unwrap().min(dev.info().multiprocessors)
}

/// A random DAG over every SM, placed by the rule: the device's scratch (tags and values) and
/// outputs equal the CPU emulator's and the sequential oracle's, bit for bit.
#[test]
#[ignore = "needs a GPU"]
fn persistent_launch_matches_the_emulator() {
    let _g = lock();
    let dev = open();
    let k = SyntheticKernel::build(&dev, BOUNDED).unwrap();
    let epoch_node = EpochNode::build(&dev, Variant::default()).unwrap();
    let ctas = grid(&dev, &k);
    for (seed, round_robin) in [(1u64, false), (2, true), (3, false)] {
        let d = synthetic_dag(ctas, 4, 64, seed);
        let p = if round_robin {
            d.place_round_robin(ctas)
        } else {
            d.place_random(ctas, seed)
        };
        let limits = Limits {
            max_resident: k.max_resident().unwrap(),
            scratch_boxes: d.layout.boxes(),
        };
        let valid = p.check(limits).unwrap();
        let inputs = vec![d.random_inputs(seed)];
        let l = Launchable::new(&dev, &d, &valid, &inputs, 1);
        let s = dev.new_stream().unwrap();
        let (t0, t1) = (dev.timer().unwrap(), dev.timer().unwrap());
        epoch_node
            .enqueue(&s, &l.epoch, &l.scratch, l.tags)
            .unwrap();
        t0.record(&s).unwrap();
        l.launch(&k, &s, 0);
        t1.record(&s).unwrap();
        s.sync().unwrap();
        l.assert_no_stall();
        let gpu = l.scratch.download().unwrap();
        let tag = l.tags.tag(1, 0).unwrap();

        let task_fn = Synthetic {
            inputs: &inputs[0],
            step: 0,
        };
        let scratch = Scratch::new(d.layout.boxes());
        let start = Instant::now();
        emulator::run(&valid, &scratch, tag, &EmuConfig::default(), &task_fn).unwrap();
        let emu_s = start.elapsed().as_secs_f64();
        let emu = scratch.snapshot();
        let oracle =
            evaluate_sequential(valid.placement(), &vec![0; emu.len()], tag, &task_fn).unwrap();
        assert_eq!(emu, oracle, "the emulator disagrees with the oracle");
        let differ = gpu.iter().zip(&emu).filter(|(a, b)| a != b).count();
        let written = emu.iter().filter(|&&w| tag_of(w) == tag).count();
        println!(
            "persistent launch seed {seed}: {} tasks on {ctas} CTAs ({}), {written} boxes written, {differ} differ from the emulator; GPU {:.1} us, emulator {:.0} ms",
            d.tasks.len(),
            if round_robin { "round robin" } else { "random" },
            t0.elapsed_ms(&t1).unwrap() * 1000.0,
            emu_s * 1000.0
        );
        assert_eq!(differ, 0, "GPU scratch differs from the emulator's");
        assert_eq!(
            l.out.download().unwrap(),
            d.outputs(&emu),
            "GPU outputs differ"
        );
    }
}

/// A traced synthetic launch over every SM (the production build, as `mono trace` runs it): every
/// task of the table has one record naming its task and CTA, a CTA's records follow its list on
/// both clocks from one SM, and the outputs are the oracle's. The untraced build given the same
/// buffer writes nothing. With MAILBOX_TRACE_DIR set, the timeline's JSON and SVG land there.
#[test]
#[ignore = "needs a GPU"]
fn a_traced_launch_records_every_task_once() {
    let _g = lock();
    let dev = open();
    let k = SyntheticKernel::build_traced(&dev, Variant::default()).unwrap();
    let ctas = grid(&dev, &k);
    let seed = 11;
    let d = synthetic_dag(ctas, 8, 64, seed);
    let limits = Limits {
        max_resident: k.max_resident().unwrap(),
        scratch_boxes: d.layout.boxes(),
    };
    let valid = d.place_random(ctas, seed).check(limits).unwrap();
    let inputs = d.random_inputs(seed);
    let run = k.run_traced(&dev, &d, &valid, &inputs).unwrap();
    assert!(run.diag.iter().all(|&w| w == 0), "diagnostics written");
    let task_fn = Synthetic {
        inputs: &inputs,
        step: 0,
    };
    let zero = vec![0; d.layout.boxes() as usize];
    let oracle = evaluate_sequential(valid.placement(), &zero, 1, &task_fn).unwrap();
    assert_eq!(run.outputs, d.outputs(&oracle), "traced outputs differ");

    let table = valid.placement().table();
    let trace = decode(&table, &run.trace).unwrap_or_else(|e| panic!("{e}"));
    let mut orders: Vec<u32> = trace.spans.iter().map(|s| s.order).collect();
    orders.sort_unstable();
    assert_eq!(orders, (0..d.tasks.len() as u32).collect::<Vec<_>>());
    for w in trace.spans.windows(2).filter(|w| w[0].cta == w[1].cta) {
        assert!(w[0].order < w[1].order && w[0].sm == w[1].sm);
        assert!(w[0].end_ns <= w[1].start_ns && w[0].end_cycles <= w[1].start_cycles);
    }
    let mut sms: Vec<u32> = trace.spans.iter().map(|s| s.sm).collect();
    sms.sort_unstable();
    sms.dedup();
    let cycles: Vec<f64> = trace
        .spans
        .iter()
        .map(|s| (s.end_cycles - s.start_cycles) as f64)
        .collect();
    let ns_ticks: Vec<u64> = trace
        .spans
        .iter()
        .map(|s| s.end_ns - s.start_ns)
        .filter(|&t| t > 0)
        .collect();
    let first = trace.spans.iter().map(|s| s.start_ns).min().unwrap_or(0);
    let last = trace.spans.iter().map(|s| s.end_ns).max().unwrap_or(0);
    println!(
        "traced launch: {} tasks on {ctas} CTAs over {} SMs; {:.1} us by events, {:.1} us first start to last end (ns clock); median task {:.0} cycles; smallest nonzero ns span {:?}",
        d.tasks.len(),
        sms.len(),
        run.kernel_ms * 1000.0,
        (last - first) as f64 / 1e3,
        median(&cycles),
        ns_ticks.iter().min()
    );
    if let Ok(dir) = std::env::var("MAILBOX_TRACE_DIR") {
        let base =
            CycleClock::from_khz(dev.info().clock_khz).map_or(TimeBase::Timer, TimeBase::Cycles);
        let t = Timeline::new(
            &trace,
            base,
            "synthetic launch (GPU test)",
            &trace::kind_name,
        );
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(format!("{dir}/gpu-test.json"), trace::chrome::json(&t)).unwrap();
        std::fs::write(format!("{dir}/gpu-test.svg"), trace::svg::svg(&t)).unwrap();
    }

    // The negative control: the same run on the untraced build leaves every record unwritten.
    let plain = SyntheticKernel::build(&dev, Variant::default()).unwrap();
    let run = plain.run_traced(&dev, &d, &valid, &inputs).unwrap();
    assert!(
        run.trace.iter().all(|&w| w == 0),
        "the untraced build wrote records"
    );
    assert!(matches!(
        decode(&table, &run.trace),
        Err(TraceError::Missing { position: 0, .. })
    ));
}

/// Expected outputs of `steps` replays of `k` launches (slot = step * k + index), on all cores.
fn expected_outputs(d: &SynthDag, p: &Placement, inputs: &[Vec<u32>], steps: u32) -> Vec<u32> {
    let k = inputs.len() as u32;
    let slots = steps * k;
    let words = d.out_words as usize;
    let mut want = vec![0u32; slots as usize * words];
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let per = (slots as usize).div_ceil(threads) * words;
    crossbeam::scope(|s| {
        for (c, chunk) in want.chunks_mut(per).enumerate() {
            s.spawn(move |_| {
                for (j, slot_out) in chunk.chunks_mut(words).enumerate() {
                    let slot = (c * per / words + j) as u32;
                    let task_fn = Synthetic {
                        inputs: &inputs[(slot % k) as usize],
                        step: slot / k,
                    };
                    let image =
                        evaluate_sequential(p, &vec![0; d.layout.boxes() as usize], 1, &task_fn)
                            .unwrap();
                    slot_out.copy_from_slice(&d.outputs(&image));
                }
            });
        }
    })
    .unwrap();
    want
}

/// Wrong words per slot.
fn wrong_slots(got: &[u32], want: &[u32], words: usize) -> Vec<(usize, usize)> {
    got.chunks(words)
        .zip(want.chunks(words))
        .enumerate()
        .filter_map(|(slot, (g, w))| {
            let n = g.iter().zip(w).filter(|(a, b)| a != b).count();
            (n > 0).then_some((slot, n))
        })
        .collect()
}

/// A captured step of 8 launches (own inputs each, one shared scratch) replayed until 10,000
/// launches ran, the epoch node advancing the tag every replay; every output word is checked.
/// Positive control: one input word of one launch flipped for one replay is reported, in that
/// launch only.
#[test]
#[ignore = "needs a GPU"]
fn graph_replays_10000_launches() {
    let _g = lock();
    let dev = open();
    let k = SyntheticKernel::build(&dev, BOUNDED).unwrap();
    let epoch_node = EpochNode::build(&dev, Variant::default()).unwrap();
    let ctas = grid(&dev, &k);
    let d = synthetic_dag(ctas, 2, 32, 10);
    let limits = Limits {
        max_resident: k.max_resident().unwrap(),
        scratch_boxes: d.layout.boxes(),
    };
    let valid = d.place_random(ctas, 10).check(limits).unwrap();
    const LAUNCHES: u32 = 8;
    const STEPS: u32 = 1250;
    const FLIP_STEP: u32 = 600;
    const FLIP_LAUNCH: u32 = 3;
    let inputs: Vec<Vec<u32>> = (0..LAUNCHES)
        .map(|i| d.random_inputs(100 + i as u64))
        .collect();
    let l = Launchable::new(&dev, &d, &valid, &inputs, STEPS * LAUNCHES);
    let s = dev.new_stream().unwrap();
    let g = l.capture(&k, Some(&epoch_node), &s);

    let (t0, t1) = (dev.timer().unwrap(), dev.timer().unwrap());
    t0.record(&s).unwrap();
    for _ in 0..FLIP_STEP {
        g.launch(&s).unwrap();
    }
    t1.record(&s).unwrap();
    s.sync().unwrap();
    let mut flipped = inputs[FLIP_LAUNCH as usize].clone();
    flipped[0] ^= 1 << 7;
    l.inputs[FLIP_LAUNCH as usize].write(&flipped).unwrap();
    g.launch(&s).unwrap();
    s.sync().unwrap();
    l.inputs[FLIP_LAUNCH as usize]
        .write(&inputs[FLIP_LAUNCH as usize])
        .unwrap();
    for _ in FLIP_STEP + 1..STEPS {
        g.launch(&s).unwrap();
    }
    s.sync().unwrap();
    l.assert_no_stall();

    assert_eq!(l.step.download().unwrap()[0], STEPS, "step counter");
    assert_eq!(
        l.epoch.download().unwrap()[0],
        STEPS,
        "epoch: one advance per replay"
    );
    let last_tag = l.tags.tag(STEPS, LAUNCHES - 1).unwrap();
    let scratch = l.scratch.download().unwrap();
    let stale = d
        .tasks
        .iter()
        .flat_map(|t| t.out.boxes())
        .filter(|&b| tag_of(scratch[b as usize]) != last_tag)
        .count();
    assert_eq!(
        stale, 0,
        "boxes not holding the last launch's tag {last_tag}"
    );

    let start = Instant::now();
    let want = expected_outputs(&d, valid.placement(), &inputs, STEPS);
    let got = l.out.download().unwrap();
    let bad = wrong_slots(&got, &want, l.out_words as usize);
    let flip_slot = (FLIP_STEP * LAUNCHES + FLIP_LAUNCH) as usize;
    let flip_wrong = bad.iter().find(|(s, _)| *s == flip_slot).map_or(0, |b| b.1);
    let other_wrong: usize = bad
        .iter()
        .filter(|(s, _)| *s != flip_slot)
        .map(|b| b.1)
        .sum();
    println!(
        "graph replays: {} launches ({STEPS} replays x {LAUNCHES}), {} tasks on {ctas} CTAs, {} output words checked (host {:.1} s)",
        STEPS * LAUNCHES,
        d.tasks.len(),
        got.len(),
        start.elapsed().as_secs_f64()
    );
    println!(
        "  {other_wrong} wrong words outside the flipped launch; flipped launch (replay {FLIP_STEP}, index {FLIP_LAUNCH}): {flip_wrong} of {} words wrong",
        l.out_words
    );
    println!(
        "  {:.2} us per launch over the first {FLIP_STEP} replays (graph replay, epoch and step nodes included)",
        t0.elapsed_ms(&t1).unwrap() as f64 * 1000.0 / (FLIP_STEP * LAUNCHES) as f64
    );
    assert_eq!(
        other_wrong, 0,
        "wrong words in launches that were not flipped: {bad:?}"
    );
    assert!(
        flip_wrong > 0,
        "positive control: the flipped input was not reported"
    );
}

/// Replays `steps` times a one-launch step (fresh scratch), returning wrong output words.
fn replay_one_launch(
    dev: &Device,
    k: &SyntheticKernel,
    node: Option<&EpochNode>,
    steps: u32,
    prefill: Option<(u64, u32)>,
) -> usize {
    let ctas = grid(dev, k);
    let d = synthetic_dag(ctas, 4, 16, 20);
    let limits = Limits {
        max_resident: k.max_resident().unwrap(),
        scratch_boxes: d.layout.boxes(),
    };
    let valid = d.place_random(ctas, 20).check(limits).unwrap();
    let inputs = vec![d.random_inputs(20)];
    let l = Launchable::new(dev, &d, &valid, &inputs, steps);
    if let Some((junk, epoch)) = prefill {
        l.scratch
            .write(&vec![junk; d.layout.boxes() as usize])
            .unwrap();
        l.epoch.write(&[epoch]).unwrap();
    }
    let s = dev.new_stream().unwrap();
    let g = l.capture(k, node, &s);
    for _ in 0..steps {
        g.launch(&s).unwrap();
    }
    s.sync().unwrap();
    l.assert_no_stall();
    let want = expected_outputs(&d, valid.placement(), &inputs, steps);
    wrong_slots(&l.out.download().unwrap(), &want, l.out_words as usize)
        .iter()
        .map(|b| b.1)
        .sum()
}

/// Negative control for the device-side tag: the same graph replayed with the epoch node left out
/// (the tag frozen) takes the previous replay's boxes as ready, and the output check catches it.
#[test]
#[ignore = "needs a GPU"]
fn a_frozen_tag_is_caught() {
    let _g = lock();
    let dev = open();
    let k = SyntheticKernel::build(&dev, BOUNDED).unwrap();
    let node = EpochNode::build(&dev, Variant::default()).unwrap();
    let advancing = replay_one_launch(&dev, &k, Some(&node), 200, None);
    let frozen = replay_one_launch(&dev, &k, None, 200, None);
    println!("200 replays of one launch: {advancing} wrong words with the epoch node, {frozen} with the tag frozen");
    assert_eq!(advancing, 0);
    assert!(frozen > 0, "the frozen tag went unnoticed");
}

/// The wrap: from the epoch before the last, three replays cross 2^32 (the node clears the
/// scratch) and stay right. Negative control: a scratch full of pairs with tag 1 (what launch 0
/// of epoch 0 waits for) replayed at the last epoch is only safe because the node clears it.
#[test]
#[ignore = "needs a GPU"]
fn the_epoch_wrap_clears_the_scratch() {
    let _g = lock();
    let dev = open();
    let k = SyntheticKernel::build(&dev, BOUNDED).unwrap();
    let clear = EpochNode::build(&dev, Variant::default()).unwrap();
    let no_clear = EpochNode::build(
        &dev,
        Variant {
            epoch_clear: false,
            ..Variant::default()
        },
    )
    .unwrap();
    let last = Tags::new(1).unwrap().last_epoch();
    let across = replay_one_launch(&dev, &k, Some(&clear), 3, Some((0, last - 1)));
    let junk = pack(1, 0xdead_beef);
    let cleared = replay_one_launch(&dev, &k, Some(&clear), 1, Some((junk, last)));
    let not_cleared = replay_one_launch(&dev, &k, Some(&no_clear), 1, Some((junk, last)));
    println!("epoch wrap: {across} wrong words across it; stale tag-1 scratch: {cleared} wrong when cleared, {not_cleared} when not");
    assert_eq!(across, 0);
    assert_eq!(cleared, 0);
    assert!(
        not_cleared > 0,
        "junk with the restarted tag went unnoticed"
    );
}

fn row(line: u32) -> BoxRange {
    BoxRange::new(line * BOXES_PER_LINE, 2)
}

/// CTA 0 runs task 1 (waiting on task 0's row) before task 0: a placement the check rejects.
fn hanging_placement(ctas: u32) -> Placement {
    let mut lists = vec![Vec::new(); ctas as usize];
    lists[0] = vec![
        // One box waited on, so one thread polls and the report's box is certain.
        Task::new(
            KIND_MIX,
            1,
            row(1),
            &[BoxRange::new(0, 1)],
            [1, 0, u32::MAX],
        )
        .unwrap(),
        Task::new(KIND_LEAF, 0, row(0), &[], [0, 0, u32::MAX]).unwrap(),
    ];
    Placement::new(lists)
}

const HANG_CTAS: u32 = 4;
const HANG_INPUTS: [u32; 2] = [5, 6];
const HANG_EPOCH: u32 = 4;

/// Launches [`hanging_placement`] with a debug build; the diagnostics words, or the launch's error.
fn run_hanging(dev: &Device, bound: DebugBound) -> Result<Vec<u32>, String> {
    let k = SyntheticKernel::build(
        dev,
        Variant {
            debug: Some(bound),
            ..Variant::default()
        },
    )
    .unwrap();
    let table = DeviceTable::upload_unchecked(dev, &hanging_placement(HANG_CTAS)).unwrap();
    let scratch = dev
        .alloc_zeroed::<u64>(2 * BOXES_PER_LINE as usize)
        .unwrap();
    let epoch = dev.upload(&[HANG_EPOCH]).unwrap();
    let step = dev.alloc_zeroed::<u32>(1).unwrap();
    let inputs = dev.upload(&HANG_INPUTS).unwrap();
    let out = dev.alloc_zeroed::<u32>(1).unwrap();
    let diag = dev.alloc_zeroed::<u32>(DIAG_WORDS).unwrap();
    let s = dev.new_stream().unwrap();
    let launch = SyntheticLaunch {
        table: &table,
        scratch: &scratch,
        epoch: &epoch,
        tags: Tags::new(1).unwrap(),
        launch_index: 0,
        inputs: &inputs,
        step: &step,
        out: &out,
        out_words: 1,
        diag: &diag,
        trace: None,
    };
    k.launch(&s, &launch).map_err(|e| e.to_string())?;
    s.sync().map_err(|e| e.to_string())?;
    diag.download().map_err(|e| e.to_string())
}

/// The debug bound turns the hang of a rule-breaking placement into a report naming the task and
/// the box, the same as the CPU emulator's. With the trap enabled (in a child process, since a
/// trap can leave the context unusable) the launch ends in an error instead of hanging.
#[test]
#[ignore = "needs a GPU"]
fn the_debug_bound_turns_a_hang_into_a_report() {
    let _g = lock();
    let dev = open();
    let p = hanging_placement(HANG_CTAS);
    let boxes = 2 * BOXES_PER_LINE;
    assert!(p
        .validate(Limits {
            max_resident: HANG_CTAS,
            scratch_boxes: boxes
        })
        .is_err());
    let limit = 1u32 << 20;
    let start = Instant::now();
    let diag = run_hanging(
        &dev,
        DebugBound {
            poll_limit: limit,
            trap: false,
        },
    )
    .unwrap();
    let (stall, n) = Stall::from_diag(&diag, limit as u64).expect("no report from the device");
    println!(
        "device report after {:.2} s ({n} waiter(s) gave up): {stall}",
        start.elapsed().as_secs_f64()
    );
    let tag = Tags::new(1).unwrap().tag(HANG_EPOCH, 0).unwrap();
    assert_eq!(
        (
            stall.cta,
            stall.task,
            stall.box_index,
            stall.want_tag,
            stall.seen
        ),
        (0, 1, 0, tag, 0)
    );

    let config = EmuConfig {
        timeout: std::time::Duration::from_millis(200),
        ..EmuConfig::default()
    };
    let task_fn = Synthetic {
        inputs: &HANG_INPUTS,
        step: 0,
    };
    let cpu =
        emulator::run_unchecked(&p, &Scratch::new(boxes), tag, &config, &task_fn).unwrap_err();
    println!("emulator report: {cpu}");
    match cpu {
        emulator::EmuError::Stalled { stalls, .. } => {
            assert_eq!(
                (stalls[0].cta, stalls[0].task, stalls[0].box_index),
                (0, 1, 0)
            )
        }
        other => panic!("{other}"),
    }

    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "debug_trap_child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&child.stdout).into_owned()
        + &String::from_utf8_lossy(&child.stderr);
    println!(
        "trap build, in a child process: {}",
        text.lines()
            .find(|l| l.contains(MARK))
            .unwrap_or("(no marker)")
    );
    assert!(
        child.status.success() && text.contains(MARK),
        "child:\n{text}"
    );
}

const CHILD: &str = "MAILBOX_GPU_TRAP_CHILD";
const MARK: &str = "trap child: launch failed as expected:";

/// Run by the test above in a child process; does nothing otherwise.
#[test]
#[ignore = "needs a GPU"]
fn debug_trap_child_process() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    match run_hanging(
        &open(),
        DebugBound {
            poll_limit: 1 << 20,
            trap: true,
        },
    ) {
        Err(e) => println!("{MARK} {e}"),
        Ok(_) => panic!("the trap build finished a hanging launch"),
    }
}
