//! The step graph: the epoch node, every launch of the step in order, and the greedy feed, captured
//! once on a stream of its own and replayed per step.
//!
//! A launch joins the step by implementing [`StepLaunch`]: it is built against a [`LaunchSlot`]
//! (the step's epoch word and scratch, its tags and its fixed index in the step), enqueues itself
//! without touching the host (no copies, no allocation, no synchronisation: it is captured), and
//! names the device tensors it writes so that digests can cover them. The device layer keeps no
//! per-buffer events, so nothing recorded outside the capture leaks into it; every buffer a launch
//! reads is allocated before capture and lives as long as the graph.

use std::sync::Arc;

use device::pages::{PageSweep, SWEEP_STRIDE};
use device::{Buffer, Device, DeviceError, Event, Graph, Stream};
use mailbox::gpu::{EpochNode, Variant};
use mailbox::layout::Tags;
use mailbox::placement::TaskTable;

use super::digest::{Dump, LaunchDigest};
use super::inputs::Feed;
use super::{Result, StepError};

/// What a launch needs from the step to tag its hand-offs: tag = epoch x launches-per-step +
/// `launch_index` + 1, the epoch read from `epoch`, boxes in `scratch` (which the epoch node
/// clears when the epoch wraps).
#[derive(Clone)]
pub struct LaunchSlot {
    pub epoch: Arc<Buffer<u32>>,
    pub scratch: Arc<Buffer<u64>>,
    pub tags: Tags,
    pub launch_index: u32,
}

/// A device tensor read back as bytes.
pub trait DeviceBytes {
    fn bytes(&self) -> Result<Vec<u8>, DeviceError>;
}

impl<T: bytemuck::Pod> DeviceBytes for Buffer<T> {
    fn bytes(&self) -> Result<Vec<u8>, DeviceError> {
        Ok(bytemuck::cast_slice(&self.download()?).to_vec())
    }
}

/// A tensor a launch writes, by name.
pub struct Output<'a> {
    pub name: String,
    pub data: &'a dyn DeviceBytes,
}

impl<'a> Output<'a> {
    pub fn new(name: impl Into<String>, data: &'a dyn DeviceBytes) -> Self {
        Output {
            name: name.into(),
            data,
        }
    }
}

/// A launch's floor as its last run chose it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChosenFloor {
    /// Bytes the run had to move.
    pub bytes: u64,
    /// Distinct routed experts its rows chose.
    pub experts: u32,
    /// The most its rows could choose (what [`StepLaunch::floor_bytes`] counts).
    pub most_experts: u32,
}

/// One launch of the step: a kernel with its task table and arguments, fixed when built.
pub trait StepLaunch {
    /// Unique in the step, e.g. `layer 3 (MoE, full indexer)`.
    fn name(&self) -> String;
    /// The launch kind its time is reported under (`model::traffic::LaunchKind::name`, or the
    /// part it is, such as `front half`).
    fn kind(&self) -> String;
    /// Enqueues the launch on `stream`, without the epoch node: this is what the graph captures.
    fn enqueue(&self, stream: &Stream) -> Result<()>;
    /// The tensors it writes.
    fn outputs(&self) -> Vec<Output<'_>>;
    /// Bytes the launch must move (its HBM floor's numerator), when it knows them.
    fn floor_bytes(&self) -> Option<u64> {
        None
    }
    /// After the launch ran: its floor counting what the run chose (the routed experts its rows
    /// picked, read back from the device), when its floor depends on that.
    fn chosen_floor(&self) -> Result<Option<ChosenFloor>> {
        Ok(None)
    }
    /// After the launch ran: what a task reported (a stall, a flag), as an error.
    fn check(&self) -> Result<()> {
        Ok(())
    }
    /// After the launch ran: its task records, when its kernel was built traced, which are then
    /// cleared for the next run.
    fn take_trace(&self) -> Result<Option<LaunchRecords>> {
        Ok(None)
    }
}

