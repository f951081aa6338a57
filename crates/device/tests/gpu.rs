//! GPU checks of the prelude's conversions, bit for bit against the `float8` and `half` crates.
//! Run on a GPU machine: `cargo test --release -p device --test gpu -- --ignored`.

use device::{Args, Device, Launch};
use float8::F8E4M3;
use half::bf16;

fn open() -> Device {
    Device::open(0).unwrap_or_else(|e| panic!("{e}"))
}

/// Normals, subnormals (of f32 and of E4M3), halfway cases, values past 448, +-0, +-inf, NaN.
fn sweep() -> Vec<u32> {
    let mut bits: Vec<u32> = Vec::new();
    for code in 0u32..=255 {
        let v = F8E4M3::from_bits(code as u8).to_f32();
        if v.is_finite() {
            let b = v.to_bits();
            // The value, its neighbours, and the midpoints to the next code (ties go to even).
            bits.extend([b, b.wrapping_add(1), b.wrapping_sub(1)]);
            let next = F8E4M3::from_bits((code as u8).wrapping_add(1)).to_f32();
            if next.is_finite() {
                let mid = (v as f64 + next as f64) / 2.0;
                let m = (mid as f32).to_bits();
                bits.extend([m, m + 1, m.wrapping_sub(1)]);
            }
        }
    }
    for v in [
        0.0f32,
        -0.0,
        448.0,
        449.0,
        463.99,
        464.0,
        464.01,
        480.0,
        1e4,
        3.4e38,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MIN_POSITIVE,
        1e-45,
        1.17e-38,
        0.0009765625,
        f32::from_bits(0x3a80_0001),
        0.0019531,
    ] {
        bits.extend([v.to_bits(), (-v).to_bits()]);
    }
    // bf16 ties: exactly halfway between two bf16 values, for even and odd lower halves.
    for hi in [0x3f80u32, 0x3f81, 0x4000, 0x4001, 0x7f7f, 0x0001] {
        bits.extend([
            (hi << 16) | 0x8000,
            (hi << 16) | 0x7fff,
            (hi << 16) | 0x8001,
        ]);
    }
    // A deterministic spread over all exponents.
    let mut x = 0x9e3779b9u32;
    for _ in 0..100_000 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        bits.push(x);
    }
    bits
}

#[test]
#[ignore = "needs a GPU"]
fn e4m3_all_codes_match_float8() {
    let dev = open();
    let module = dev.build(&device::probes::convert_source()).unwrap();
    let kernel = module.kernel("e4m3_all_codes").unwrap();
    let decoded = dev.alloc_zeroed::<u32>(256).unwrap();
    let reencoded = dev.alloc_zeroed::<u8>(256).unwrap();
    dev.stream()
        .launch(
            &kernel,
            Launch::new(1, 256),
            &Args::new().buf(&decoded).buf(&reencoded),
        )
        .unwrap();
    dev.stream().sync().unwrap();
    let (decoded, reencoded) = (decoded.download().unwrap(), reencoded.download().unwrap());
    let mut wrong = 0;
    for code in 0..256usize {
        let want = F8E4M3::from_bits(code as u8).to_f32();
        let want_back = F8E4M3::from_f32(want).to_bits();
        if decoded[code] != want.to_bits() || reencoded[code] != want_back {
            wrong += 1;
            eprintln!("code {code:#04x}: decoded {:#010x} want {:#010x}, re-encoded {:#04x} want {want_back:#04x}", decoded[code], want.to_bits(), reencoded[code]);
        }
    }
    assert_eq!(wrong, 0);
}

