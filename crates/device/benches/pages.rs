//! How many pages the TLBs keep and what a page past them costs: a dependent walk over n elements
//! a stride apart (`device::pages::PageChase`), warmed once, then timed, for n from 16 up to what
//! the region holds, at strides of 64 KB, 2 MB and 32 MB. While the walk's pages fit the TLBs a
//! step costs an L2 hit; each level they outgrow adds its miss. A GLM-5.2 TP8 rank's step reads
//! about 7 GB at 1 row from a ~93 GB arena (`mono info`), in pages that each link reaches for the
//! first time in the step: set the reach measured here beside it.
//! `cargo bench -p device --bench pages` on a GPU machine (`PAGES_BENCH_GB`: the region, default
//! the smaller of 64 GB and 70 % of the device's memory); prints "skipped" without one.

use device::pages::PageChase;
use device::report::{Figure, Reporter};
use device::Device;

const TABLE: &str = "address translation";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("pages bench skipped: {e}");
            return Ok(());
        }
    };
    let info = dev.info().clone();
    let default_gb = 64usize.min((info.total_memory * 7 / 10) >> 30);
    let gb = match std::env::var("PAGES_BENCH_GB") {
        Ok(v) => v
            .parse::<usize>()
            .map_err(|e| format!("PAGES_BENCH_GB={v}: {e}"))?,
        Err(_) => default_gb,
    };
    let chase = PageChase::new(&dev, gb << 30)?;
    let report = Reporter::from_env(&info.name);
    println!(
        "{}: a dependent walk over a {gb} GB region, warmed once, then timed (ns on the shared \
         clock, cycles on the SM's)",
        info.name
    );
    println!(
        "{:>8} {:>8} {:>10} {:>10} {:>10}",
        "stride", "pages", "span GB", "ns a step", "cycles"
    );
    for stride in [64u64 << 10, 2 << 20, 32 << 20] {
        let mut n = 16u32;
        while u64::from(n) * stride <= chase.region_bytes() as u64 && n <= 1 << 18 {
            let t = chase.walk(&dev, stride, n, n.max(4096))?;
            let span = u64::from(n) * stride;
            println!(
                "{:>7}K {n:>8} {:>10.3} {:>10.1} {:>10.0}",
                stride >> 10,
                span as f64 / (1u64 << 30) as f64,
                t.ns_per_step,
                t.cycles_per_step
            );
            report.write(
                &Figure::new(
                    TABLE,
                    &format!("a walk over {n} pages {} KB apart", stride >> 10),
                    "ns a dependent load, warmed",
                    t.ns_per_step,
                    "ns",
                )
                .note(&format!(
                    "{:.0} cycles a load; the walk spans {:.3} GB",
                    t.cycles_per_step,
                    span as f64 / (1u64 << 30) as f64
                )),
            )?;
            n *= 2;
        }
    }
    Ok(())
}
