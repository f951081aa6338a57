//! The one CTA shape of a fused launch: every task of every stage runs in it.
//!
//! sm_90a (H100/H200): 512 threads (four warpgroups), one CTA per SM, at most 128 registers a
//! thread (`__launch_bounds__(512, 1)`), the SM's whole shared memory (227 KiB of dynamic shared
//! memory). Four warpgroups let a stage split the CTA into teams the way the wgmma scorer wants
//! (warpgroups stream pages while others compute), and 128 registers hold the wgmma accumulators;
//! one CTA a SM gives each task the SM's whole shared memory for its rings.
//!
//! gfx950 (MI355X): 512 threads (eight waves of 64), one CTA per CU, 160 KiB of LDS.
//!
//! What the shape costs each stage against its own best shape (H200, graph replays; the stages'
//! PERF.md have the runs): the indexer's scoring, as two 256-thread run teams in one CTA against
//! two 256-thread CTAs a SM, 128K x 1 row 11.25 against 9.78 us, 128K x 4 14.87 against 12.34,
//! 512K x 1 25.03 against 22.93, 512K x 4 36.35 against 32.27 (the later launch can start only
//! when the whole CTA is done, so overlapping launches gain little); select's registers kind at
//! 8K x 4 rows 5.25 against 4.40 us at 1024 threads, its slices at 128K x 4 12.26 against 11.80
//! at two CTAs a SM. The MLA attention and the linear task were written for this shape (93-101
//! and 94-96 registers, no spills). 384 threads, the other candidate on sm_90a, was not measured:
//! the wgmma scorer's page pairs and the attention's splits are laid out in warpgroup pairs.

use device::DeviceInfo;

/// Threads, the per-thread register cap that follows from one CTA a SM, and the dynamic shared
/// memory every task may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtaShape {
    pub threads: u32,
    pub shared_bytes: u32,
}

/// Largest dynamic shared memory a CTA may ask for on sm_90 (227 KiB).
const SM90_SHARED: u32 = 227 * 1024;
/// LDS of a gfx950 CU.
const GFX950_SHARED: u32 = 160 * 1024;

impl CtaShape {
    /// The shape for a compile target (`sm_90a` or `gfx950`), or the host backend's (`host`: CPU
    /// threads that run the NVIDIA source's paths, so sm_90a's shape).
    pub fn for_target(target: &str) -> Option<CtaShape> {
        match target {
            "sm_90a" | "host" => Some(CtaShape {
                threads: 512,
                shared_bytes: SM90_SHARED,
            }),
            "gfx950" => Some(CtaShape {
                threads: 512,
                shared_bytes: GFX950_SHARED,
            }),
            _ => None,
        }
    }

    /// The shape for the device in hand, capped by what it reports it can give a CTA.
    pub fn for_device(info: &DeviceInfo) -> Option<CtaShape> {
        let shape = CtaShape::for_target(&info.arch)?;
        Some(CtaShape {
            shared_bytes: shape.shared_bytes.min(info.max_shared_per_block),
            ..shape
        })
    }
}
