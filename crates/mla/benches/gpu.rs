//! Sparse MLA attention on the GPU at GLM-5 TP8 shapes (8 heads, k = 2048, FP8 records): 1 row
//! and 4 verify rows of one request, at 8K and 128K contexts. Each figure is the median of 30
//! graph replays, the L2 flushed (a 256 MB memset) before each: "step us" is a graph of the epoch
//! node, the slot stand-in and the attention launch; "attention us" is that minus the same graph
//! without the attention launch. Beside it the floor (the distinct selected records' bytes over the
//! copy bandwidth measured in the same run) and "copy us", a graph of one copy kernel moving those
//! bytes (read and written once), timed the same way.
//! `cargo bench -p mla --bench gpu` on a GPU machine; prints "skipped" without one.

#[path = "../tests/support/mod.rs"]
mod support;

use device::{probes, Args, Device, Launch};
use model::CacheFormat;
use support::{kernel, shape, GpuScene, Pick, Request, Scene, PLAIN};

const TOPK: usize = 2048;
const TIMED: usize = 30;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), support::Error> {
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("mla gpu bench skipped: {e}");
            return Ok(());
        }
    };
    let bw = probes::copy_bandwidth(&dev, 256 << 20)?;
    println!("copy bandwidth {:.0} GB/s", bw.bytes_per_s / 1e9);
    let flush = dev.alloc_zeroed::<u8>(256 << 20)?;
    let copy_module = dev.build(&probes::copy_source())?;
    let copy = copy_module.kernel("copy_16b")?;
    let stream = dev.new_stream()?;
    let (t0, t1) = (dev.timer()?, dev.timer()?);
    let timed = |graph: &device::Graph| -> Result<f64, support::Error> {
        graph.upload(&stream)?;
        let mut us = Vec::new();
        for _ in 0..TIMED + 3 {
            stream.memset(flush.device_ptr(), 1, flush.len())?;
            t0.record(&stream)?;
            graph.launch(&stream)?;
            t1.record(&stream)?;
            t1.sync()?;
            us.push(f64::from(t0.elapsed_ms(&t1)?) * 1e3);
        }
        Ok(median(us[3..].to_vec()))
    };
    println!(
        "| rows | context | distinct slots | MB | step us | attention us | floor us | copy us |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for context in [8192usize, 131_072] {
        for rows in [1usize, 4] {
            let scene = Scene::new(
                shape(CacheFormat::Fp8, 8),
                TOPK,
                &[Request { context, rows }],
                Pick::Random,
                PLAIN,
                5,
            )?;
            let g = GpuScene::new(&dev, kernel(&dev, scene.shape, false)?, &scene, None, None)?;
            let with = g.graph(&stream, TOPK as u32, true)?;
            let without = g.graph(&stream, TOPK as u32, false)?;
            let step = timed(&with)?;
            let base = timed(&without)?;
            let err = scene.error(&g.out.download()?);
            let bytes = scene.distinct_slots * scene.shape.cache.bytes_per_token();
            let words = bytes.div_ceil(16);
            let src = dev.alloc_zeroed::<[u32; 4]>(words)?;
            let dst = dev.alloc_zeroed::<[u32; 4]>(words)?;
            stream.begin_capture()?;
            stream.launch(
                &copy,
                Launch::new(dev.info().multiprocessors * 4, 512),
                &Args::new().buf(&src).buf(&dst).u64(words as u64),
            )?;
            let copy_graph = stream.end_capture()?;
            let copy_us = timed(&copy_graph)?;
            let floor = 2.0 * bytes as f64 / bw.bytes_per_s * 1e6 / 2.0;
            println!(
                "| {rows} | {context} | {} | {:.2} | {step:.2} | {:.2} | {floor:.2} | {copy_us:.2} |  (error {err:.1e}, {} splits, {} combines)",
                scene.distinct_slots,
                bytes as f64 / 1e6,
                step - base,
                scene.plan.splits(),
                scene.plan.combines(),
            );
        }
    }
    Ok(())
}
