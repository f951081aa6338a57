//! What a waiter that gave up reports: the same record from the CPU emulator's bounded waits and
//! from the device's diagnostics area (debug builds, `MBX_DEBUG=1`).

use crate::layout::{tag_of, value_of};
use std::fmt;

/// Words of the device diagnostics area (`MBX_DIAG_WORDS` in `kernels/mailbox.h`). The host zeroes
/// it before a launch; the first poller whose bound expires fills it:
/// `[0]` pollers that gave up, `[1]` task order, `[2]` box index, `[3]` CTA, `[4]` wanted tag,
/// `[5]` tag seen, `[6]` value seen, `[7]` thread.
pub const DIAG_WORDS: usize = 8;

/// A wait that never completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stall {
    pub cta: u32,
    /// The waiting task's global order.
    pub task: u32,
    /// The box it waited on (index in the scratch).
    pub box_index: u32,
    pub want_tag: u32,
    /// The box's word when the waiter gave up.
    pub seen: u64,
    pub polls: u64,
    /// The device thread that reported (CPU stalls have none).
    pub thread: Option<u32>,
}

impl Stall {
    /// Reads a device diagnostics area; `None` when no poll expired. `poll_limit` is the kernel's
    /// `MBX_POLL_LIMIT`. Also returns how many pollers gave up.
    pub fn from_diag(words: &[u32], poll_limit: u64) -> Option<(Stall, u32)> {
        let w: &[u32; DIAG_WORDS] = words.get(..DIAG_WORDS)?.try_into().ok()?;
        if w[0] == 0 {
            return None;
        }
        let stall = Stall {
            cta: w[3],
            task: w[1],
            box_index: w[2],
            want_tag: w[4],
            seen: ((w[5] as u64) << 32) | w[6] as u64,
            polls: poll_limit,
            thread: Some(w[7]),
        };
        Some((stall, w[0]))
    }
}

impl fmt::Display for Stall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CTA {}", self.cta)?;
        if let Some(t) = self.thread {
            write!(f, " thread {t}")?;
        }
        write!(
            f,
            ": task {} waited on box {} for tag {}; after {} polls it held tag {} value {:#x}",
            self.task,
            self.box_index,
            self.want_tag,
            self.polls,
            tag_of(self.seen),
            value_of(self.seen)
        )
    }
}
