//! The front half's fused launch on a GPU: the selected slots equal, entry by entry, the reference
//! radix select of the launch's own scores and the standalone select's lists of them, and the
//! scores equal the standalone indexer's bit for bit (which are checked against the reference
//! here too), over 8K / 128K / 512K contexts, 1 and 4 rows, two requests of different lengths, new
//! keys patched (their cache slots poisoned). Negative control: select tasks built to skip their
//! wait read the previous launch's scores, and the check catches it. The lists' hand-off: list
//! readers in the same launch (the attention tasks' stand-in), waiting on each row's list box, copy
//! this launch's lists; built to skip that wait they copy the previous launch's, and the check
//! catches it. At the tiny preset (8 heads x 64, bf16 queries on the mma path, k = 16): the
//! published keys and queries, the scores and the lists against the indexer's and select's
//! references, with ties and rows shorter than k, and rows planned as the step plans them (at the
//! last positions their pages hold) then moved to positions of k - 1, k and k + 1 keys, so the
//! indexer masks the rest of each row with -inf: every list equals the reference select's of the
//! launch's scores over both lengths, and lists exactly the row's keys in position order then -1
//! where it has at most k; negative controls: a head's gate dropped on the device is caught, and
//! a masked key put in a list is caught. CI runs that one on CPU threads
//! (`MONO_BACKEND=host MONO_HOST_CTAS=8`).
//!
//! `cargo test -p executor --release --test gpu_front -- --ignored --nocapture --test-threads 1`

#[path = "../../indexer/tests/support/mod.rs"]
mod support;

use device::{Buffer, Device};
use executor::fused::front::{FrontGraph, FrontRequest};
use executor::fused::front_gpu::{FrontFault, FrontInputs, FrontKernel, FrontLaunch, FrontOptions};
use executor::step::layer::step::front_requests as step_front_requests;
use executor::step::{Batch as StepBatch, RequestInput};
use indexer::gpu::KernelConfig;
use indexer::reference::{IndexerDims, IndexerOptions};
use mailbox::gpu::{DebugBound, Variant};
use model::paging::PAGE_TOKENS;
use model::ModelConfig;
use select::gpu::{Batch, Method, Selector, Shape};
use select::reference::{select_rows, RowPages, Rows};
use support::{
    check_rows, check_runs_done, check_scores, check_stored, published, CacheKind, Inputs,
    Launched, Request, Scene, Stage,
};

/// Debug waits: a wait that never ends gives up and reports instead of hanging the test.
fn variant() -> Variant {
    Variant {
        debug: Some(DebugBound {
            poll_limit: 1 << 24,
            trap: false,
        }),
        ..Variant::default()
    }
}

fn r(rows: u32, last_position: u32) -> Request {
    Request {
        rows,
        last_position,
    }
}

/// The step's requests in the fused launch's terms.
fn front_requests(scene: &Scene) -> Vec<FrontRequest> {
    scene
        .requests
        .iter()
        .enumerate()
        .map(|(i, q)| FrontRequest {
            context: q.first_position(),
            rows: q.rows,
            pages: scene.table.pages(i).to_vec(),
        })
        .collect()
}

struct Step {
    key_proj: Buffer<u16>,
    query_proj: Buffer<u16>,
    gates: Buffer<f32>,
    norm_weight: Buffer<f32>,
    norm_bias: Buffer<f32>,
    cache: Buffer<u8>,
}

impl Step {
    fn new(dev: &Device, scene: &Scene, inputs: &Inputs) -> Step {
        Step {
            key_proj: dev.upload(&inputs.key_proj).unwrap(),
            query_proj: dev.upload(&inputs.query_proj).unwrap(),
            gates: dev.upload(&inputs.gates).unwrap(),
            norm_weight: dev.upload(&inputs.norm_weight).unwrap(),
            norm_bias: dev.upload(&inputs.norm_bias).unwrap(),
            cache: dev.upload(&scene.bytes).unwrap(),
        }
    }

