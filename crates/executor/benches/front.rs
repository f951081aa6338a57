//! The front half's fused launch against the standalone pair, on a GPU: for 8K and 128K keys x 1
//! and 4 rows of one request, the median of TIMED graph replays, the L2 flushed before each, of
//! COPIES steps back to back, each on its own copy of the cache, divided by COPIES (what a step
//! costs when it follows another, as inside a captured step): (a) the epoch node and the fused
//! launch, (b) the standalone indexer's whole-stage launch and the standalone select's launch
//! (each with its epoch node); beside the floor: the
//! index-key pages the scorers read plus the scores written and read, over the copy bandwidth
//! measured in the same run. Records go to `MONO_BENCH_JSON` (table "fused front half").
//!
//! `cargo bench -p executor --bench front` on a GPU machine; prints "skipped" without one.

#[path = "../../indexer/tests/support/mod.rs"]
mod support;

use device::report::{Figure, Reporter};
use device::Device;
use executor::fused::front::{FrontGraph, FrontRequest};
use executor::fused::front_gpu::{FrontInputs, FrontKernel, FrontLaunch};
use indexer::gpu::KernelConfig;
use indexer::reference::{IndexerDims, IndexerOptions};
use mailbox::gpu::{EpochNode, Variant};
use model::ModelConfig;
use select::gpu::{Batch, Method, Selector, Shape};
use select::reference::{Pages, Rows};
use support::{CacheKind, Error, Inputs, LaunchBuffers, Request, Scene, Stage};