#[test]
#[ignore = "needs a GPU"]
fn f32_sweep_matches_float8_and_half() {
    let dev = open();
    for soft in [false, true] {
        let mut source = device::probes::convert_source();
        if soft {
            source = source.define("MONO_SOFT_FP8", 1);
        }
        let module = dev.build(&source).unwrap();
        let kernel = module.kernel("encode_f32").unwrap();
        let input = sweep();
        let n = input.len();
        let inp = dev.upload(&input).unwrap();
        let fast = dev.alloc_zeroed::<u8>(n).unwrap();
        let portable = dev.alloc_zeroed::<u8>(n).unwrap();
        let b16 = dev.alloc_zeroed::<u16>(n).unwrap();
        let args = Args::new()
            .buf(&inp)
            .buf(&fast)
            .buf(&portable)
            .buf(&b16)
            .u32(n as u32);
        dev.stream()
            .launch(&kernel, Launch::new((n as u32).div_ceil(256), 256), &args)
            .unwrap();
        dev.stream().sync().unwrap();
        let (fast, portable, b16) = (
            fast.download().unwrap(),
            portable.download().unwrap(),
            b16.download().unwrap(),
        );
        let mut wrong = [0usize; 3];
        for (i, &bits) in input.iter().enumerate() {
            let v = f32::from_bits(bits);
            let want8 = F8E4M3::from_f32(v).to_bits();
            let want16 = bf16::from_f32(v).to_bits();
            for (slot, (got, want)) in [
                (fast[i] as u16, want8 as u16),
                (portable[i] as u16, want8 as u16),
                (b16[i], want16),
            ]
            .into_iter()
            .enumerate()
            {
                if got != want {
                    if wrong[slot] < 8 {
                        eprintln!("soft={soft} path {slot}: {v:e} ({bits:#010x}) gave {got:#06x}, want {want:#06x}");
                    }
                    wrong[slot] += 1;
                }
            }
        }
        eprintln!("soft={soft}: {n} values, wrong (fast e4m3, portable e4m3, bf16) = {wrong:?}");
        assert_eq!(wrong, [0, 0, 0]);
    }
}

#[test]
#[ignore = "needs a GPU"]
fn graph_replays_its_launches() {
    let dev = open();
    let module = dev.build(&device::probes::copy_source()).unwrap();
    let bump = module.kernel("bump").unwrap();
    let counter = dev.alloc_zeroed::<u32>(1).unwrap();
    let stream = dev.new_stream().unwrap();
    let args = Args::new().buf(&counter);
    stream.begin_capture().unwrap();
    for _ in 0..79 {
        stream.launch(&bump, Launch::new(1, 32), &args).unwrap();
    }
    let graph = stream.end_capture().unwrap();
    assert_eq!(
        counter.download().unwrap()[0],
        0,
        "capture must not run the launches"
    );
    for _ in 0..3 {
        graph.launch(&stream).unwrap();
    }
    stream.sync().unwrap();
    assert_eq!(counter.download().unwrap()[0], 3 * 79);
}

#[test]
#[ignore = "needs a GPU"]
fn cooperative_launch_and_large_shared_memory() {
    let dev = open();
    let module = dev.build(&device::probes::copy_source()).unwrap();
    let bump = module.kernel("bump").unwrap();
    let grid = bump.max_coresident_grid(256, 200 * 1024).unwrap();
    assert!(
        grid >= dev.info().multiprocessors,
        "one 200 KiB block per SM must fit, got {grid}"
    );
    let counter = dev.alloc_zeroed::<u32>(1).unwrap();
    let launch = Launch::new(grid, 256).shared(200 * 1024).cooperative();
    dev.stream()
        .launch(&bump, launch, &Args::new().buf(&counter))
        .unwrap();
    dev.stream().sync().unwrap();
    assert_eq!(counter.download().unwrap()[0], 1);
    // Past the device's limit is refused before it reaches the driver.
    let too_big = Launch::new(1, 32).shared(dev.info().max_shared_per_block + 1);
    let err = dev
        .stream()
        .launch(&bump, too_big, &Args::new().buf(&counter))
        .unwrap_err();
    assert!(err.to_string().contains("dynamic shared memory"), "{err}");
}

