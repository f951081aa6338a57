//! The floor of a fused launch's chain of links: the links' bytes read by a plain kernel
//! (`device::probes::ReadChain`: one CTA an SM, each link read across the grid and handed to the
//! next through a grid-wide count, its first loads issued before the wait), at the byte counts of a
//! GLM-5.2 TP8 rank's MoE shared-indexer launch at 1 row and at 4 rows. Beside it, in the same
//! run: the same bytes as one link (what the hand-offs cost), links with no bytes (the hand-offs
//! and the launch alone), the four links of the linear bench's chain, and the floor (bytes over
//! the copy bandwidth); and the 1-row launch's bytes as one link with 2 and 4 CTAs an SM (what
//! one CTA's streaming rate costs). Each case a direct launch, event-timed, the L2 flushed and the
//! counts zeroed before it, median of 20. The flush reads 256 MB of another buffer, so that the
//! launch finds the L2 full of clean lines, as a step's launch finds it after launches that mostly
//! read; at 4 loads also with the flush a 256 MB memset instead (the L2 left full of dirty lines,
//! whose write-back the launch then pays), and with the TLBs swept after the flush
//! (`device::pages::PageSweep`: a load every 64 KB of a region of `CHAIN_BENCH_SWEEP_GB`, default
//! 32, or 30 % of the device's memory if less), so that every link finds its pages' translations
//! gone, as a step's links may (the chain's own 84 MB otherwise keep theirs from one launch to the
//! next). Figures also as `device::report` records. Prints "skipped" without a GPU.
//! `cargo bench -p executor --bench chain`

use device::pages::{PageSweep, SWEEP_STRIDE};
use device::probes::ReadChain;
use device::report::{Figure, Reporter};
use device::timing::median;
use device::Device;
use model::{mla_cache_bytes_per_token, CacheFormat, ModelConfig, Storage, WeightFormat};

const TIMED: usize = 20;
const TP: usize = 8;
const TABLE: &str = "dependent reads";

type Error = Box<dyn std::error::Error>;

/// What runs before each timed launch, after the chain's counts are zeroed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Before {
    /// 256 MB of another buffer read: the L2 holds clean lines of it.
    ReadFlush,
    /// 256 MB written by a memset: the L2 holds dirty lines.
    WriteFlush,
    /// The read flush, then the TLBs swept.
    ReadFlushSwept,
}

/// A `[rows, cols]` FP8 matrix with its block scales, or a bf16 one, in bytes.
fn fp8(rows: usize, cols: usize) -> usize {
    Storage::Quantisable.bytes(rows, cols, WeightFormat::Fp8) as usize
}
fn bf16(rows: usize, cols: usize) -> usize {
    Storage::Bf16.bytes(rows, cols, WeightFormat::Fp8) as usize
}

/// The links of a MoE shared-indexer launch of `rows` rows whose rows chose `experts` distinct
/// experts, each with the bytes its tasks read from HBM (weights; each row's cache records, which
/// verify rows partly share): the chain `crates/executor/PERF.md`'s timeline shows.
fn moe_launch_links(cfg: &ModelConfig, rows: usize, experts: usize) -> Vec<(&'static str, usize)> {
    let h = cfg.hidden_size;
    let heads = cfg.num_attention_heads / TP;
    let qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim;
    let inter = cfg.moe_intermediate_size / TP;
    let record = mla_cache_bytes_per_token(cfg, CacheFormat::Fp8) as usize;
    let expert_gate_up = fp8(2 * inter, h);
    let expert_down = fp8(h, inter);
    vec![
        (
            "q_a, kv_a",
            fp8(cfg.q_lora_rank, h) + fp8(cfg.kv_lora_rank + cfg.qk_rope_head_dim, h),
        ),
        ("q_b", fp8(heads * qk, cfg.q_lora_rank)),
        ("W_UK", bf16(heads * cfg.qk_nope_head_dim, cfg.kv_lora_rank)),
        ("attention splits", rows * cfg.index_topk * record),
        ("attention combine", 0),
        ("W_UV", bf16(heads * cfg.v_head_dim, cfg.kv_lora_rank)),
        ("o_proj", fp8(h, heads * cfg.v_head_dim)),
        (
            "router, shared gate/up",
            bf16(cfg.n_routed_experts, h) + expert_gate_up,
        ),
        ("route", 0),
        (
            "routed gate/ups, shared down",
            experts * expert_gate_up + expert_down,
        ),
        ("routed downs", experts * expert_down),
        ("combine", 0),
    ]
}

