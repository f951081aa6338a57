//! How the GPU benches time a graph: one way for all of them, so that their figures differ by what
//! they launch and not by how they were timed.

use crate::device::{Device, Event, Graph, Stream};
use crate::error::{DeviceError, Result};
use crate::probes::L2Flush;

/// The middle of `values` once sorted (the upper one of an even count); NaN where there are none.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Replays of a captured graph between two events, the L2 flushed before each (outside the graph,
/// so that every replay finds its weights cold), the first replay untimed (it pays the graph's
/// first upload of work and the clocks' ramp).
pub struct ReplayTimer {
    flush: L2Flush,
    start: Event,
    end: Event,
}

impl ReplayTimer {
    /// The timer with the flush `MONO_L2_FLUSH` names ([`L2Flush::new`]).
    pub fn new(dev: &Device) -> Result<Self> {
        Ok(ReplayTimer {
            flush: L2Flush::new(dev)?,
            start: dev.timer()?,
            end: dev.timer()?,
        })
    }

    /// The flush it enqueues before each replay, for a bench that times something else the same way.
    pub fn flush(&self) -> &L2Flush {
        &self.flush
    }

    /// Milliseconds of each of `replays` timed replays of `graph`; `after(i)` runs after timed replay
    /// `i` (from 1), once it has completed.
    pub fn replays_ms<E: From<DeviceError>>(
        &self,
        dev: &Device,
        stream: &Stream,
        graph: &Graph,
        replays: usize,
        after: impl FnMut(usize) -> std::result::Result<(), E>,
    ) -> std::result::Result<Vec<f64>, E> {
        self.runs_ms(dev, stream, replays, || Ok(graph.launch(stream)?), after)
    }

    /// Milliseconds of each of `runs` timed runs of what `issue` enqueues on `stream` itself
    /// (launches, not a graph), after one untimed.
    pub fn direct_ms<E: From<DeviceError>>(
        &self,
        dev: &Device,
        stream: &Stream,
        runs: usize,
        issue: impl FnMut() -> std::result::Result<(), E>,
    ) -> std::result::Result<Vec<f64>, E> {
        self.runs_ms(dev, stream, runs, issue, |_| Ok(()))
    }

    fn runs_ms<E: From<DeviceError>>(
        &self,
        dev: &Device,
        stream: &Stream,
        runs: usize,
        mut issue: impl FnMut() -> std::result::Result<(), E>,
        mut after: impl FnMut(usize) -> std::result::Result<(), E>,
    ) -> std::result::Result<Vec<f64>, E> {
        let mut times = Vec::with_capacity(runs);
        for i in 0..=runs {
            self.flush.enqueue(dev, stream)?;
            self.start.record(stream)?;
            issue()?;
            self.end.record(stream)?;
            self.end.sync()?;
            if i > 0 {
                times.push(f64::from(self.start.elapsed_ms(&self.end)?));
                after(i)?;
            }
        }
        Ok(times)
    }

    /// What `issue` enqueues on `stream`, captured into one graph: the median milliseconds of
    /// `replays` timed replays of it.
    pub fn capture_median_ms<E: From<DeviceError>>(
        &self,
        dev: &Device,
        stream: &Stream,
        replays: usize,
        issue: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<f64, E> {
        let graph = capture(stream, issue)?;
        Ok(median(&self.replays_ms(
            dev,
            stream,
            &graph,
            replays,
            |_| Ok::<(), E>(()),
        )?))
    }

    /// `launches` launches, launch i enqueued by `issue(i)`, captured into one graph: the median
    /// microseconds a launch over `replays` timed replays of it.
    pub fn launches_us<E: From<DeviceError>>(
        &self,
        dev: &Device,
        stream: &Stream,
        replays: usize,
        launches: usize,
        issue: impl Fn(usize) -> std::result::Result<(), E>,
    ) -> std::result::Result<f64, E> {
        let ms =
            self.capture_median_ms(dev, stream, replays, || (0..launches).try_for_each(issue))?;
        Ok(ms * 1e3 / launches as f64)
    }
}

/// What `issue` enqueues on `stream`, captured into one graph and uploaded.
pub fn capture<E: From<DeviceError>>(
    stream: &Stream,
    issue: impl FnOnce() -> std::result::Result<(), E>,
) -> std::result::Result<Graph, E> {
    stream.begin_capture()?;
    let issued = issue();
    // The capture ends whatever `issue` did, so that the stream is usable again after an error.
    let graph = stream.end_capture();
    issued?;
    let graph = graph?;
    graph.upload(stream)?;
    Ok(graph)
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_median_is_the_middle_value_and_the_upper_one_of_an_even_count() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median(&[5.0]), 5.0);
        assert!(median(&[]).is_nan());
    }
}