#[test]
#[ignore = "needs a GPU"]
fn copy_moves_every_word_including_the_tail() {
    let dev = open();
    let module = dev.build(&device::probes::copy_source()).unwrap();
    let copy = module.kernel("copy_16b").unwrap();
    for count in [1usize, 31, 1_000_003] {
        let src: Vec<[u32; 4]> = (0..count as u32)
            .map(|i| [i, !i, i * 3, i ^ 0xdead_beef])
            .collect();
        let src_buf = dev.upload(&src).unwrap();
        let dst = dev.upload(&vec![[0xffff_ffffu32; 4]; count]).unwrap();
        let args = Args::new().buf(&src_buf).buf(&dst).u64(count as u64);
        dev.stream()
            .launch(&copy, Launch::new(7, 128), &args)
            .unwrap();
        dev.stream().sync().unwrap();
        assert!(dst.download().unwrap() == src, "count {count}");
        // Negative control: a copy told one word less leaves the poisoned last word, and the
        // same comparison reports it.
        let short = dev.upload(&vec![[0xffff_ffffu32; 4]; count]).unwrap();
        let args = Args::new().buf(&src_buf).buf(&short).u64(count as u64 - 1);
        dev.stream()
            .launch(&copy, Launch::new(7, 128), &args)
            .unwrap();
        dev.stream().sync().unwrap();
        assert!(
            short.download().unwrap() != src,
            "count {count}: a short copy went unnoticed"
        );
    }
}

/// Negative control for the conversion checks above (runs without a GPU): the sweep holds values
/// on which a truncating bf16 conversion and a non-saturating E4M3 conversion disagree with the
/// references, so a kernel with either mistake would be reported.
#[test]
fn sweep_catches_truncation_and_missing_saturation() {
    let input = sweep();
    let truncation_misses = input
        .iter()
        .filter(|&&b| {
            !f32::from_bits(b).is_nan()
                && (b >> 16) as u16 != bf16::from_f32(f32::from_bits(b)).to_bits()
        })
        .count();
    let overflow_to_nan = |v: f32| {
        if v.abs() > 464.0 {
            0x7f | ((v.to_bits() >> 24) as u8 & 0x80)
        } else {
            F8E4M3::from_f32(v).to_bits()
        }
    };
    let saturation_misses = input
        .iter()
        .map(|&b| f32::from_bits(b))
        .filter(|&v| overflow_to_nan(v) != F8E4M3::from_f32(v).to_bits())
        .count();
    assert!(truncation_misses > 1000, "{truncation_misses}");
    assert!(saturation_misses > 100, "{saturation_misses}");
}

#[test]
#[ignore = "needs a GPU"]
fn dynamic_shared_memory_beside_static_shared_memory() {
    let dev = open();
    let module = dev.build(&device::probes::copy_source()).unwrap();
    let kernel = module.kernel("shared_sum").unwrap();
    // 40 KiB dynamic + 16 KiB static: above the driver's default dynamic limit of 32 KiB here.
    for dynamic_words in [1024u32, 10 * 1024, 40 * 1024] {
        let input: Vec<u32> = (0..4096 + dynamic_words)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let want = input.iter().fold(0u32, |a, &b| a.wrapping_add(b));
        let inp = dev.upload(&input).unwrap();
        let out = dev.alloc_zeroed::<u32>(1).unwrap();
        assert!(kernel.max_coresident_grid(256, dynamic_words * 4).unwrap() > 0);
        let launch = Launch::new(1, 256).shared(dynamic_words * 4);
        dev.stream()
            .launch(
                &kernel,
                launch,
                &Args::new().buf(&inp).buf(&out).u32(dynamic_words),
            )
            .unwrap();
        dev.stream().sync().unwrap();
        assert_eq!(
            out.download().unwrap()[0],
            want,
            "{dynamic_words} dynamic words"
        );
    }
}

/// Each launch of a chain lets the next one in at its start, adds one to every word after
/// `mono_wait_prior()` (or without waiting), and lingers between its load and its store, so a
/// launch that loaded before the one before it had stored loses that one's add.
const CHAIN_SOURCE: &str = r#"
#include "prelude.h"
MONO_DEV void chain_step(u32* words, u64 linger_ns, bool wait) {
  mono_release_next();
  if (wait) mono_wait_prior();
  const u32 i = mono_block() * mono_block_dim() + mono_thread();
  const u32 v = words[i];
  const u64 until = mono_timer_ns() + linger_ns;
  while (mono_timer_ns() < until) {
  }
  words[i] = v + 1;
}
MONO_KERNEL void chain_waits(u32* words, u64 linger_ns) { chain_step(words, linger_ns, true); }
MONO_KERNEL void chain_races(u32* words, u64 linger_ns) { chain_step(words, linger_ns, false); }
"#;

