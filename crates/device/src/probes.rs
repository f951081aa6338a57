//! The device crate's own kernels: they prove the path from one HIP source to both targets, the
//! prelude's conversions, and the copy bandwidth that every memory-bound stage is measured against.

use crate::device::{Args, Device};
use crate::error::{DeviceError, Result};
use crate::source::KernelSource;
use crate::Launch;

/// `e4m3_all_codes`, `encode_f32`.
pub fn convert_source() -> KernelSource {
    KernelSource::new("convert.hip", include_str!("../kernels/convert.hip"))
}

/// `copy_16b`, `bump`, `shared_sum`, `read_chain4`, `read_chain8`.
pub fn copy_source() -> KernelSource {
    KernelSource::new("copy.hip", include_str!("../kernels/copy.hip"))
}

/// Every kernel source of this crate, for the build table.
pub fn sources() -> Vec<KernelSource> {
    vec![
        convert_source(),
        copy_source(),
        crate::pages::pages_source(),
    ]
}

/// The copy bandwidth of this device: `copy_16b` over `bytes` each way, event-timed, the median of
/// 10 launches at each of 2, 4 and 8 blocks of 512 threads per SM. The floor of every memory-bound
/// benchmark; the copied data is a pattern, checked after timing.
pub struct CopyBandwidth {
    /// Bytes read plus bytes written per second, at the best blocks-per-SM.
    pub bytes_per_s: f64,
    /// (blocks per SM, bytes per second) for each configuration tried.
    pub tried: Vec<(u32, f64)>,
}

pub fn copy_bandwidth(dev: &Device, bytes: usize) -> Result<CopyBandwidth> {
    let module = dev.build(&copy_source())?;
    let copy = module.kernel("copy_16b")?;
    let words = bytes / 16;
    let pattern: Vec<[u32; 4]> = (0..words as u32)
        .map(|i| [i, !i, i.rotate_left(7), i ^ 0x5bd1_e995])
        .collect();
    let src = dev.upload(&pattern)?;
    let dst = dev.alloc_zeroed::<[u32; 4]>(words)?;
    let stream = dev.new_stream()?;
    let (t0, t1) = (dev.timer()?, dev.timer()?);
    let args = Args::new().buf(&src).buf(&dst).u64(words as u64);
    let mut tried = Vec::new();
    for blocks_per_sm in [2u32, 4, 8] {
        let launch = Launch::new(dev.info().multiprocessors * blocks_per_sm, 512);
        stream.launch(&copy, launch, &args)?;
        let mut ms = Vec::new();
        for _ in 0..10 {
            t0.record(&stream)?;
            stream.launch(&copy, launch, &args)?;
            t1.record(&stream)?;
            t1.sync()?;
            ms.push(t0.elapsed_ms(&t1)?);
        }
        ms.sort_by(f32::total_cmp);
        let seconds = f64::from(ms[ms.len() / 2]) * 1e-3;
        tried.push((blocks_per_sm, 2.0 * (words * 16) as f64 / seconds));
    }
    if dst.download()? != pattern {
        return Err(DeviceError::Size {
            message: "copy_16b: the destination differs from the source".into(),
        });
    }
    let bytes_per_s = tried.iter().map(|t| t.1).fold(0.0, f64::max);
    Ok(CopyBandwidth { bytes_per_s, tried })
}

/// Bytes an [`L2Flush`] reads: five times the H100's 50 MB L2. (The MI355X's 256 MB Infinity Cache
/// behind its L2 would need more, should its benches be timed.)
pub const L2_FLUSH_BYTES: usize = 256 << 20;

/// Empties the L2 of a benchmark's data before a timed launch by reading [`L2_FLUSH_BYTES`] of a
/// buffer of its own (a one-link [`ReadChain`]). Reads leave the L2 full of clean lines, as a
/// step's launch finds it after launches that mostly read; a memset would leave dirty lines whose
/// write-back the timed launch pays while it streams (9 to 10 us of an 84 MB launch on the H100).
/// `MONO_L2_FLUSH=memset` flushes by that memset instead, to measure what it costs a bench.
pub struct L2Flush {
    how: FlushBy,
}

enum FlushBy {
    Reads(Box<ReadChain>),
    Memset(crate::Buffer<u8>),
}

impl L2Flush {
    /// The flush `MONO_L2_FLUSH` names: `reads` (the default, [`L2Flush::reads`]) or `memset`.
    pub fn new(dev: &Device) -> Result<Self> {
        match std::env::var("MONO_L2_FLUSH").as_deref() {
            Err(_) | Ok("reads") => Self::reads(dev),
            Ok("memset") => Self::memset(dev),
            Ok(other) => Err(DeviceError::Size {
                message: format!("MONO_L2_FLUSH={other}: `reads` (the default) or `memset`"),
            }),
        }
    }

    /// The flush by reads, whatever the environment says.
    pub fn reads(dev: &Device) -> Result<Self> {
        Ok(L2Flush {
            how: FlushBy::Reads(Box::new(ReadChain::new(dev, &[L2_FLUSH_BYTES])?)),
        })
    }

    /// The flush by a memset, which leaves the L2 full of dirty lines.
    pub fn memset(dev: &Device) -> Result<Self> {
        Ok(L2Flush {
            how: FlushBy::Memset(dev.alloc_zeroed(L2_FLUSH_BYTES)?),
        })
    }