/// A traced launch's task records as read back, with what it ran.
#[derive(Clone, Debug)]
pub struct LaunchRecords {
    /// The launch's task table (`mailbox::trace::decode` reads the records against it).
    pub table: TaskTable,
    /// `mailbox::trace::RECORD_WORDS` words per task of the table.
    pub words: Vec<u64>,
    /// Each task of the table in words, in table order.
    pub task_names: Vec<String>,
}

/// One traced launch of a step: its name, its kind and its records.
#[derive(Clone, Debug)]
pub struct TracedLaunch {
    pub name: String,
    pub kind: String,
    pub records: LaunchRecords,
}

/// The step's epoch word, scratch and tags, made before the launches that are built against them.
pub struct StepFrame {
    epoch: Arc<Buffer<u32>>,
    scratch: Arc<Buffer<u64>>,
    tags: Tags,
}

impl StepFrame {
    /// A step of `launches` launches whose hand-offs use at most `scratch_boxes` boxes.
    pub fn new(dev: &Device, launches: u32, scratch_boxes: u64) -> Result<Self> {
        let tags = Tags::new(launches).map_err(|e| StepError::Invalid(e.to_string()))?;
        Ok(StepFrame {
            epoch: Arc::new(dev.alloc_zeroed(1)?),
            scratch: Arc::new(dev.alloc_zeroed(scratch_boxes.max(1) as usize)?),
            tags,
        })
    }

    pub fn slot(&self, launch_index: u32) -> Result<LaunchSlot> {
        if launch_index >= self.tags.launches_per_step() {
            return Err(StepError::Invalid(format!(
                "launch {launch_index} of a step of {}",
                self.tags.launches_per_step()
            )));
        }
        Ok(LaunchSlot {
            epoch: self.epoch.clone(),
            scratch: self.scratch.clone(),
            tags: self.tags,
            launch_index,
        })
    }

    /// The epoch the next step runs at.
    pub fn epoch(&self) -> Result<u32> {
        Ok(self.epoch.download()?[0])
    }
}

/// Every launch of a step, runnable eagerly (for dumps and per-launch times) and as one graph.
pub struct StepGraph<'a> {
    frame: StepFrame,
    epoch_node: EpochNode,
    launches: Vec<Box<dyn StepLaunch + 'a>>,
    feed: Option<Feed<'a>>,
    stream: Stream,
    graph: Option<Graph>,
    /// Device bytes [`StepGraph::run_inspected`] fills with 0xff before each launch.
    poison: Option<(u64, usize)>,
}