    fn inputs(&self) -> FrontInputs<'_> {
        FrontInputs {
            key_proj: &self.key_proj,
            query_proj: &self.query_proj,
            gates: &self.gates,
            norm_weight: &self.norm_weight,
            norm_bias: &self.norm_bias,
            cache: &self.cache,
        }
    }
}

fn reference_lists(graph: &FrontGraph, scores: &[f32]) -> Vec<i32> {
    reference_lists_over(graph, scores, &graph.lens)
}

/// The reference select of the launch's scores with rows of `lens` keys.
fn reference_lists_over(graph: &FrontGraph, scores: &[f32], lens: &[u32]) -> Vec<i32> {
    let requests = graph.row_requests();
    let rows = Rows {
        scores,
        stride: graph.plan.stride as usize,
        lens,
    };
    select_rows(
        &rows,
        graph.top,
        Some(&RowPages {
            table: &graph.pages,
            requests: &requests,
        }),
    )
    .unwrap()
}

fn first_difference(a: &[i32], b: &[i32]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

const CASES: [(&str, &[Request]); 8] = [
    (
        "8K x 1",
        &[Request {
            rows: 1,
            last_position: 8191,
        }],
    ),
    (
        "8K x 4",
        &[Request {
            rows: 4,
            last_position: 8191,
        }],
    ),
    (
        "12K x 4 (one CTA a row)",
        &[Request {
            rows: 4,
            last_position: 12_287,
        }],
    ),
    (
        "128K x 1",
        &[Request {
            rows: 1,
            last_position: 131_071,
        }],
    ),
    (
        "128K x 4",
        &[Request {
            rows: 4,
            last_position: 131_071,
        }],
    ),
    (
        "2 requests",
        &[
            Request {
                rows: 1,
                last_position: 131_071,
            },
            Request {
                rows: 4,
                last_position: 40_000,
            },
        ],
    ),
    (
        "512K x 1",
        &[Request {
            rows: 1,
            last_position: 524_287,
        }],
    ),
    (
        "short rows",
        &[
            Request {
                rows: 2,
                last_position: 1500,
            },
            Request {
                rows: 1,
                last_position: 70,
            },
        ],
    ),
];

#[test]
#[ignore = "needs a GPU"]
fn fused_front_half_matches_the_reference_and_the_standalone_stages() {
    let cfg = ModelConfig::preset("glm-5").unwrap();
    let dims = IndexerDims::new(&cfg).unwrap();
    let config = KernelConfig {
        mailbox: variant(),
        ..KernelConfig::new(dims, &IndexerOptions::deepseek(&cfg)).unwrap()
    };
    let stage = Stage::new(Device::open(0).expect("a GPU"), config).unwrap();
    let dev = &stage.dev;
    let fused = FrontKernel::build(dev, &cfg, variant(), None).unwrap();
    let stream = dev.stream();
    for (i, (name, requests)) in CASES.iter().enumerate() {
        let scene = Scene::new(dims, requests.to_vec(), CacheKind::Random, 40 + i as u64);
        let cache_pages = (scene.bytes.len() as u64 / scene.cache.page_bytes()) as u32;
        let rows: u32 = requests.iter().map(|q| q.rows).sum();
        let inputs = Inputs::random(&dims, rows as usize, 90 + i as u64);
        let step = Step::new(dev, &scene, &inputs);
        let graph = FrontGraph::new(&cfg, &front_requests(&scene), fused.build_info(cache_pages))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let kind = graph.select_kind;
        let launch = FrontLaunch::new(dev, &fused, graph, &step.inputs()).unwrap();
        launch.enqueue(&fused, stream).unwrap();
        stream.sync().unwrap();
        let lists = launch
            .read(&fused)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let scores = launch.scores.download().unwrap();
        let graph = &launch.graph;

        // The reference radix select of the launch's own scores.
        let want = reference_lists(graph, &scores);
        assert_eq!(
            first_difference(&lists, &want),
            None,
            "{name}: against the reference"
        );

        // The standalone indexer on the same inputs and a fresh copy of the cache.
        let chosen: Vec<usize> = (0..requests.len()).collect();
        let plan = stage.plan(&scene, &chosen).unwrap();
        let cache = dev.upload(&scene.bytes).unwrap();
        let alone = stage
            .launch(&scene, &plan, &inputs, &cache, &cache)
            .unwrap();
        check_runs_done(&alone).unwrap();
        let stats = check_scores(&scene, &alone).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(alone.plan.stride, graph.plan.stride);
        let differ = scores
            .iter()
            .zip(&alone.scores)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(
            differ, None,
            "{name}: fused scores against the standalone indexer's"
        );
        // The fused launch stored the new keys as the standalone one did.
        assert!(
            step.cache.download().unwrap() == cache.download().unwrap(),
            "{name}: the caches differ after the launches"
        );

        // The standalone select over the fused scores.
        let longest = *graph.lens.iter().max().unwrap();
        let method = Method::fastest_for(longest);
        let shape = Shape::for_rows(method, graph.top, longest).unwrap();
        let selector = Selector::build(dev, method, shape, variant()).unwrap();
        let requests = graph.row_requests();
        let rows_in = Rows {
            scores: &scores,
            stride: graph.plan.stride as usize,
            lens: &graph.lens,
        };
        let pages = RowPages {
            table: &graph.pages,
            requests: &requests,
        };
        let batch = Batch::upload(dev, &selector, &rows_in, Some(&pages)).unwrap();
        batch.enqueue(&selector, stream, 1).unwrap();
        stream.sync().unwrap();
        let standalone = batch.read(&selector).unwrap();
        assert_eq!(
            first_difference(&lists, &standalone),
            None,
            "{name}: against the standalone select"
        );
        println!(
            "{name}: {} rows, {} runs, select {kind:?} (standalone {}): lists equal the reference and the standalone select; scores bit-equal to the standalone indexer's (worst {:.2e} of the row's largest)",
            graph.lens.len(),
            graph.plan.runs.len(),
            method.name(),
            stats.worst
        );
    }
}

/// Two launches of one step, the second with new queries: with `fault`, its select tasks read
/// scores before the runs wrote them. Returns whether the second launch's lists equal the
/// reference select of its own scores.
fn second_launch_matches(fault: Option<FrontFault>) -> bool {
    let cfg = ModelConfig::preset("glm-5").unwrap();
    let dims = IndexerDims::new(&cfg).unwrap();
    let dev = Device::open(0).expect("a GPU");
    let kernel = FrontKernel::build(&dev, &cfg, variant(), fault).unwrap();
    let requests = vec![r(4, 131_071), r(1, 30_000)];
    let scene = Scene::new(dims, requests, CacheKind::Random, 7);
    let cache_pages = (scene.bytes.len() as u64 / scene.cache.page_bytes()) as u32;
    let step = Step::new(&dev, &scene, &Inputs::random(&dims, 5, 1));
    let graph = FrontGraph::new(
        &cfg,
        &front_requests(&scene),
        kernel.build_info(cache_pages),
    )
    .unwrap();
    let launch = FrontLaunch::new(&dev, &kernel, graph, &step.inputs()).unwrap();
    let stream = dev.stream();
    launch.enqueue(&kernel, stream).unwrap();
    stream.sync().unwrap();
    step.query_proj
        .write(&Inputs::random(&dims, 5, 2).query_proj)
        .unwrap();
    launch.clear().unwrap();
    launch.enqueue(&kernel, stream).unwrap();
    stream.sync().unwrap();
    let lists = launch.read(&kernel).unwrap();
    let scores = launch.scores.download().unwrap();
    first_difference(&lists, &reference_lists(&launch.graph, &scores)).is_none()
}

#[test]
#[ignore = "needs a GPU"]
fn select_tasks_that_skip_their_wait_are_caught() {
    assert!(second_launch_matches(None), "the real wait must pass");
    assert!(
        !second_launch_matches(Some(FrontFault::SelectSkipsWait)),
        "select tasks that skip their wait read the previous launch's scores; the check missed it"
    );
    println!(
        "skipped waits: caught (the lists differ from the reference select of the launch's scores)"
    );
}

/// Two launches of one step of `requests` with list readers, the second with new queries: returns
/// whether what the second launch's readers copied equals its lists (which must equal the
/// reference select of its own scores and differ from the first launch's).
fn readers_see_the_second_launch(requests: Vec<Request>, fault: Option<FrontFault>) -> bool {
    let cfg = ModelConfig::preset("glm-5").unwrap();
    let dims = IndexerDims::new(&cfg).unwrap();
    let dev = Device::open(0).expect("a GPU");
    let options = FrontOptions {
        variant: variant(),
        fault,
        readers: true,
        trace: false,
    };
    let kernel = FrontKernel::build_with(&dev, &cfg, options).unwrap();
    let rows: u32 = requests.iter().map(|q| q.rows).sum();
    let scene = Scene::new(dims, requests, CacheKind::Random, 8);
    let cache_pages = (scene.bytes.len() as u64 / scene.cache.page_bytes()) as u32;
    let step = Step::new(&dev, &scene, &Inputs::random(&dims, rows as usize, 3));
    let graph = FrontGraph::new(
        &cfg,
        &front_requests(&scene),
        kernel.build_info(cache_pages),
    )
    .and_then(FrontGraph::with_readers)
    .unwrap();
    let launch = FrontLaunch::new(&dev, &kernel, graph, &step.inputs()).unwrap();
    let stream = dev.stream();
    launch.enqueue(&kernel, stream).unwrap();
    stream.sync().unwrap();
    let first = launch.read(&kernel).unwrap();
    step.query_proj
        .write(&Inputs::random(&dims, rows as usize, 4).query_proj)
        .unwrap();
    // The lists stay as the first launch left them: a reader that does not wait copies those.
    launch.enqueue(&kernel, stream).unwrap();
    stream.sync().unwrap();
    let lists = launch.read(&kernel).unwrap();
    let scores = launch.scores.download().unwrap();
    assert_eq!(
        first_difference(&lists, &reference_lists(&launch.graph, &scores)),
        None,
        "the second launch's lists against the reference"
    );
    assert!(first != lists, "new queries must change the lists");
    let copies = launch
        .read_copies()
        .unwrap()
        .expect("a kernel with readers");
    first_difference(&copies, &lists).is_none()
}

#[test]
#[ignore = "needs a GPU"]
fn list_readers_see_this_launchs_lists_and_skipped_waits_are_caught() {
    // Slices (a gang a row, the list box put by slice 0 after the others') and the registers kind.
    let cases = [
        ("128K x 4 + 30K x 1", vec![r(4, 131_071), r(1, 30_000)]),
        ("8K x 4", vec![r(4, 8191)]),
    ];
    for (name, requests) in cases {
        assert!(
            readers_see_the_second_launch(requests.clone(), None),
            "{name}: readers that wait must copy this launch's lists"
        );
        assert!(
            !readers_see_the_second_launch(requests, Some(FrontFault::ReaderSkipsWait)),
            "{name}: readers that skip the wait copy the previous launch's lists; the check missed it"
        );
        println!("{name}: readers that wait copy this launch's lists; skipped waits caught");
    }
}

/// Where a tiny case's rows are planned.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Planned {
    /// At their own positions: each row's length is its keys.
    AtPositions,
    /// As the step plans them (`step::layer::step::front_requests`): at the last positions their
    /// request's pages hold, the rows' true positions written to the device after
    /// ([`FrontLaunch::set_positions`]), so each row's scores past its position, up to the
    /// planned length, are masked (-inf) by the indexer, and select must skip them.
    AtCapacity,
}

