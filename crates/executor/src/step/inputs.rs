//! A step's inputs in device buffers (token ids, positions, the new tokens' cache slots, page
//! tables, rows per request) that the host rewrites between replays, and the feed node that, at
//! the end of a step, moves every request on by greedy decoding without the host
//! (`kernels/step_feed.hip`; [`HostRows::fed`] is its CPU twin).

use device::{Args, Buffer, Device, Kernel, KernelSource, Launch, Module, Stream};

use super::graph::Output;
use super::{Result, StepError};

pub const SOURCE: (&str, &str) = ("step_feed.hip", include_str!("../../kernels/step_feed.hip"));

/// One request of a step: `tokens.len()` consecutive rows from `first_position`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestInput {
    pub tokens: Vec<u32>,
    pub first_position: u32,
    /// The request's cache pages, in order.
    pub pages: Vec<u32>,
}

/// The requests of a step and the page geometry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub requests: Vec<RequestInput>,
    pub page_tokens: u32,
    /// Width of the page table: the most pages any request may have.
    pub pages_per_request: u32,
}

/// The step's inputs as the device holds them, one entry per row (or request, or page).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostRows {
    pub tokens: Vec<i32>,
    pub positions: Vec<i32>,
    /// Cache slot of each row's new token; -1 where its page is not in the table.
    pub slots: Vec<i32>,
    pub row_request: Vec<i32>,
    pub request_first: Vec<i32>,
    pub request_rows: Vec<i32>,
    /// `[requests][pages_per_request]`, unused entries -1.
    pub page_table: Vec<i32>,
}

/// Cache slot of `position` in row `q` of the page table, or -1 past the request's pages.
fn slot_of(table: &[i32], q: usize, width: u32, page_tokens: u32, position: i32) -> i32 {
    let page = position as u32 / page_tokens;
    let id = if page < width {
        table[q * width as usize + page as usize]
    } else {
        -1
    };
    if id < 0 {
        -1
    } else {
        id * page_tokens as i32 + position % page_tokens as i32
    }
}

impl HostRows {
    /// Fails on an empty batch, a request without rows, or a page table wider than allowed.
    pub fn new(batch: &Batch) -> Result<Self> {
        if batch.requests.is_empty() || batch.page_tokens == 0 || batch.pages_per_request == 0 {
            return Err(StepError::Invalid(
                "a step needs at least one request, and pages of at least one token".into(),
            ));
        }
        let width = batch.pages_per_request;
        let mut h = HostRows {
            page_table: vec![-1; batch.requests.len() * width as usize],
            ..HostRows::default()
        };
        for (q, r) in batch.requests.iter().enumerate() {
            if r.tokens.is_empty() || r.pages.len() > width as usize {
                return Err(StepError::Invalid(format!(
                    "request {q}: {} rows and {} pages (at least 1 row, at most {width} pages)",
                    r.tokens.len(),
                    r.pages.len()
                )));
            }
            for (p, &page) in r.pages.iter().enumerate() {
                h.page_table[q * width as usize + p] = page as i32;
            }
            h.request_first.push(h.tokens.len() as i32);
            h.request_rows.push(r.tokens.len() as i32);
            for (i, &t) in r.tokens.iter().enumerate() {
                h.tokens.push(t as i32);
                h.positions.push((r.first_position + i as u32) as i32);
                h.row_request.push(q as i32);
            }
        }
        for r in 0..h.tokens.len() {
            let q = h.row_request[r] as usize;
            h.slots.push(slot_of(
                &h.page_table,
                q,
                width,
                batch.page_tokens,
                h.positions[r],
            ));
        }
        Ok(h)
    }

    /// Fails when a row's position is past its request's pages: its new token would have no
    /// cache slot, and the launches, planned over the pages, do not reach it.
    pub fn check_pages(&self) -> Result<()> {
        match self.slots.iter().position(|&s| s < 0) {
            None => Ok(()),
            Some(r) => Err(StepError::Invalid(format!(
                "row {r} (request {}) is at position {}, past its request's pages; give the \
                 request the pages of every step it runs",
                self.row_request[r], self.positions[r]
            ))),
        }
    }

    /// The next step's rows after greedy decoding picked `argmax` (one token per row): what the
    /// feed node computes on the device.
    pub fn fed(&self, argmax: &[i32], batch: &Batch) -> HostRows {
        let mut next = self.clone();
        for r in 0..self.tokens.len() {
            let q = self.row_request[r] as usize;
            let n = self.request_rows[q];
            next.tokens[r] = argmax[(self.request_first[q] + n - 1) as usize];
            next.positions[r] = self.positions[r] + n;
            next.slots[r] = slot_of(
                &self.page_table,
                q,
                batch.pages_per_request,
                batch.page_tokens,
                next.positions[r],
            );
        }
        next
    }
}

/// The inputs in device buffers. The launches read them (by address, fixed at capture), the host
/// rewrites them between replays with [`StepInputs::write`].
pub struct StepInputs {
    pub tokens: Buffer<i32>,
    pub positions: Buffer<i32>,
    pub slots: Buffer<i32>,
    pub row_request: Buffer<i32>,
    pub request_first: Buffer<i32>,
    pub request_rows: Buffer<i32>,
    pub page_table: Buffer<i32>,
    /// Written by the tail: each row's greedy token.
    pub argmax: Buffer<i32>,
    pub pages_per_request: u32,
    pub page_tokens: u32,
}

