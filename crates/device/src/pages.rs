//! Address translation probes (`kernels/pages.hip`): how many pages the TLBs keep and what a page
//! past them costs ([`PageChase`]), and a sweep that pushes their entries out before a timed
//! launch ([`PageSweep`]). A decode step reads a few GB spread over a rank's whole weights; these
//! say whether its links find their translations kept from the step before.

use crate::device::{Args, Device};
use crate::error::{DeviceError, Result};
use crate::source::KernelSource;
use crate::{Buffer, Launch, Stream};

/// `page_chain_init`, `page_chase`, `page_sweep`.
pub fn pages_source() -> KernelSource {
    KernelSource::new("pages.hip", include_str!("../kernels/pages.hip"))
}

/// A sweep's load every this many bytes: one in every page, whether pages are 64 KB or 2 MB.
pub const SWEEP_STRIDE: u64 = 64 << 10;

/// The smallest page stride a chain takes: an element sits up to a stride past its page's start.
pub const MIN_STRIDE: u64 = 8 << 10;

fn size_error(message: String) -> DeviceError {
    DeviceError::Size { message }
}

/// The element after `i` in a chain of `n` (a power of two): `page_chain_next` of the kernel.
pub fn chain_next(i: u32, n: u32) -> u32 {
    (5u32.wrapping_mul(i).wrapping_add(1)) & (n - 1)
}

/// Where a walk of `steps` from element 0 ends in a chain of `n`.
pub fn chain_end(n: u32, steps: u32) -> u32 {
    (0..steps).fold(0, |i, _| chain_next(i, n))
}

/// One timed walk of a page chain.
#[derive(Clone, Copy, Debug)]
pub struct ChaseTime {
    /// Nanoseconds a dependent load, on the shared clock.
    pub ns_per_step: f64,
    /// The SM's cycles a dependent load.
    pub cycles_per_step: f64,
}

/// A dependent walk over pages of one region: `n` elements `stride` bytes apart, each load
/// waiting on the one before. Once the walk has warmed them, a step costs an L2 hit while its
/// pages' translations stay in the TLBs, and a translation more once `n` pages are more than
/// they keep: the step in ns against `n` shows each level's reach and cost.
pub struct PageChase {
    init: crate::Kernel,
    chase: crate::Kernel,
    _module: crate::Module,
    region: Buffer<u8>,
    out: Buffer<u64>,
}

impl PageChase {
    /// A chase over a region of `bytes` (zeroed: all of it mapped before the first walk).
    pub fn new(dev: &Device, bytes: usize) -> Result<Self> {
        let module = dev.build(&pages_source())?;
        Ok(PageChase {
            init: module.kernel("page_chain_init")?,
            chase: module.kernel("page_chase")?,
            _module: module,
            region: dev.alloc_zeroed(bytes.max(1))?,
            out: dev.alloc_zeroed(3)?,
        })
    }

    /// Bytes of the region a chain may span.
    pub fn region_bytes(&self) -> usize {
        self.region.len()
    }

    /// Writes a chain of `n` elements `stride` bytes apart, walks all of it once (its lines in
    /// L2, its translations in the TLBs as far as they reach), then times `steps` more; checks
    /// that the timed walk ended on the element the chain says.
    pub fn walk(&self, dev: &Device, stride: u64, n: u32, steps: u32) -> Result<ChaseTime> {
        if n < 2 || !n.is_power_of_two() {
            return Err(size_error(format!(
                "a page chain takes a power of two of at least 2 elements, not {n}"
            )));
        }
        if stride < MIN_STRIDE || !stride.is_power_of_two() {
            return Err(size_error(format!(
                "a page chain's stride is a power of two of at least {MIN_STRIDE} bytes, not \
                 {stride}"
            )));
        }
        if steps == 0 {
            return Err(size_error("a page chase times at least one step".into()));
        }
        let span = u64::from(n).checked_mul(stride);
        if span.is_none_or(|s| s > self.region.len() as u64) {
            return Err(size_error(format!(
                "{n} elements {stride} bytes apart do not fit the {}-byte region",
                self.region.len()
            )));
        }
        let stream = dev.stream();
        let init = Args::new().buf(&self.region).u64(stride).u32(n);
        stream.launch(&self.init, Launch::new(n.div_ceil(256), 256), &init)?;
        let run = |steps: u32| -> Result<[u64; 3]> {
            let args = Args::new()
                .buf(&self.region)
                .u64(stride)
                .u32(steps)
                .buf(&self.out);
            stream.launch(&self.chase, Launch::new(1, 32), &args)?;
            let out = self.out.download()?;
            Ok([out[0], out[1], out[2]])
        };
        run(n)?;
        let [ns, cycles, end] = run(steps)?;
        let expected = chain_end(n, steps);
        if end != u64::from(expected) {
            return Err(size_error(format!(
                "a page chase of {steps} steps over {n} elements ended on element {end}, not \
                 {expected}"
            )));
        }
        Ok(ChaseTime {
            ns_per_step: ns as f64 / f64::from(steps),
            cycles_per_step: cycles as f64 / f64::from(steps),
        })
    }
}

/// A load every `stride` bytes of a region, over the whole grid: enqueued before a timed launch,
/// it leaves the TLBs holding the region's pages rather than the launch's.
pub struct PageSweep {
    sweep: crate::Kernel,
    _module: crate::Module,
    sink: Buffer<u32>,
    region: Buffer<u8>,
}

impl PageSweep {
    /// A sweep over a zeroed region of `bytes`.
    pub fn new(dev: &Device, bytes: usize) -> Result<Self> {
        let module = dev.build(&pages_source())?;
        Ok(PageSweep {
            sweep: module.kernel("page_sweep")?,
            _module: module,
            sink: dev.alloc_zeroed(1)?,
            region: dev.alloc_zeroed(bytes.max(1))?,
        })
    }

    /// Bytes of the region it sweeps.
    pub fn region_bytes(&self) -> usize {
        self.region.len()
    }

    /// Enqueues one sweep on `stream`, a load every `stride` bytes (4 KB at least).
    pub fn enqueue(&self, dev: &Device, stream: &Stream, stride: u64) -> Result<()> {
        if stride < 4096 {
            return Err(size_error(format!(
                "a page sweep loads every 4 KB at most, not every {stride} bytes"
            )));
        }
        let args = Args::new()
            .buf(&self.region)
            .u64(self.region.len() as u64)
            .u64(stride)
            .buf(&self.sink);
        stream.launch(
            &self.sweep,
            Launch::new(dev.info().multiprocessors * 4, 256),
            &args,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chain's order is one cycle over every element, as the kernel's walk assumes.
    #[test]
    fn a_chain_visits_every_element_once_a_cycle() {
        for n in [2u32, 4, 64, 1 << 12] {
            let mut seen = vec![false; n as usize];
            let mut i = 0;
            for _ in 0..n {
                assert!(!seen[i as usize], "element {i} twice in a chain of {n}");
                seen[i as usize] = true;
                i = chain_next(i, n);
            }
            assert_eq!(i, 0, "a chain of {n} returns to its start");
            assert_eq!(chain_end(n, n), 0);
        }
        // Negative control: an even multiplier's order is not one cycle.
        let n = 64u32;
        let even = |i: u32| (6 * i + 1) & (n - 1);
        let mut i = 0;
        let returned = (1..=n).find(|_| {
            i = even(i);
            i == 0
        });
        assert_ne!(
            returned,
            Some(n),
            "6 i + 1 would have passed as a full cycle"
        );
    }
}