struct TinyCase {
    name: &'static str,
    requests: Vec<Request>,
    kind: CacheKind,
    planned: Planned,
}

/// The tiny preset's cases (k = 16): ties (four keys repeated), a request of several rows, short
/// rows (6 keys, fewer than k) beside a longer request, and masked tails: rows of k - 1, k and
/// k + 1 keys among tied ones, planned over a page of 64 (no row is all masked: a row always sees
/// its own key). At most 3 rows a case: the host backend's launch of 8 CTAs
/// (`MONO_HOST_CTAS=8`) takes a key and a query CTA a row beside the scorers.
fn tiny_cases(k: u32) -> Vec<TinyCase> {
    let case = |name, requests, kind, planned| TinyCase {
        name,
        requests,
        kind,
        planned,
    };
    vec![
        case(
            "1 row of 300 keys, ties",
            vec![r(1, 299)],
            CacheKind::Ties,
            Planned::AtPositions,
        ),
        case(
            "3 rows of 1000 keys",
            vec![r(3, 999)],
            CacheKind::Random,
            Planned::AtPositions,
        ),
        case(
            "short rows (6 keys) and 2 rows of 41",
            vec![r(1, 5), r(2, 40)],
            CacheKind::Random,
            Planned::AtPositions,
        ),
        // Rows at positions k - 2 (k - 1 keys), k - 1 and k (k and k + 1 keys, one request).
        case(
            "masked tails: rows of k - 1, k and k + 1 keys planned at 64, ties",
            vec![r(1, k - 2), r(2, k)],
            CacheKind::Ties,
            Planned::AtCapacity,
        ),
    ]
}