    /// Enqueues the flush on `stream` (outside any graph the timed launch replays).
    pub fn enqueue(&self, dev: &Device, stream: &crate::Stream) -> Result<()> {
        match &self.how {
            FlushBy::Reads(reads) => {
                reads.reset(stream)?;
                reads.launch(dev, stream, 8, 1)
            }
            FlushBy::Memset(buffer) => stream.memset(buffer.device_ptr(), 0x5a, buffer.bytes()),
        }
    }
}

/// Threads of a [`ReadChain`] CTA: the fused launches' 512 on sm_90a.
pub const READ_CHAIN_THREADS: u32 = 512;

/// Largest number of links one [`ReadChain`] takes.
pub const READ_CHAIN_MAX_LINKS: usize = 64;

/// A chain of dependent reads (`read_chain4` / `read_chain8`): one CTA an SM (or a few) of
/// [`READ_CHAIN_THREADS`], link after link, each link's bytes read across the grid and handed to
/// the next through a grid-wide count, the next link's first loads issued before its wait. The
/// floor of a fused launch whose links stream weights one after another: what their bytes cost
/// with nothing but the reads and the hand-offs.
pub struct ReadChain {
    chain4: crate::Kernel,
    chain8: crate::Kernel,
    _module: crate::Module,
    src: crate::Buffer<[u32; 4]>,
    counters: crate::Buffer<u32>,
    sink: crate::Buffer<u32>,
    words: crate::Buffer<u64>,
    /// CTA 0's clock at its start and as it saw each link complete (`read_chain`).
    stamps: crate::Buffer<u64>,
    links: usize,
    /// CTAs of the last launch: what each link's count reaches.
    grid: std::cell::Cell<u32>,
}

impl ReadChain {
    /// A chain over links of `link_bytes` each (rounded down to 16-byte words).
    pub fn new(dev: &Device, link_bytes: &[usize]) -> Result<Self> {
        if link_bytes.is_empty() || link_bytes.len() > READ_CHAIN_MAX_LINKS {
            return Err(DeviceError::Size {
                message: format!(
                    "a read chain takes 1 to {READ_CHAIN_MAX_LINKS} links, not {}",
                    link_bytes.len()
                ),
            });
        }
        let module = dev.build(&copy_source())?;
        let words: Vec<u64> = link_bytes.iter().map(|b| (b / 16) as u64).collect();
        let total = words.iter().sum::<u64>().max(1) as usize;
        Ok(ReadChain {
            chain4: module.kernel("read_chain4")?,
            chain8: module.kernel("read_chain8")?,
            _module: module,
            src: dev.alloc_zeroed(total)?,
            counters: dev.alloc_zeroed(link_bytes.len())?,
            sink: dev.alloc_zeroed(1)?,
            words: dev.upload(&words)?,
            stamps: dev.alloc_zeroed(link_bytes.len() + 1)?,
            links: link_bytes.len(),
            grid: std::cell::Cell::new(0),
        })
    }

    /// Zeroes the links' counts on `stream`: before every launch.
    pub fn reset(&self, stream: &crate::Stream) -> Result<()> {
        stream.memset(self.counters.device_ptr(), 0, self.counters.bytes())
    }

    /// Launches the chain once on `stream` with `depth` (4 or 8) loads a thread in flight and
    /// `ctas_per_sm` CTAs an SM (1 to 4: all of them co-resident, as the counts' waits need),
    /// after a [`ReadChain::reset`].
    pub fn launch(
        &self,
        dev: &Device,
        stream: &crate::Stream,
        depth: u32,
        ctas_per_sm: u32,
    ) -> Result<()> {
        if !(1..=4).contains(&ctas_per_sm) {
            return Err(DeviceError::Size {
                message: format!("a read chain runs 1 to 4 CTAs an SM, not {ctas_per_sm}"),
            });
        }
        let kernel = match depth {
            4 => &self.chain4,
            8 => &self.chain8,
            _ => {
                return Err(DeviceError::Size {
                    message: format!(
                        "a read chain keeps 4 or 8 loads a thread in flight, not {depth}"
                    ),
                })
            }
        };
        let args = Args::new()
            .buf(&self.src)
            .buf(&self.words)
            .u32(self.links as u32)
            .buf(&self.counters)
            .buf(&self.sink)
            .buf(&self.stamps);
        let grid = dev.info().multiprocessors * ctas_per_sm;
        let resident = kernel.max_coresident_grid(READ_CHAIN_THREADS, 0)?;
        if grid > resident {
            // The counts' waits would spin on CTAs that cannot start.
            return Err(DeviceError::Size {
                message: format!(
                    "{ctas_per_sm} CTAs an SM of the {depth}-deep read chain are {grid}; only \
                     {resident} are resident at once"
                ),
            });
        }
        self.grid.set(grid);
        stream.launch(kernel, Launch::new(grid, READ_CHAIN_THREADS), &args)
    }

    /// When each link of the last launch was complete, ns after CTA 0 started, as CTA 0 saw it on
    /// the shared clock (after a sync).
    pub fn link_ends_ns(&self) -> Result<Vec<u64>> {
        let stamps = self.stamps.download()?;
        Ok(stamps[1..]
            .iter()
            .map(|&t| t.saturating_sub(stamps[0]))
            .collect())
    }

    /// Whether every CTA has counted itself on every link of the last launch (after a sync).
    pub fn counted(&self) -> Result<bool> {
        let grid = self.grid.get();
        Ok(self.counters.download()?.iter().all(|&c| c == grid))
    }
}
