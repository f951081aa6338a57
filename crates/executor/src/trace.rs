//! `mono trace`: every task's start and end, drawn as a Chrome / Perfetto trace and an SVG of the
//! per-CTA timeline (`mailbox::trace`). The step's launches ([`step`], run by
//! `step::cli::trace_step`), each task named in words ([`names`]); or a synthetic placement (a
//! random DAG of hash tasks, here), on the CPU emulator and on the GPU.

pub mod names;
pub mod step;
pub mod tiles;

use device::Device;
use mailbox::emulator::{run_traced, EmuConfig, Scratch};
use mailbox::gpu::{SyntheticKernel, Variant};
use mailbox::placement::{Limits, ValidPlacement};
use mailbox::synth::{self, DagShape, SynthDag, Synthetic};
use mailbox::trace::{chrome, decode, svg, CycleClock, Recorder, TimeBase, Timeline};
use std::path::{Path, PathBuf};

/// The synthetic launch to trace.
#[derive(Clone, Copy, Debug)]
pub struct SyntheticRequest {
    /// CTAs (`None`: [`EMULATED_CTAS`] on the emulator, one per SM on the GPU).
    pub ctas: Option<u32>,
    pub tasks_per_cta: u32,
    pub seed: u64,
}

/// CTAs of an emulated launch unless asked: one thread each, on a machine of few cores.
pub const EMULATED_CTAS: u32 = 8;

/// Where a traced launch's drawings went.
#[derive(Clone, Debug)]
pub struct Written {
    pub json: PathBuf,
    pub svg: PathBuf,
    /// One line: what ran and how long.
    pub summary: String,
}

fn dag(ctas: u32, req: &SyntheticRequest) -> Result<(SynthDag, u32), String> {
    if ctas == 0 || req.tasks_per_cta == 0 {
        return Err("--ctas and --tasks-per-cta must be positive".to_string());
    }
    let tasks = ctas
        .checked_mul(req.tasks_per_cta)
        .ok_or_else(|| format!("{ctas} CTAs x {} tasks is too many", req.tasks_per_cta))?;
    let shape = DagShape {
        tasks,
        leaves: (ctas / 2).max(1),
        max_inputs: 4,
        max_row: synth::ROW_MAX,
        window: 2 * ctas,
    };
    Ok((
        SynthDag::random(req.seed, shape).map_err(|e| e.to_string())?,
        ctas,
    ))
}

fn place(d: &SynthDag, ctas: u32, max_resident: u32, seed: u64) -> Result<ValidPlacement, String> {
    let limits = Limits {
        max_resident,
        scratch_boxes: d.layout.boxes(),
    };
    d.place_random(ctas, seed)
        .check(limits)
        .map_err(|e| e.to_string())
}

fn write(dir: &Path, timeline: &Timeline, summary: String) -> Result<Written, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let json = dir.join("trace.json");
    let svg_path = dir.join("trace.svg");
    for (path, text) in [
        (&json, chrome::json(timeline)),
        (&svg_path, svg::svg(timeline)),
    ] {
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(Written {
        json,
        svg: svg_path,
        summary,
    })
}

/// Runs the synthetic placement on the CPU emulator (a thread per CTA, the host's clock) and
/// writes `out/trace.json` and `out/trace.svg`.
pub fn emulated(req: &SyntheticRequest, out: &Path) -> Result<Written, String> {
    let (d, ctas) = dag(req.ctas.unwrap_or(EMULATED_CTAS), req)?;
    let valid = place(&d, ctas, ctas, req.seed)?;
    let inputs = d.random_inputs(req.seed);
    let task_fn = Synthetic {
        inputs: &inputs,
        step: 0,
    };
    let rec = Recorder::new(valid.placement());
    let scratch = Scratch::new(d.layout.boxes());
    run_traced(&valid, &scratch, 1, &EmuConfig::default(), &task_fn, &rec)
        .map_err(|e| e.to_string())?;
    let trace = decode(&valid.placement().table(), &rec.words()).map_err(|e| e.to_string())?;
    let title = format!(
        "synthetic launch on the CPU emulator: {} tasks, {ctas} CTAs, seed {}",
        d.tasks.len(),
        req.seed
    );
    let timeline = Timeline::new(&trace, TimeBase::Timer, &title, &synth::kind_name);
    let summary = format!(
        "emulator: {} tasks on {ctas} CTAs in {:.1} us",
        d.tasks.len(),
        timeline.end_us()
    );
    write(out, &timeline, summary)
}

/// Runs the synthetic placement on `dev` with the trace on (the second of two launches, so the
/// module is loaded) and writes `out/trace.json` and `out/trace.svg`. Spans are placed by each
/// SM's cycles from its CTA's first start on the shared clock (whose steps are coarser).
pub fn on_gpu(dev: &Device, req: &SyntheticRequest, out: &Path) -> Result<Written, String> {
    let kernel =
        SyntheticKernel::build_traced(dev, Variant::default()).map_err(|e| e.to_string())?;
    let resident = kernel.max_resident().map_err(|e| e.to_string())?;
    let ctas = req
        .ctas
        .unwrap_or_else(|| resident.min(dev.info().multiprocessors));
    let (d, ctas) = dag(ctas, req)?;
    let valid = place(&d, ctas, resident, req.seed)?;
    let inputs = d.random_inputs(req.seed);
    let run = kernel
        .run_traced(dev, &d, &valid, &inputs)
        .map_err(|e| e.to_string())?;
    let trace = decode(&valid.placement().table(), &run.trace).map_err(|e| e.to_string())?;
    let base = CycleClock::from_khz(dev.info().clock_khz).map_or(TimeBase::Timer, TimeBase::Cycles);
    let title = format!(
        "synthetic launch on {}: {} tasks, {ctas} CTAs, seed {}",
        dev.info().name,
        d.tasks.len(),
        req.seed
    );
    let timeline = Timeline::new(&trace, base, &title, &synth::kind_name);
    let summary = format!(
        "gpu ({}): {} tasks on {ctas} CTAs in {:.1} us (launch by events {:.1} us)",
        dev.info().name,
        d.tasks.len(),
        timeline.end_us(),
        run.kernel_ms * 1000.0
    );
    write(out, &timeline, summary)
}

/// The CLI's run: the emulator always, the GPU when one opens (and `gpu` is true).
pub fn run_synthetic(
    req: &SyntheticRequest,
    out: &Path,
    gpu: bool,
) -> Result<Vec<Written>, String> {
    let mut written = vec![emulated(req, &out.join("emulator"))?];
    if gpu {
        match Device::open(0) {
            Ok(dev) => written.push(on_gpu(&dev, req, &out.join("gpu"))?),
            Err(e) => eprintln!("mono trace: no GPU ({e}); the emulator's trace only"),
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_emulated_trace_is_written_and_reads_back() {
        let out = std::env::temp_dir().join(format!("mono-trace-test-{}", std::process::id()));
        let req = SyntheticRequest {
            ctas: Some(3),
            tasks_per_cta: 4,
            seed: 5,
        };
        let w = emulated(&req, &out).unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&w.json).unwrap()).unwrap();
        let spans = json["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .count();
        assert_eq!(spans, 12);
        let svg = std::fs::read_to_string(&w.svg).unwrap();
        assert_eq!(svg.matches(r#"<rect class="span""#).count(), 12);
        std::fs::remove_dir_all(&out).unwrap();
        let none = SyntheticRequest {
            ctas: Some(0),
            ..req
        };
        assert!(emulated(&none, &out).unwrap_err().contains("--ctas"));
    }
}