const TIMED: usize = 30;
const COPIES: usize = 6;
const CASES: [(u32, u32); 4] = [(8192, 1), (8192, 4), (131_072, 1), (131_072, 4)];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<(), Error> {
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("fused front bench skipped: {e}");
            return Ok(());
        }
    };
    let cfg = ModelConfig::preset("glm-5")?;
    let dims = IndexerDims::new(&cfg)?;
    let config = KernelConfig::new(dims, &IndexerOptions::deepseek(&cfg))?;
    let stage = Stage::new(dev, config)?;
    let dev = &stage.dev;
    let reporter = Reporter::from_env(&dev.info().name);
    let fused = FrontKernel::build(dev, &cfg, Variant::default(), None)?;
    let epoch_node = EpochNode::build(dev, Variant::default())?;
    let bandwidth = device::probes::copy_bandwidth(dev, 1 << 30)?.bytes_per_s;
    let flush = dev.alloc_zeroed::<u8>(256 << 20)?;
    let stream = dev.new_stream()?;
    let (t0, t1) = (dev.timer()?, dev.timer()?);
    let graph_us = |issue: &dyn Fn() -> Result<(), Error>| -> Result<f64, Error> {
        stream.begin_capture()?;
        issue()?;
        let graph = stream.end_capture()?;
        graph.upload(&stream)?;
        let mut times = Vec::new();
        for i in 0..=TIMED {
            stream.memset(flush.device_ptr(), i as u8, flush.bytes())?;
            t0.record(&stream)?;
            graph.launch(&stream)?;
            t1.record(&stream)?;
            t1.sync()?;
            if i > 0 {
                times.push(f64::from(t0.elapsed_ms(&t1)?) * 1e3 / COPIES as f64);
            }
        }
        Ok(median(times))
    };
    println!(
        "\nfused front half, GLM-5, median of {TIMED} graph replays of {COPIES} steps, L2 flushed before each; copy bandwidth {:.2} TB/s",
        bandwidth / 1e12
    );
    println!(
        "{:<10} {:>9} {:>9} {:>7} {:>9} {:>7}",
        "case", "fused us", "pair us", "ratio", "floor us", "x floor"
    );
    for (keys, rows) in CASES {
        let request = Request {
            rows,
            last_position: keys - 1,
        };
        let scene = Scene::new(dims, vec![request], CacheKind::Random, 3);
        let cache_pages = (scene.bytes.len() as u64 / scene.cache.page_bytes()) as u32;
        let inputs = Inputs::random(&dims, rows as usize, 4);
        let caches = (0..COPIES)
            .map(|_| dev.upload(&scene.bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let key_proj = dev.upload(&inputs.key_proj)?;
        let query_proj = dev.upload(&inputs.query_proj)?;
        let gates = dev.upload(&inputs.gates)?;
        let norm_weight = dev.upload(&inputs.norm_weight)?;
        let norm_bias = dev.upload(&inputs.norm_bias)?;
        let requests = [FrontRequest {
            context: request.first_position(),
            rows,
            pages: scene.table.pages(0).to_vec(),
        }];
        let graph = FrontGraph::new(&cfg, &requests, fused.build_info(cache_pages))?;
        let floor_us = graph.floor_bytes(dims.head_dim as u32) as f64 / bandwidth * 1e6;
        let launches = caches
            .iter()
            .map(|cache| {
                let front = FrontInputs {
                    key_proj: &key_proj,
                    query_proj: &query_proj,
                    gates: &gates,
                    norm_weight: &norm_weight,
                    norm_bias: &norm_bias,
                    cache,
                };
                FrontLaunch::new(dev, &fused, graph.clone(), &front)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let fused_us = graph_us(&|| {
            for launch in &launches {
                launch.enqueue(&fused, &stream)?;
            }
            Ok(())
        })?;

        // The standalone pair: the indexer's whole stage, then select over scores of that shape.
        let plan = stage.plan(&scene, &[0])?;
        let buffers = LaunchBuffers::new(&stage, &scene, &plan, &inputs)?;
        let lens: Vec<u32> = plan.rows.iter().map(|r| r.position + 1).collect();
        let scores = vec![0.0f32; lens.len() * plan.stride as usize];
        let method = Method::fastest_for(keys);
        let shape = Shape::for_rows(method, fused.top(), keys)?;
        let selector = Selector::build(dev, method, shape, Variant::default())?;
        let pages_stride = (plan.stride / indexer::layout::PAGE_TOKENS) as usize;
        let table: Vec<i32> = (0..lens.len())
            .flat_map(|_| {
                let mut row: Vec<i32> = scene.table.pages(0).iter().map(|&p| p as i32).collect();
                row.resize(pages_stride, 0);
                row
            })
            .collect();
        let rows_in = Rows {
            scores: &scores,
            stride: plan.stride as usize,
            lens: &lens,
        };
        let pages = Pages {
            table: &table,
            stride: pages_stride,
        };
        let batches = (0..COPIES)
            .map(|_| Batch::upload(dev, &selector, &rows_in, Some(&pages)))
            .collect::<Result<Vec<_>, _>>()?;
        let pair_us = graph_us(&|| {
            for (cache, batch) in caches.iter().zip(&batches) {
                epoch_node.enqueue(&stream, &stage.epoch, &stage.scratch, stage.tags)?;
                stage
                    .kernels
                    .launch(&stream, &buffers.stage(&stage, cache, cache))?;
                batch.enqueue(&selector, &stream, 1)?;
            }
            Ok(())
        })?;
        let case = format!("{}K x {rows}", keys / 1024);
        println!(
            "{case:<10} {fused_us:>9.2} {pair_us:>9.2} {:>7.2} {floor_us:>9.2} {:>7.2}",
            fused_us / pair_us,
            fused_us / floor_us
        );
        let note = format!(
            "standalone pair: indexer whole stage + select {}",
            method.name()
        );
        reporter.write(
            &Figure::new("fused front half", &case, "fused launch", fused_us, "us")
                .floor(
                    floor_us,
                    "index-key pages + scores written and read, over copy bandwidth",
                )
                .baseline(pair_us, "standalone indexer + select, same graph replays")
                .note(&note),
        )?;
    }
    Ok(())
}