/// The requests of `scene` as `planned`: at capacity through the step's own planning rule.
fn planned_requests(scene: &Scene, planned: Planned) -> Vec<FrontRequest> {
    let requests = front_requests(scene);
    if planned == Planned::AtPositions {
        return requests;
    }
    let batch = StepBatch {
        requests: requests
            .iter()
            .map(|q| RequestInput {
                tokens: vec![0; q.rows as usize],
                first_position: q.context,
                pages: q.pages.clone(),
            })
            .collect(),
        page_tokens: PAGE_TOKENS,
        pages_per_request: requests.iter().map(|q| q.pages.len() as u32).max().unwrap(),
    };
    step_front_requests(&batch)
}

/// How the inputs of a tiny launch are spoiled on their way to the device (the negative control).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Spoil {
    None,
    /// Every row's gate of head 3 is zero on the device: the head is dropped from the scores.
    DropHead3,
}

/// The masked contract on a launch's lists, from the page table alone: a row at `position` lists
/// slots of its request's positions `0..=position` only, each once (the rest of its planned
/// length is masked); a row of fewer than k such keys lists every one of them in position order,
/// then -1; a row of k or more lists k of them.
fn check_masked_lists(graph: &FrontGraph, positions: &[u32], lists: &[i32]) -> Result<(), String> {
    let k = graph.top.k() as usize;
    for (r, (row, &position)) in graph.plan.rows.iter().zip(positions).enumerate() {
        let request = row.request as usize;
        let list = &lists[r * k..(r + 1) * k];
        let visible: Vec<i32> = (0..=position)
            .map(|t| {
                graph
                    .pages
                    .slot(request, t)
                    .expect("a key inside its pages")
            })
            .collect();
        if let Some(e) = list.iter().find(|&&e| e != -1 && !visible.contains(&e)) {
            return Err(format!(
                "row {r} (position {position}) lists slot {e}, not a key of positions \
                 0..={position}: a masked key was selected"
            ));
        }
        if visible.len() < k {
            let mut want = visible;
            want.resize(k, -1);
            if list != want.as_slice() {
                return Err(format!(
                    "row {r} ({} keys, k = {k}) lists {list:?}, not its keys in position order \
                     then -1: {want:?}",
                    position + 1
                ));
            }
            continue;
        }
        let mut distinct = list.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != k || distinct[0] == -1 {
            return Err(format!(
                "row {r} ({} keys, k = {k}) does not list k distinct keys: {list:?}",
                position + 1
            ));
        }
    }
    Ok(())
}

