//! GPU figures of the device layer, event-timed: copy bandwidth (against the HBM floor), NVRTC build
//! cold and from the cache, and 79 launches issued directly vs replayed from one graph.
//! `cargo bench -p device --bench probes` on a GPU machine; prints "skipped" without one. With
//! `MONO_BENCH_JSON=file` it also appends its figures there as records (`device::report`).

use device::report::{Figure, Reporter};
use device::timing::median;
use device::{Args, Device, Launch, ModuleCache};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("probes skipped: {e}");
            return Ok(());
        }
    };
    let info = dev.info().clone();
    println!(
        "device: {} ({}, {} SMs, {:.1} GiB, {})",
        info.name,
        info.arch,
        info.multiprocessors,
        info.total_memory as f64 / (1u64 << 30) as f64,
        info.driver_version
    );
    println!("compiler: {}", dev.compiler_version());
    let report = Reporter::from_env(&info.name);

    // Build: cold (fresh cache, first NVRTC use), cold again with NVRTC warm, then from the cache.
    let dir = std::env::temp_dir().join(format!("mono-probe-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dev.set_cache(ModuleCache::at(&dir));
    let t = Instant::now();
    let module = dev.build(&device::probes::copy_source())?;
    let first = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    dev.build(&device::probes::copy_source().define("MONO_PROBE_VARIANT", 1))?;
    let warm_compiler = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let again = dev.build(&device::probes::copy_source())?;
    let cached = t.elapsed().as_secs_f64() * 1e3;
    assert!(again.build_report().cached && !module.build_report().cached);
    println!("build copy.hip: first {first:.1} ms (cold NVRTC), {warm_compiler:.1} ms (compiler warm, cache miss), {cached:.2} ms (from the cache, load included)");
    for (what, ms) in [
        ("first build (compiler cold)", first),
        ("build, compiler warm, cache miss", warm_compiler),
    ] {
        report.write(
            &Figure::new("device", "build of copy.hip", what, ms, "ms")
                .baseline(cached, "from the on-disk cache, load included"),
        )?;
    }
    let _ = std::fs::remove_dir_all(&dir);

    // Copy bandwidth: 2 GiB read + 2 GiB written per copy.
    let bandwidth = device::probes::copy_bandwidth(&dev, 2 << 30)?;
    for (blocks_per_sm, bytes_per_s) in &bandwidth.tried {
        println!(
            "copy_16b {blocks_per_sm} blocks/SM x 512: {:.2} TB/s (read + written)",
            bytes_per_s / 1e12
        );
    }
    println!(
        "copy bandwidth: {:.2} TB/s best, destination checked",
        bandwidth.bytes_per_s / 1e12
    );
    report.write(&Figure::new(
        "device",
        "copy, 2 GiB read + 2 GiB written",
        "copy_16b, best of 2/4/8 blocks an SM",
        bandwidth.bytes_per_s / 1e12,
        "TB/s",
    ))?;

    let stream = dev.new_stream()?;
    let (t0, t1) = (dev.timer()?, dev.timer()?);
    // 79 launches (one step's layer launches) issued directly vs replayed from one captured graph.
    let bump = module.kernel("bump")?;
    let counter = dev.alloc_zeroed::<u32>(1)?;
    let bargs = Args::new().buf(&counter);
    let one = Launch::new(1, 32);
    let direct = |stream: &device::Stream| -> device::Result<f64> {
        t0.record(stream)?;
        for _ in 0..79 {
            stream.launch(&bump, one, &bargs)?;
        }
        t1.record(stream)?;
        t1.sync()?;
        Ok(t0.elapsed_ms(&t1)? as f64 * 1e3)
    };
    direct(&stream)?;
    let direct_us = median(
        &(0..50)
            .map(|_| direct(&stream))
            .collect::<Result<Vec<_>, _>>()?,
    );
    stream.begin_capture()?;
    for _ in 0..79 {
        stream.launch(&bump, one, &bargs)?;
    }
    let graph = stream.end_capture()?;
    graph.upload(&stream)?;
    let replay = || -> device::Result<f64> {
        t0.record(&stream)?;
        graph.launch(&stream)?;
        t1.record(&stream)?;
        t1.sync()?;
        Ok(t0.elapsed_ms(&t1)? as f64 * 1e3)
    };
    replay()?;
    let graph_us = median(&(0..50).map(|_| replay()).collect::<Result<Vec<_>, _>>()?);
    let expected = 79 * (1 + 50 + 1 + 50);
    let got = counter.download()?[0];
    println!("79 launches: direct {direct_us:.1} us, one graph {graph_us:.1} us (median of 50; counter {got}, expected {expected})");
    if got != expected {
        return Err(format!("counter {got} != {expected}").into());
    }
    report.write(
        &Figure::new(
            "device",
            "79 launches of a one-thread kernel",
            "issued directly",
            direct_us,
            "us",
        )
        .baseline(graph_us, "replayed from one captured graph"),
    )?;
    Ok(())
}