#[test]
#[ignore = "needs a GPU"]
fn overlapping_launches_wait_for_the_one_before() {
    const LAUNCHES: u32 = 40;
    let dev = open();
    let module = dev
        .build(&device::KernelSource::new("chain.hip", CHAIN_SOURCE))
        .unwrap();
    let (grid, block) = (8, 64);
    let launch = Launch::new(grid, block).overlap_prior();
    let run = |name: &str, graph: bool| -> Vec<u32> {
        let kernel = module.kernel(name).unwrap();
        let words = dev.alloc_zeroed::<u32>((grid * block) as usize).unwrap();
        let args = Args::new().buf(&words).u64(5_000);
        let stream = dev.new_stream().unwrap();
        if graph {
            stream.begin_capture().unwrap();
        }
        for _ in 0..LAUNCHES {
            stream.launch(&kernel, launch, &args).unwrap();
        }
        if graph {
            stream.end_capture().unwrap().launch(&stream).unwrap();
        }
        stream.sync().unwrap();
        words.download().unwrap()
    };
    for graph in [false, true] {
        let words = run("chain_waits", graph);
        assert!(
            words.iter().all(|&w| w == LAUNCHES),
            "graph {graph}: every launch must count, got {:?}",
            &words[..8]
        );
    }
    // The negative control: without the wait the launches overlap and lose adds, where the
    // backend overlaps them at all (CUDA on sm_90 and later).
    let sm = dev
        .info()
        .arch
        .trim_start_matches("sm_")
        .trim_end_matches(char::is_alphabetic);
    if dev.info().backend == "CUDA" && sm.parse::<u32>().is_ok_and(|sm| sm >= 90) {
        let words = run("chain_races", false);
        assert!(
            words.iter().any(|&w| w < LAUNCHES),
            "launches that do not wait must have overlapped and lost adds"
        );
    }
}

/// `write_range` puts values where it is told and nowhere else; a range past the end is refused
/// and writes nothing.
#[test]
#[ignore = "needs a GPU"]
fn write_range_fills_only_its_range() {
    let dev = open();
    let buf = dev.upload(&[7u32; 10]).unwrap();
    buf.write_range(3, &[1, 2, 3]).unwrap();
    buf.write_range(9, &[9]).unwrap();
    buf.write_range(10, &[]).unwrap();
    assert_eq!(buf.download().unwrap(), [7, 7, 7, 1, 2, 3, 7, 7, 7, 9]);
    assert!(buf.write_range(8, &[5, 5, 5]).is_err());
    assert!(buf.write_range(usize::MAX, &[5]).is_err());
    assert_eq!(buf.download().unwrap(), [7, 7, 7, 1, 2, 3, 7, 7, 7, 9]);
}

/// The read chain (`device::probes::ReadChain`, the floor of a launch's chain of links) finishes
/// with every CTA counted on every link, for links of no bytes, of fewer words than CTAs and of
/// many, at 1 to 4 CTAs an SM where the SMs hold them (refused where they do not), the links
/// stamped complete in order; a bad depth or CTA count is refused. Negative control: a second launch without the reset leaves each
/// count at twice the grid, and `counted` says so.
#[test]
#[ignore = "needs a GPU"]
fn a_read_chain_counts_every_cta_on_every_link() {
    use device::probes::ReadChain;
    let dev = open();
    let stream = dev.stream();
    let chain = ReadChain::new(&dev, &[0, 16 * 5, 1 << 20, 0, 12_345]).unwrap();
    for (depth, ctas_per_sm) in [(4, 1), (8, 1), (4, 2), (8, 4)] {
        chain.reset(stream).unwrap();
        match chain.launch(&dev, stream, depth, ctas_per_sm) {
            Ok(()) => {
                stream.sync().unwrap();
                let counted = chain.counted().unwrap();
                assert!(counted, "depth {depth}, {ctas_per_sm} an SM");
                let ends = chain.link_ends_ns().unwrap();
                assert!(ends.windows(2).all(|w| w[0] <= w[1]), "{ends:?}");
            }
            // More CTAs than the SMs hold at once would spin forever: refused instead.
            Err(e) => assert!(ctas_per_sm > 1 && e.to_string().contains("resident"), "{e}"),
        }
    }
    chain.reset(stream).unwrap();
    chain.launch(&dev, stream, 4, 1).unwrap();
    chain.launch(&dev, stream, 4, 1).unwrap();
    stream.sync().unwrap();
    assert!(!chain.counted().unwrap(), "a launch without the reset");
    let err = chain.launch(&dev, stream, 6, 1).unwrap_err().to_string();
    assert!(err.contains("4 or 8"), "{err}");
    let err = chain.launch(&dev, stream, 4, 5).unwrap_err().to_string();
    assert!(err.contains("1 to 4"), "{err}");
    assert!(ReadChain::new(&dev, &[]).is_err());
}