/// The lists against the reference select of the launch's scores over the planned lengths
/// (masked tails included), entry by entry; against the reference over the rows' true lengths,
/// entry by entry for rows of fewer than k keys and as sets for the others (a row of exactly k
/// keys lists them by position, a longer row with k unmasked in the threshold's order: the
/// contract's two cases); and the masked contract read from the page table.
fn check_lists(
    graph: &FrontGraph,
    positions: &[u32],
    scores: &[f32],
    lists: &[i32],
) -> Result<(), String> {
    let want = reference_lists(graph, scores);
    if let Some(at) = first_difference(lists, &want) {
        return Err(format!(
            "list entry {at} is {}, the reference select's {}",
            lists[at], want[at]
        ));
    }
    let k = graph.top.k() as usize;
    let true_lens: Vec<u32> = positions.iter().map(|p| p + 1).collect();
    let over_true = reference_lists_over(graph, scores, &true_lens);
    for (r, (got, want)) in lists.chunks(k).zip(over_true.chunks(k)).enumerate() {
        let sorted = |l: &[i32]| {
            let mut l = l.to_vec();
            l.sort_unstable();
            l
        };
        let same = if (true_lens[r] as usize) < k {
            got == want
        } else {
            sorted(got) == sorted(want)
        };
        if !same {
            return Err(format!(
                "row {r} lists {got:?}; the reference select over its {} keys {want:?}",
                true_lens[r]
            ));
        }
    }
    check_masked_lists(graph, positions, lists)
}