impl<'a> StepGraph<'a> {
    /// `launches` in step order, each built against `frame.slot(i)`; `feed`, when given, runs
    /// last and feeds the argmax to the next step's inputs.
    pub fn new(
        dev: &Device,
        frame: StepFrame,
        launches: Vec<Box<dyn StepLaunch + 'a>>,
        feed: Option<Feed<'a>>,
        variant: Variant,
    ) -> Result<Self> {
        let per_step = frame.tags.launches_per_step() as usize;
        if launches.len() != per_step {
            return Err(StepError::Invalid(format!(
                "the step's tags count {per_step} launches; {} given",
                launches.len()
            )));
        }
        let mut names: Vec<String> = launches.iter().map(|l| l.name()).collect();
        names.sort();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(StepError::Invalid(format!("two launches named {}", w[0])));
        }
        Ok(StepGraph {
            frame,
            epoch_node: EpochNode::build(dev, variant)?,
            launches,
            feed,
            stream: dev.new_stream()?,
            graph: None,
            poison: None,
        })
    }

    /// Has [`StepGraph::run_inspected`] fill `bytes` bytes from `ptr` with 0xff before each
    /// launch (never the captured graph): bytes a launch reads there without writing them first
    /// then read as NaN in bf16 and f32 and as -1 in integers, which the checks after the launch
    /// see, where the bytes an earlier launch left would often pass.
    pub fn poison_before_launches(&mut self, ptr: u64, bytes: usize) {
        self.poison = (bytes > 0).then_some((ptr, bytes));
    }

    pub fn launches(&self) -> &[Box<dyn StepLaunch + 'a>] {
        &self.launches
    }

    pub fn frame(&self) -> &StepFrame {
        &self.frame
    }

    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    fn enqueue_epoch(&self) -> Result<()> {
        Ok(self.epoch_node.enqueue(
            &self.stream,
            &self.frame.epoch,
            &self.frame.scratch,
            self.frame.tags,
        )?)
    }

    /// The whole step as the graph holds it: epoch node, launches, feed.
    fn enqueue_step(&self) -> Result<()> {
        self.enqueue_epoch()?;
        for launch in &self.launches {
            launch.enqueue(&self.stream)?;
        }
        if let Some(feed) = &self.feed {
            feed.enqueue(&self.stream)?;
        }
        Ok(())
    }

    /// Every launch's report after a run, the first problem as an error naming the launch.
    pub fn check(&self) -> Result<()> {
        for launch in &self.launches {
            launch.check().map_err(|e| StepError::Launch {
                launch: launch.name(),
                message: e.to_string(),
            })?;
        }
        Ok(())
    }

    /// One step launched directly (not from the graph), then checked.
    pub fn run_eager(&self) -> Result<()> {
        self.enqueue_step()?;
        self.stream.sync()?;
        self.check()
    }

    /// Milliseconds of one step launched directly (events around its launches), then checked.
    pub fn time_eager(&self, dev: &Device) -> Result<f64> {
        let (start, end) = (dev.timer()?, dev.timer()?);
        start.record(&self.stream)?;
        self.enqueue_step()?;
        end.record(&self.stream)?;
        self.stream.sync()?;
        self.check()?;
        Ok(f64::from(start.elapsed_ms(&end)?))
    }

    /// One step launched directly, every launch back to back as the graph runs them, then each
    /// launch's task records in step order; every launch's kernel must be built traced.
    pub fn run_traced(&self) -> Result<Vec<TracedLaunch>> {
        // Earlier runs' records are dropped, so each record read is this step's.
        for launch in &self.launches {
            launch.take_trace()?;
        }
        self.run_eager()?;
        self.launches
            .iter()
            .map(|launch| {
                let records = launch.take_trace()?.ok_or_else(|| StepError::Launch {
                    launch: launch.name(),
                    message: "its kernel was not built traced".into(),
                })?;
                Ok(TracedLaunch {
                    name: launch.name(),
                    kind: launch.kind(),
                    records,
                })
            })
            .collect()
    }

    /// Captures the step once; later [`replay`](Self::replay)s run it.
    pub fn capture(&mut self) -> Result<()> {
        self.graph = None;
        self.stream.begin_capture()?;
        let recorded = self.enqueue_step();
        // End the capture even when an enqueue failed, so the stream is usable again.
        let graph = self.stream.end_capture();
        recorded?;
        let graph = graph?;
        graph.upload(&self.stream)?;
        self.graph = Some(graph);
        Ok(())
    }

    fn graph(&self) -> Result<&Graph> {
        self.graph
            .as_ref()
            .ok_or_else(|| StepError::Invalid("the step graph is not captured yet".into()))
    }

    /// `steps` replays of the captured step, waited for.
    pub fn replay(&self, steps: u32) -> Result<()> {
        let graph = self.graph()?;
        for _ in 0..steps {
            graph.launch(&self.stream)?;
        }
        self.stream.sync()?;
        self.check()
    }

    /// Milliseconds of each of `steps` replays, by events between them.
    pub fn time_replays(&self, dev: &Device, steps: u32) -> Result<Vec<f64>> {
        let graph = self.graph()?;
        let events: Vec<Event> = (0..=steps).map(|_| dev.timer()).collect::<Result<_, _>>()?;
        events[0].record(&self.stream)?;
        for e in &events[1..] {
            graph.launch(&self.stream)?;
            e.record(&self.stream)?;
        }
        self.stream.sync()?;
        self.check()?;
        events
            .windows(2)
            .map(|w| Ok(f64::from(w[0].elapsed_ms(&w[1])?)))
            .collect()
    }

    /// Each launch's milliseconds in one step launched directly, an event before and after each
    /// launch (the epoch node and the feed are not counted); with `sweep`, the TLBs swept before
    /// each launch, outside its events, so that it finds none of its pages' translations kept.
    pub fn time_launches(&self, dev: &Device, sweep: Option<&PageSweep>) -> Result<Vec<f64>> {
        let events: Vec<(Event, Event)> = self
            .launches
            .iter()
            .map(|_| Ok((dev.timer()?, dev.timer()?)))
            .collect::<Result<_>>()?;
        self.enqueue_epoch()?;
        for (launch, (start, end)) in self.launches.iter().zip(&events) {
            if let Some(sweep) = sweep {
                sweep.enqueue(dev, &self.stream, SWEEP_STRIDE)?;
            }
            start.record(&self.stream)?;
            launch.enqueue(&self.stream)?;
            end.record(&self.stream)?;
        }
        if let Some(feed) = &self.feed {
            feed.enqueue(&self.stream)?;
        }
        self.stream.sync()?;
        self.check()?;
        events
            .iter()
            .map(|(start, end)| Ok(f64::from(start.elapsed_ms(end)?)))
            .collect()
    }

    /// One step launched directly, each launch waited for, checked and handed to `inspect`
    /// before the next runs (the feed, when there is one, runs last, uninspected).
    pub fn run_inspected(
        &self,
        inspect: &mut dyn FnMut(usize, &dyn StepLaunch) -> Result<()>,
    ) -> Result<()> {
        self.enqueue_epoch()?;
        for (i, launch) in self.launches.iter().enumerate() {
            let named = |e: &dyn std::fmt::Display| StepError::Launch {
                launch: launch.name(),
                message: e.to_string(),
            };
            if let Some((ptr, bytes)) = self.poison {
                self.stream.memset(ptr, 0xff, bytes)?;
            }
            launch.enqueue(&self.stream)?;
            self.stream.sync().map_err(|e| named(&e))?;
            launch.check().map_err(|e| named(&e))?;
            inspect(i, launch.as_ref())?;
        }
        if let Some(feed) = &self.feed {
            feed.enqueue(&self.stream)?;
            self.stream.sync()?;
        }
        Ok(())
    }

    /// One step launched directly, each launch waited for and its outputs digested before the
    /// next runs (so a later launch that rewrites a buffer cannot hide an earlier one's result);
    /// the feed's outputs last.
    pub fn dump_step(&self) -> Result<Dump> {
        let mut dump = Dump::default();
        self.run_inspected(&mut |i, launch| {
            dump.launches
                .push(LaunchDigest::of(i, &launch.name(), &launch.outputs())?);
            Ok(())
        })?;
        if let Some(feed) = &self.feed {
            let index = self.launches.len();
            dump.launches
                .push(LaunchDigest::of(index, Feed::NAME, &feed.outputs())?);
        }
        Ok(dump)
    }

    /// Digests of every launch's outputs as they are now (after replays: the last step's).
    pub fn digest_now(&self) -> Result<Dump> {
        let mut dump = Dump::default();
        for (i, launch) in self.launches.iter().enumerate() {
            dump.launches
                .push(LaunchDigest::of(i, &launch.name(), &launch.outputs())?);
        }
        if let Some(feed) = &self.feed {
            let index = self.launches.len();
            dump.launches
                .push(LaunchDigest::of(index, Feed::NAME, &feed.outputs())?);
        }
        Ok(dump)
    }
}