/// The page chase (`device::pages::PageChase`) walks its chain to the element the chain says, at
/// strides of 64 KB and 2 MB, and refuses chains it cannot write; the sweep runs and refuses a
/// stride under 4 KB. Negative control: the same kernel walking a region where no chain was
/// written stays on element 0, which the end check tells from the chain's.
#[test]
#[ignore = "needs a GPU"]
fn a_page_chase_ends_where_its_chain_says() {
    use device::pages::{chain_end, pages_source, PageChase, PageSweep};
    let dev = open();
    let chase = PageChase::new(&dev, 32 << 20).unwrap();
    for (stride, n) in [(64u64 << 10, 2u32), (64 << 10, 256), (2 << 20, 16)] {
        let t = chase.walk(&dev, stride, n, 3 * n + 1).unwrap();
        assert!(
            t.ns_per_step.is_finite() && t.cycles_per_step > 0.0,
            "{t:?}"
        );
    }
    for (stride, n, what) in [
        (64u64 << 10, 3u32, "power of two"),
        (4 << 10, 2, "stride"),
        (96 << 10, 2, "stride"),
        (64 << 10, 1024, "do not fit"),
    ] {
        let err = chase.walk(&dev, stride, n, 1).unwrap_err().to_string();
        assert!(err.contains(what), "{err}");
    }
    let module = dev.build(&pages_source()).unwrap();
    let bare = dev.alloc_zeroed::<u8>(1 << 20).unwrap();
    let out = dev.alloc_zeroed::<u64>(3).unwrap();
    let args = Args::new().buf(&bare).u64(64 << 10).u32(3).buf(&out);
    dev.stream()
        .launch(
            &module.kernel("page_chase").unwrap(),
            Launch::new(1, 32),
            &args,
        )
        .unwrap();
    let end = out.download().unwrap()[2];
    assert_eq!(end, 0, "a walk of zeros stays on element 0");
    assert_ne!(
        end,
        u64::from(chain_end(16, 3)),
        "the end check tells them apart"
    );

    let sweep = PageSweep::new(&dev, 8 << 20).unwrap();
    let stream = dev.new_stream().unwrap();
    sweep.enqueue(&dev, &stream, 64 << 10).unwrap();
    stream.sync().unwrap();
    let err = sweep.enqueue(&dev, &stream, 1024).unwrap_err().to_string();
    assert!(err.contains("4 KB"), "{err}");
}

/// `Device::prewarm` compiles its sources into the module cache at once: the builds after it load
/// them, and a source it was not given (the control) is compiled when built.
#[test]
#[ignore = "needs a GPU"]
fn prewarmed_sources_build_from_the_cache() {
    let mut dev = open();
    let dir = std::env::temp_dir().join(format!("mono-prewarm-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dev.set_cache(device::ModuleCache::at(&dir));
    let plain = device::probes::copy_source();
    let [one, two, other] = [1, 2, 3].map(|n| plain.clone().define("MONO_PREWARM_PROBE", n));
    dev.prewarm(&[&one, &two]);
    for source in [&one, &two] {
        assert!(dev.build(source).unwrap().build_report().cached);
    }
    assert!(!dev.build(&other).unwrap().build_report().cached);
    let _ = std::fs::remove_dir_all(&dir);
}
