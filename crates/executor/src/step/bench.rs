//! Timing a step: the captured step replayed (each replay timed by events), each launch of one
//! step launched directly with events between them (grouped by launch kind), and the floors: the
//! bytes the launches in the step must move, and the bytes the whole step will move
//! (`model::traffic`), each over the copy bandwidth measured in the same run. A routing launch's
//! floor counts the experts its rows may touch at most, and, from one more step run launch by
//! launch, the experts they did choose. With a TLB sweep, each launch kind is also timed with the
//! TLBs swept before each of its launches.

use device::pages::PageSweep;
use device::Device;

use super::graph::{ChosenFloor, StepGraph};
use super::Result;

/// Times of one step configuration.
#[derive(Clone, Debug)]
pub struct StepTimes {
    /// Milliseconds of each replay.
    pub replays_ms: Vec<f64>,
    pub kinds: Vec<KindTime>,
    /// Bytes the step's launches must move, summed over those that know theirs.
    pub floor_bytes: u64,
    /// The same with each routing launch's experts those its rows chose in one step.
    pub chosen_bytes: u64,
    /// Launches of the step that gave no floor.
    pub without_floor: usize,
}

/// One launch kind's time in a step.
#[derive(Clone, Debug)]
pub struct KindTime {
    pub kind: String,
    /// Launches of this kind in the step.
    pub count: usize,
    /// Median milliseconds of one such launch.
    pub ms: f64,
    /// The same with the TLBs swept before each launch, when a sweep was asked for.
    pub swept_ms: Option<f64>,
    /// Mean bytes one such launch must move, when they all know theirs.
    pub floor_bytes: Option<u64>,
    /// Mean bytes with the experts the rows chose, and each launch's distinct experts, when the
    /// kind routes.
    pub chosen: Option<(u64, Vec<ChosenFloor>)>,
}

pub use device::timing::median;

impl StepTimes {
    pub fn step_ms(&self) -> f64 {
        median(&self.replays_ms)
    }
}

/// One launch kind's runs while a step's times are grouped.
struct KindRuns {
    kind: String,
    times: Vec<f64>,
    swept: Vec<f64>,
    floors: Vec<Option<u64>>,
    choices: Vec<ChosenFloor>,
}

/// Times `graph` (already captured): `replays` replays after `warmup` untimed ones, and
/// `direct` steps launched launch by launch for the per-kind times (as many again with the TLBs
/// swept before each launch, given `sweep`); then one step launched launch by launch reads back
/// what each launch chose.
pub fn time_step(
    dev: &Device,
    graph: &StepGraph,
    warmup: u32,
    replays: u32,
    direct: u32,
    sweep: Option<&PageSweep>,
) -> Result<StepTimes> {
    graph.replay(warmup)?;
    let replays_ms = graph.time_replays(dev, replays)?;
    let launches = graph.launches();
    let direct_times = |sweep: Option<&PageSweep>| -> Result<Vec<Vec<f64>>> {
        let mut per_launch: Vec<Vec<f64>> = vec![Vec::new(); launches.len()];
        for _ in 0..direct {
            for (times, ms) in per_launch.iter_mut().zip(graph.time_launches(dev, sweep)?) {
                times.push(ms);
            }
        }
        Ok(per_launch)
    };
    let per_launch = direct_times(None)?;
    let swept = match sweep {
        Some(_) => direct_times(sweep)?,
        None => vec![Vec::new(); launches.len()],
    };
    let mut chosen: Vec<Option<ChosenFloor>> = vec![None; launches.len()];
    graph.run_inspected(&mut |i, launch| {
        chosen[i] = launch.chosen_floor()?;
        Ok(())
    })?;
    let mut kinds: Vec<KindRuns> = Vec::new();
    for (((launch, times), swept), choice) in
        launches.iter().zip(per_launch).zip(swept).zip(&chosen)
    {
        let kind = launch.kind();
        let i = match kinds.iter().position(|k| k.kind == kind) {
            Some(i) => i,
            None => {
                kinds.push(KindRuns {
                    kind,
                    times: Vec::new(),
                    swept: Vec::new(),
                    floors: Vec::new(),
                    choices: Vec::new(),
                });
                kinds.len() - 1
            }
        };
        let k = &mut kinds[i];
        k.times.extend(times);
        k.swept.extend(swept);
        k.floors.push(launch.floor_bytes());
        k.choices.extend(*choice);
    }
    let chosen_bytes = launches
        .iter()
        .zip(&chosen)
        .map(|(l, c)| c.map_or(l.floor_bytes().unwrap_or(0), |c| c.bytes))
        .sum();
    Ok(StepTimes {
        replays_ms,
        kinds: kinds
            .into_iter()
            .map(|k| KindTime {
                kind: k.kind,
                count: k.floors.len(),
                ms: median(&k.times),
                swept_ms: (!k.swept.is_empty()).then(|| median(&k.swept)),
                floor_bytes: k
                    .floors
                    .iter()
                    .copied()
                    .sum::<Option<u64>>()
                    .map(|b| b / k.floors.len() as u64),
                chosen: (!k.choices.is_empty()).then(|| {
                    let mean =
                        k.choices.iter().map(|c| c.bytes).sum::<u64>() / k.choices.len() as u64;
                    (mean, k.choices)
                }),
            })
            .collect(),
        floor_bytes: launches.iter().filter_map(|l| l.floor_bytes()).sum(),
        chosen_bytes,
        without_floor: launches
            .iter()
            .filter(|l| l.floor_bytes().is_none())
            .count(),
    })
}