impl StepInputs {
    /// Fails on a row past its request's pages ([`HostRows::check_pages`]).
    pub fn new(dev: &Device, batch: &Batch) -> Result<Self> {
        let h = HostRows::new(batch)?;
        h.check_pages()?;
        Ok(StepInputs {
            tokens: dev.upload(&h.tokens)?,
            positions: dev.upload(&h.positions)?,
            slots: dev.upload(&h.slots)?,
            row_request: dev.upload(&h.row_request)?,
            request_first: dev.upload(&h.request_first)?,
            request_rows: dev.upload(&h.request_rows)?,
            page_table: dev.upload(&h.page_table)?,
            argmax: dev.alloc_zeroed(h.tokens.len())?,
            pages_per_request: batch.pages_per_request,
            page_tokens: batch.page_tokens,
        })
    }

    pub fn rows(&self) -> usize {
        self.tokens.len()
    }

    /// Rewrites the inputs for the next replay (the stream running the graph must be idle). The
    /// batch must have the rows per request and table width the launches were built for, and
    /// every row within its request's pages.
    pub fn write(&self, batch: &Batch) -> Result<()> {
        let h = HostRows::new(batch)?;
        h.check_pages()?;
        if batch.pages_per_request != self.pages_per_request
            || batch.page_tokens != self.page_tokens
            || h.row_request != self.row_request.download()?
        {
            return Err(StepError::Invalid(
                "the batch's rows per request or page table differ from the step's; build a new step"
                    .into(),
            ));
        }
        self.tokens.write(&h.tokens)?;
        self.positions.write(&h.positions)?;
        self.slots.write(&h.slots)?;
        self.page_table.write(&h.page_table)?;
        Ok(())
    }

    /// What the device holds now.
    pub fn read(&self) -> Result<HostRows> {
        Ok(HostRows {
            tokens: self.tokens.download()?,
            positions: self.positions.download()?,
            slots: self.slots.download()?,
            row_request: self.row_request.download()?,
            request_first: self.request_first.download()?,
            request_rows: self.request_rows.download()?,
            page_table: self.page_table.download()?,
        })
    }
}

/// The feed kernel.
pub struct FeedKernel {
    // Declared before the module: a kernel must not outlive its module.
    kernel: Kernel,
    _module: Module,
}

pub fn source() -> KernelSource {
    KernelSource::new(SOURCE.0, SOURCE.1)
}

impl FeedKernel {
    pub fn build(dev: &Device) -> Result<Self> {
        let module = dev.build(&source())?;
        Ok(FeedKernel {
            kernel: module.kernel("step_feed")?,
            _module: module,
        })
    }
}

/// The feed node of one step's inputs.
pub struct Feed<'a> {
    pub kernel: &'a FeedKernel,
    pub inputs: &'a StepInputs,
}

impl Feed<'_> {
    pub const NAME: &'static str = "greedy feed";

    pub fn enqueue(&self, stream: &Stream) -> Result<()> {
        let i = self.inputs;
        let rows = i.rows() as u32;
        let args = Args::new()
            .buf(&i.argmax)
            .buf(&i.tokens)
            .buf(&i.positions)
            .buf(&i.slots)
            .buf(&i.row_request)
            .buf(&i.request_first)
            .buf(&i.request_rows)
            .buf(&i.page_table)
            .u32(i.pages_per_request)
            .u32(i.page_tokens)
            .u32(rows);
        stream.launch(
            &self.kernel.kernel,
            Launch::new(rows.div_ceil(128), 128),
            &args,
        )?;
        Ok(())
    }

    pub fn outputs(&self) -> Vec<Output<'_>> {
        vec![
            Output::new("tokens", &self.inputs.tokens),
            Output::new("positions", &self.inputs.positions),
            Output::new("slots", &self.inputs.slots),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> Batch {
        Batch {
            requests: vec![
                RequestInput {
                    tokens: vec![5],
                    first_position: 63,
                    pages: vec![7, 2],
                },
                RequestInput {
                    tokens: vec![1, 2, 3, 4],
                    first_position: 10,
                    pages: vec![4],
                },
            ],
            page_tokens: 64,
            pages_per_request: 3,
        }
    }

    #[test]
    fn rows_slots_and_the_greedy_feed() {
        let b = batch();
        let h = HostRows::new(&b).unwrap();
        assert_eq!(h.tokens, vec![5, 1, 2, 3, 4]);
        assert_eq!(h.positions, vec![63, 10, 11, 12, 13]);
        assert_eq!(
            h.slots,
            vec![
                7 * 64 + 63,
                4 * 64 + 10,
                4 * 64 + 11,
                4 * 64 + 12,
                4 * 64 + 13
            ]
        );
        let next = h.fed(&[100, 101, 102, 103, 104], &b);
        // Request 0 moves to position 64: its second page. Request 1 takes row 4's token.
        assert_eq!(next.tokens, vec![100, 104, 104, 104, 104]);
        assert_eq!(next.positions, vec![64, 14, 15, 16, 17]);
        assert_eq!(next.slots[0], 2 * 64);
        assert_eq!(next.slots[1], 4 * 64 + 14);
        // Past the table: no slot.
        let far = HostRows::new(&Batch {
            requests: vec![RequestInput {
                tokens: vec![1],
                first_position: 64 * 3,
                pages: vec![1, 2, 3],
            }],
            ..b
        })
        .unwrap();
        assert_eq!(far.slots, vec![-1]);
        let err = far.check_pages().unwrap_err().to_string();
        assert!(
            err.contains("row 0 (request 0) is at position 192"),
            "{err}"
        );
        assert!(h.check_pages().is_ok());
    }

    #[test]
    fn bad_batches_are_refused() {
        let mut b = batch();
        b.requests[1].tokens.clear();
        assert!(HostRows::new(&b).is_err());
        let mut b = batch();
        b.requests[0].pages = vec![0; 4];
        assert!(HostRows::new(&b)
            .unwrap_err()
            .to_string()
            .contains("at most 3 pages"));
    }
}