/// The negative control of the masked contract's checks: for each row with a masked tail, its
/// list with the first masked key put in (in place of its first -1, else of its last entry) must
/// fail both the reference comparison and the page-table check. Returns what caught each.
fn masked_key_listed_is_caught(
    graph: &FrontGraph,
    positions: &[u32],
    scores: &[f32],
    lists: &[i32],
) -> Result<Vec<String>, String> {
    let k = graph.top.k() as usize;
    let want = reference_lists(graph, scores);
    let mut caught = Vec::new();
    for (r, (row, &position)) in graph.plan.rows.iter().zip(positions).enumerate() {
        if position + 1 >= graph.lens[r] {
            continue;
        }
        let masked = graph
            .pages
            .slot(row.request as usize, position + 1)
            .expect("a masked key inside its pages");
        let mut spoiled = lists.to_vec();
        let list = &mut spoiled[r * k..(r + 1) * k];
        let at = list.iter().position(|&e| e == -1).unwrap_or(k - 1);
        list[at] = masked;
        if first_difference(&spoiled, &want).is_none() {
            return Err(format!(
                "row {r}: a masked key listed passed the reference comparison"
            ));
        }
        let e = check_masked_lists(graph, positions, &spoiled)
            .err()
            .ok_or(format!(
                "row {r}: a masked key listed passed the page-table check"
            ))?;
        caught.push(e);
    }
    if caught.is_empty() {
        return Err("no row has a masked tail".into());
    }
    Ok(caught)
}