fn main() -> Result<(), Error> {
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("dependent reads bench skipped: {e}");
            return Ok(());
        }
    };
    let reporter = Reporter::from_env(&dev.info().name);
    let cfg = ModelConfig::preset("glm-5.2")?;
    let bandwidth = device::probes::copy_bandwidth(&dev, 256 << 20)?.bytes_per_s;
    // Both flushes in one run, whatever MONO_L2_FLUSH says.
    let read_flush = device::probes::L2Flush::reads(&dev)?;
    let write_flush = device::probes::L2Flush::memset(&dev)?;
    let sweep_gb = match std::env::var("CHAIN_BENCH_SWEEP_GB") {
        Ok(v) => v
            .parse::<usize>()
            .map_err(|e| format!("CHAIN_BENCH_SWEEP_GB={v}: {e}"))?,
        Err(_) => 32usize.min((dev.info().total_memory * 3 / 10) >> 30),
    };
    let sweep = PageSweep::new(&dev, sweep_gb << 30)?;
    let stream = dev.new_stream()?;
    let (t0, t1) = (dev.timer()?, dev.timer()?);
    // A chain's median time a launch and, per link, the median of when CTA 0 saw it complete.
    let timed = |links: &[usize],
                 depth: u32,
                 ctas_per_sm: u32,
                 before: Before|
     -> Result<(f64, Vec<f64>), Error> {
        let chain = ReadChain::new(&dev, links)?;
        let mut times = Vec::new();
        let mut ends: Vec<Vec<f64>> = vec![Vec::new(); links.len()];
        for i in 0..=TIMED {
            if before == Before::WriteFlush {
                write_flush.enqueue(&dev, &stream)?;
            } else {
                read_flush.enqueue(&dev, &stream)?;
            }
            chain.reset(&stream)?;
            if before == Before::ReadFlushSwept {
                sweep.enqueue(&dev, &stream, SWEEP_STRIDE)?;
            }
            t0.record(&stream)?;
            chain.launch(&dev, &stream, depth, ctas_per_sm)?;
            t1.record(&stream)?;
            t1.sync()?;
            if !chain.counted()? {
                return Err("a read chain's CTA did not count itself on every link".into());
            }
            if i > 0 {
                times.push(f64::from(t0.elapsed_ms(&t1)?) * 1e3);
                for (all, ns) in ends.iter_mut().zip(chain.link_ends_ns()?) {
                    all.push(ns as f64 / 1e3);
                }
            }
        }
        Ok((median(&times), ends.iter().map(|e| median(e)).collect()))
    };
    let time = |links: &[usize], depth: u32, ctas_per_sm: u32| -> Result<f64, Error> {
        Ok(timed(links, depth, ctas_per_sm, Before::ReadFlush)?.0)
    };

    let one_row = moe_launch_links(&cfg, 1, cfg.num_experts_per_tok);
    // 26: the median of the distinct experts 4 rows chose in `mono bench`'s step at 8K.
    let four_rows = moe_launch_links(&cfg, 4, 26);
    let linear_chain = vec![
        fp8(cfg.q_lora_rank, cfg.hidden_size),
        fp8(
            cfg.hidden_size,
            cfg.num_attention_heads / TP * cfg.v_head_dim,
        ),
        fp8(2 * cfg.moe_intermediate_size / TP, cfg.hidden_size),
        fp8(cfg.hidden_size, cfg.moe_intermediate_size / TP),
    ];
    println!(
        "{}: copy bandwidth {:.2} TB/s; us a launch (direct, L2 flushed), one CTA an SM x {}; \
         memset: the L2 flushed by a memset; swept: the TLBs swept over {sweep_gb} GB first",
        dev.info().name,
        bandwidth / 1e12,
        device::probes::READ_CHAIN_THREADS
    );
    for ((name, one), (_, four)) in one_row.iter().zip(&four_rows) {
        println!(
            "  link {name:<30} {:>8.2} MB at 1 row, {:>8.2} at 4 rows",
            *one as f64 / 1e6,
            *four as f64 / 1e6
        );
    }
    let bytes_of = |links: &[(&str, usize)]| -> Vec<usize> { links.iter().map(|l| l.1).collect() };
    let mut cases: Vec<(&str, &str, Vec<usize>)> = Vec::new();
    for (case, links) in [
        ("MoE shared-indexer launch, 1 row", bytes_of(&one_row)),
        (
            "MoE shared-indexer launch, 4 rows, 26 experts",
            bytes_of(&four_rows),
        ),
    ] {
        let whole = links.iter().sum();
        cases.push((case, "12 links", links));
        cases.push((case, "its bytes as one link", vec![whole]));
    }
    cases.extend([
        ("hand-offs", "12 links of no bytes", vec![0; one_row.len()]),
        ("hand-offs", "1 link of no bytes", vec![0]),
        (
            "q_a, o_proj, gate/up, down",
            "4 links",
            linear_chain.clone(),
        ),
        (
            "q_a, o_proj, gate/up, down",
            "its bytes as one link",
            vec![linear_chain.iter().sum()],
        ),
        ("q_a", "1 link", vec![fp8(cfg.q_lora_rank, cfg.hidden_size)]),
    ]);
    println!(
        "{:<46} {:<24} {:>8} {:>9} {:>9} {:>9} {:>8} {:>9} {:>9}",
        "case", "what", "MB", "floor", "4 loads", "8 loads", "x floor", "4, memset", "4, swept"
    );
    // Each link's end in the two MoE chains, to set beside the step's trace of the same launch.
    let mut moe_link_ends = Vec::new();
    for (case, what, links) in cases {
        let bytes: usize = links.iter().sum();
        let floor = bytes as f64 / bandwidth * 1e6;
        let ((us4, ends), us8) = (timed(&links, 4, 1, Before::ReadFlush)?, time(&links, 8, 1)?);
        let (memset, _) = timed(&links, 4, 1, Before::WriteFlush)?;
        let (swept, swept_ends) = timed(&links, 4, 1, Before::ReadFlushSwept)?;
        if links.len() == one_row.len() && bytes > 0 {
            moe_link_ends.push((ends, swept_ends));
        }
        let best = us4.min(us8);
        println!(
            "{case:<46} {what:<24} {:>8.2} {floor:>9.2} {us4:>9.2} {us8:>9.2} {:>8.2} {memset:>9.2} {swept:>9.2}",
            bytes as f64 / 1e6,
            if bytes > 0 { best / floor } else { f64::NAN }
        );
        for (how, us) in [
            ("one CTA an SM, 4 loads a thread in flight", us4),
            ("one CTA an SM, 8 loads a thread in flight", us8),
            (
                "one CTA an SM, 4 loads a thread in flight, the L2 flushed by a memset",
                memset,
            ),
            (
                "one CTA an SM, 4 loads a thread in flight, the TLBs swept first",
                swept,
            ),
        ] {
            let mut figure = Figure::new(TABLE, &format!("{case}: {what}"), how, us, "us");
            if bytes > 0 {
                figure = figure.floor(floor, "bytes over the copy bandwidth of the same run");
            }
            reporter.write(&figure.note(&format!(
                "{}, {:.2} MB",
                links_label(links.len()),
                bytes as f64 / 1e6
            )))?;
        }
    }
    // The same one link with more CTAs an SM: more loads in flight than one CTA's 512 threads hold.
    let whole: usize = one_row.iter().map(|l| l.1).sum();
    let floor = whole as f64 / bandwidth * 1e6;
    for ctas_per_sm in [2, 4] {
        let us = match time(&[whole], 4, ctas_per_sm) {
            Ok(us) => us,
            Err(e) => {
                println!("one link, {ctas_per_sm} CTAs an SM: not run ({e})");
                continue;
            }
        };
        println!(
            "{:<46} {:<24} {:>8.2} {floor:>9.2} {us:>9.2} {:>9} {:>8.2}",
            "MoE shared-indexer launch, 1 row",
            format!("one link, {ctas_per_sm} CTAs an SM"),
            whole as f64 / 1e6,
            "",
            us / floor
        );
        reporter.write(
            &Figure::new(
                TABLE,
                "MoE shared-indexer launch, 1 row: its bytes as one link",
                &format!("{ctas_per_sm} CTAs an SM, 4 loads a thread in flight"),
                us,
                "us",
            )
            .floor(floor, "bytes over the copy bandwidth of the same run")
            .note(&format!("1 link, {:.2} MB", whole as f64 / 1e6)),
        )?;
    }
    println!(
        "link ends, us after CTA 0's start (median of {TIMED}, one CTA an SM, 4 loads; swept: the \
         TLBs swept first):"
    );
    println!(
        "{:<30} {:>10} {:>10} {:>10} {:>10}",
        "link", "1 row", "swept", "4 rows", "swept"
    );
    let [(one, one_swept), (four, four_swept)] = &moe_link_ends[..] else {
        return Err("the two MoE chains' link ends".into());
    };
    for (i, (name, _)) in one_row.iter().enumerate() {
        println!(
            "{name:<30} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
            one[i], one_swept[i], four[i], four_swept[i]
        );
    }
    Ok(())
}

fn links_label(n: usize) -> String {
    if n == 1 {
        "1 link".into()
    } else {
        format!("{n} links")
    }
}