/// The tiny preset's front half (8 heads x 64 on the mma path with bf16 queries, k = 16) on the
/// device in hand, over `cases`: the published keys and queries against the indexer's reference
/// (with the kernel's reference options, [`KernelConfig::options`]), the scores against the
/// reference over the launch's own quantised keys and queries (-inf past each row's true
/// position), the cached new keys against the published ones, and the lists against the
/// reference radix select of the scores and the masked contract ([`check_lists`]); in a case
/// with masked tails, the control that a masked key listed is caught. One line a case, or the
/// first failure.
fn tiny_front(dev: &Device, cases: &[TinyCase], spoil: Spoil) -> Result<Vec<String>, String> {
    let cfg = ModelConfig::preset("tiny").unwrap();
    let kernel = FrontKernel::build(dev, &cfg, variant(), None).map_err(|e| e.to_string())?;
    let config = kernel.indexer();
    let dims = config.dims;
    let stream = dev.stream();
    let mut lines = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let name = case.name;
        let scene = Scene::new(dims, case.requests.clone(), case.kind, 60 + i as u64);
        let cache_pages = (scene.bytes.len() as u64 / scene.cache.page_bytes()) as u32;
        let rows: u32 = case.requests.iter().map(|q| q.rows).sum();
        let inputs = Inputs::random(&dims, rows as usize, 70 + i as u64);
        let step = Step::new(dev, &scene, &inputs);
        if spoil == Spoil::DropHead3 {
            let mut gates = inputs.gates.clone();
            gates
                .iter_mut()
                .skip(3)
                .step_by(dims.heads)
                .for_each(|g| *g = 0.0);
            step.gates.write(&gates).unwrap();
        }
        let graph = FrontGraph::new(
            &cfg,
            &planned_requests(&scene, case.planned),
            kernel.build_info(cache_pages),
        )
        .map_err(|e| format!("{name}: {e}"))?;
        // The rows' true positions, in the plan's order.
        let all: Vec<usize> = (0..case.requests.len()).collect();
        let true_rows = scene.rows(&all);
        assert!(true_rows
            .iter()
            .zip(&graph.plan.rows)
            .all(|(t, p)| t.request == p.request && t.position <= p.position));
        let positions: Vec<u32> = true_rows.iter().map(|t| t.position).collect();
        let launch = FrontLaunch::new(dev, &kernel, graph, &step.inputs()).unwrap();
        if case.planned == Planned::AtCapacity {
            launch
                .set_positions(&positions)
                .map_err(|e| format!("{name}: {e}"))?;
        }
        launch.enqueue(&kernel, stream).unwrap();
        stream.sync().unwrap();
        let lists = launch.read(&kernel).map_err(|e| format!("{name}: {e}"))?;
        let graph = &launch.graph;
        let words = launch.scratch().download().unwrap();
        let (queries, keys) = published(&config, &graph.boxes.indexer, &words, rows);
        let mut plan = graph.plan.clone();
        plan.rows = true_rows;
        let launched = Launched {
            plan,
            tag: 0,
            run_tags: Vec::new(),
            scores: launch.scores.download().unwrap(),
            queries,
            keys,
        };
        check_rows(&config, &launched, &inputs).map_err(|e| format!("{name}: {e}"))?;
        let stats = check_scores(&scene, &launched).map_err(|e| format!("{name}: {e}"))?;
        check_stored(&scene, &launched, &step.cache.download().unwrap())
            .map_err(|e| format!("{name}: {e}"))?;
        check_lists(graph, &positions, &launched.scores, &lists)
            .map_err(|e| format!("{name}: {e}"))?;
        let masked: u32 = graph
            .lens
            .iter()
            .zip(&positions)
            .map(|(len, p)| len - p - 1)
            .sum();
        lines.push(format!(
            "{name}: {} rows of {:?} keys ({masked} masked scores), {} runs, select {:?}: keys, \
             queries and scores match the reference (worst {:.2e} of the row's largest), lists \
             the reference select's and the masked contract",
            graph.lens.len(),
            positions.iter().map(|p| p + 1).collect::<Vec<_>>(),
            graph.plan.runs.len(),
            graph.select_kind,
            stats.worst
        ));
        if case.planned == Planned::AtCapacity {
            let caught = masked_key_listed_is_caught(graph, &positions, &launched.scores, &lists)
                .map_err(|e| format!("{name}: negative control: {e}"))?;
            for e in caught {
                lines.push(format!("  a masked key listed: caught ({e})"));
            }
        }
    }
    Ok(lines)
}

/// Also run on CPU threads in CI:
/// `MONO_BACKEND=host MONO_HOST_CTAS=8 cargo test --release -p executor --test gpu_front -- --ignored tiny`
#[test]
#[ignore = "needs a GPU"]
fn tiny_front_half_matches_the_reference() {
    let cfg = ModelConfig::preset("tiny").unwrap();
    let dev = Device::open(0).expect("a GPU");
    let config = KernelConfig::production(&cfg, &dev.info().arch).unwrap();
    assert!(!config.wgmma(), "the tiny preset scores on the mma path");
    assert_eq!(
        config.options(),
        IndexerOptions::kernels(&cfg),
        "the reference's options are the kernel's: bf16 queries, FP8 keys, the Hadamard rotation"
    );
    let k = cfg.index_topk as u32;
    assert!(
        k < PAGE_TOKENS,
        "the masked case's rows of k + 1 keys need a masked tail in their first page"
    );
    let cases = tiny_cases(k);
    for line in tiny_front(&dev, &cases, Spoil::None).unwrap_or_else(|e| panic!("{e}")) {
        println!("{line}");
    }
    let spoiled = tiny_front(&dev, &cases[..1], Spoil::DropHead3);
    assert!(
        spoiled.is_err(),
        "head 3's gate dropped on the device; the check missed it"
    );
    println!("head 3's gate dropped: caught ({})", spoiled.unwrap_err());
}
