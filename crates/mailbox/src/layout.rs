//! Pure math of the hand-off scratch: the box format, launch tags, and named box regions.
//! The device header (`kernels/mailbox.h`) mirrors the formulas here; the CPU protocol, the
//! emulator, the GPU host code and the executor all take their numbers from this file.

use std::marker::PhantomData;

/// A box is one 64-bit word: tag in the high 32 bits, value in the low 32.
pub const BOX_BYTES: u32 = 8;
/// Boxes written by different CTAs never share a line of this size (the largest of the L2 lines of
/// the targets), so no writer's line ping-pongs with another's and no counter shares a line with a flag.
pub const LINE_BYTES: u32 = 128;
pub const BOXES_PER_LINE: u32 = LINE_BYTES / BOX_BYTES;

/// Packs a tagged pair into a box word.
pub const fn pack(tag: u32, value: u32) -> u64 {
    ((tag as u64) << 32) | value as u64
}

pub const fn tag_of(word: u64) -> u32 {
    (word >> 32) as u32
}

pub const fn value_of(word: u64) -> u32 {
    word as u32
}

/// What can be wrong with a tag schedule or a scratch layout.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("a step needs at least one launch")]
    NoLaunches,
    #[error("{launches} launches per step leave fewer than two epochs below 2^32; tags would repeat within a step")]
    TooManyLaunches { launches: u32 },
    #[error("launch index {index} is not below the {launches} launches of a step")]
    LaunchIndex { index: u32, launches: u32 },
    #[error("epoch {epoch} is past the last epoch {last}; the epoch node wraps to 0 before that")]
    EpochPastEnd { epoch: u32, last: u32 },
    #[error("region name {name:?} must be non-empty ASCII letters, digits or '_' (it becomes a -D define)")]
    BadName { name: String },
    #[error("region {name:?} is declared twice")]
    DuplicateName { name: String },
    #[error("region {name:?} is empty ({slots} slots of {words} boxes)")]
    EmptyRegion {
        name: String,
        slots: u32,
        words: u32,
    },
    #[error("the scratch would hold {boxes} boxes; box indices are 32-bit")]
    TooLarge { boxes: u64 },
    #[error("region {name:?}: slot {slot} word {word} is outside {slots} slots of {words} boxes")]
    OutOfRegion {
        name: String,
        slot: u32,
        word: u32,
        slots: u32,
        words: u32,
    },
}

/// The launch tags of a step: `tag = epoch * launches_per_step + launch_index + 1`.
///
/// The epoch lives in device memory and a node of the step graph advances it once per replay, so
/// replays of a graph (whose arguments are frozen) still get fresh tags. Tags are never 0 (the
/// value of cleared scratch) and grow by one every launch until the epoch wraps; the wrap clears
/// the scratch, so no box can hold a tag from before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tags {
    launches_per_step: u32,
}

/// What the epoch node does in one replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advance {
    /// The epoch of the step that follows.
    pub epoch: u32,
    /// Whether the node zeroes the scratch first (the epoch wrapped to 0).
    pub clear: bool,
}

impl Tags {
    pub fn new(launches_per_step: u32) -> Result<Self, LayoutError> {
        if launches_per_step == 0 {
            return Err(LayoutError::NoLaunches);
        }
        // At least epochs 0 and 1 must exist, or every replay would wrap and clear.
        if u32::MAX / launches_per_step < 2 {
            return Err(LayoutError::TooManyLaunches {
                launches: launches_per_step,
            });
        }
        Ok(Tags { launches_per_step })
    }

    pub fn launches_per_step(&self) -> u32 {
        self.launches_per_step
    }

    /// The largest epoch whose every tag fits below 2^32: `(last + 1) * L <= u32::MAX`.
    pub fn last_epoch(&self) -> u32 {
        u32::MAX / self.launches_per_step - 1
    }

    pub fn tag(&self, epoch: u32, launch_index: u32) -> Result<u32, LayoutError> {
        if launch_index >= self.launches_per_step {
            return Err(LayoutError::LaunchIndex {
                index: launch_index,
                launches: self.launches_per_step,
            });
        }
        if epoch > self.last_epoch() {
            return Err(LayoutError::EpochPastEnd {
                epoch,
                last: self.last_epoch(),
            });
        }
        Ok(epoch * self.launches_per_step + launch_index + 1)
    }

    /// One replay of the epoch node. Any stored value at or past the last epoch (a corrupted word
    /// included) wraps, so the node never produces an epoch whose tags overflow.
    pub fn advance(&self, epoch: u32) -> Advance {
        if epoch >= self.last_epoch() {
            Advance {
                epoch: 0,
                clear: true,
            }
        } else {
            Advance {
                epoch: epoch + 1,
                clear: false,
            }
        }
    }
}

/// A Rust type carried in the low 32 bits of a box.
pub trait BoxValue: Copy {
    /// The name the layout reports (and the device code is expected to use).
    const TYPE: &'static str;
    fn to_bits(self) -> u32;
    fn from_bits(bits: u32) -> Self;
}

impl BoxValue for u32 {
    const TYPE: &'static str = "u32";
    fn to_bits(self) -> u32 {
        self
    }
    fn from_bits(bits: u32) -> Self {
        bits
    }
}

impl BoxValue for i32 {
    const TYPE: &'static str = "i32";
    fn to_bits(self) -> u32 {
        self as u32
    }
    fn from_bits(bits: u32) -> Self {
        bits as i32
    }
}

impl BoxValue for f32 {
    const TYPE: &'static str = "f32";
    fn to_bits(self) -> u32 {
        self.to_bits()
    }
    fn from_bits(bits: u32) -> Self {
        f32::from_bits(bits)
    }
}

/// A contiguous run of boxes: what a task writes or waits on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BoxRange {
    pub first: u32,
    pub len: u32,
}

impl BoxRange {
    pub const fn new(first: u32, len: u32) -> Self {
        BoxRange { first, len }
    }

    /// One past the last box, in 64 bits so that a corrupt range cannot overflow.
    pub fn end(&self) -> u64 {
        self.first as u64 + self.len as u64
    }

    pub fn boxes(&self) -> std::ops::Range<u64> {
        self.first as u64..self.end()
    }
}

/// What the layout knows of one region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    pub name: String,
    pub value_type: &'static str,
    /// Box index of slot 0, word 0; a multiple of [`BOXES_PER_LINE`].
    pub offset: u32,
    /// Slots: each is written by one task, so one CTA.
    pub slots: u32,
    /// Boxes used in a slot.
    pub words: u32,
    /// Boxes from one slot to the next: `words` rounded up to whole lines.
    pub stride: u32,
}

impl RegionInfo {
    /// Boxes the region occupies, padding included.
    pub fn len(&self) -> u64 {
        self.slots as u64 * self.stride as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A typed handle on a region: `T` is what the boxes' values mean.
#[derive(Debug)]
pub struct Region<T> {
    offset: u32,
    slots: u32,
    words: u32,
    stride: u32,
    _value: PhantomData<fn() -> T>,
}

impl<T> Clone for Region<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Region<T> {}

impl<T: BoxValue> Region<T> {
    pub fn offset(&self) -> u32 {
        self.offset
    }
    pub fn slots(&self) -> u32 {
        self.slots
    }
    pub fn words(&self) -> u32 {
        self.words
    }
    pub fn stride(&self) -> u32 {
        self.stride
    }

    /// Index in the scratch of `word` of `slot`, if both are inside the region.
    pub fn box_index(&self, slot: u32, word: u32) -> Option<u32> {
        (slot < self.slots && word < self.words).then(|| self.offset + slot * self.stride + word)
    }

    /// The boxes of one slot (its `words`, not the padding).
    pub fn slot(&self, slot: u32) -> Option<BoxRange> {
        self.box_index(slot, 0)
            .map(|first| BoxRange::new(first, self.words))
    }
}

/// The scratch of a launch: named, typed regions, each slot starting on its own line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScratchLayout {
    regions: Vec<RegionInfo>,
    boxes: u32,
}

/// Builds a [`ScratchLayout`] region by region.
#[derive(Debug, Default)]
pub struct LayoutBuilder {
    layout: ScratchLayout,
}

impl LayoutBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `slots` slots of `words` boxes, each slot aligned to a line and padded to whole lines.
    pub fn region<T: BoxValue>(
        &mut self,
        name: &str,
        slots: u32,
        words: u32,
    ) -> Result<Region<T>, LayoutError> {
        let valid =
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(LayoutError::BadName { name: name.into() });
        }
        if self.layout.regions.iter().any(|r| r.name == name) {
            return Err(LayoutError::DuplicateName { name: name.into() });
        }
        if slots == 0 || words == 0 {
            return Err(LayoutError::EmptyRegion {
                name: name.into(),
                slots,
                words,
            });
        }
        let stride = (words as u64).div_ceil(BOXES_PER_LINE as u64) * BOXES_PER_LINE as u64;
        let offset = self.layout.boxes as u64;
        let end = offset + slots as u64 * stride;
        if end > u32::MAX as u64 {
            return Err(LayoutError::TooLarge { boxes: end });
        }
        self.layout.regions.push(RegionInfo {
            name: name.into(),
            value_type: T::TYPE,
            offset: offset as u32,
            slots,
            words,
            stride: stride as u32,
        });
        self.layout.boxes = end as u32;
        Ok(Region {
            offset: offset as u32,
            slots,
            words,
            stride: stride as u32,
            _value: PhantomData,
        })
    }

    pub fn build(self) -> ScratchLayout {
        self.layout
    }
}

impl ScratchLayout {
    pub fn builder() -> LayoutBuilder {
        LayoutBuilder::new()
    }

    pub fn regions(&self) -> &[RegionInfo] {
        &self.regions
    }

    /// Boxes in the scratch; a multiple of [`BOXES_PER_LINE`].
    pub fn boxes(&self) -> u32 {
        self.boxes
    }

    pub fn bytes(&self) -> u64 {
        self.boxes as u64 * BOX_BYTES as u64
    }

    pub fn region(&self, name: &str) -> Option<&RegionInfo> {
        self.regions.iter().find(|r| r.name == name)
    }

    /// (region, slot, word) of a box; `None` for padding or boxes past the end.
    pub fn locate(&self, index: u32) -> Option<(&RegionInfo, u32, u32)> {
        let region = self
            .regions
            .iter()
            .find(|r| index >= r.offset && ((index - r.offset) as u64) < r.len())?;
        let rel = index - region.offset;
        let (slot, word) = (rel / region.stride, rel % region.stride);
        (word < region.words).then_some((region, slot, word))
    }

    /// A box named for messages: `box 80 (rows slot 5 word 0)`.
    pub fn describe(&self, index: u32) -> String {
        match self.locate(index) {
            Some((r, slot, word)) => format!("box {index} ({} slot {slot} word {word})", r.name),
            None => format!("box {index} (in no region)"),
        }
    }

    /// `-D` defines for device code: `MBX_<NAME>_OFFSET`, `_STRIDE`, `_WORDS`, `_SLOTS`, and
    /// `MBX_SCRATCH_BOXES`, so kernels index regions with compile-time constants.
    pub fn defines(&self) -> Vec<(String, u32)> {
        let mut out = vec![("MBX_SCRATCH_BOXES".to_string(), self.boxes)];
        for r in &self.regions {
            let n = r.name.to_ascii_uppercase();
            out.push((format!("MBX_{n}_OFFSET"), r.offset));
            out.push((format!("MBX_{n}_STRIDE"), r.stride));
            out.push((format!("MBX_{n}_WORDS"), r.words));
            out.push((format!("MBX_{n}_SLOTS"), r.slots));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips() {
        let w = pack(0xdead_beef, 0x0123_4567);
        assert_eq!((tag_of(w), value_of(w)), (0xdead_beef, 0x0123_4567));
    }

    #[test]
    fn tags_at_the_edges() {
        let t = Tags::new(80).unwrap();
        assert_eq!(t.tag(0, 0), Ok(1));
        let last = t.last_epoch();
        assert!(t.tag(last, 79).unwrap() as u64 + 80 > u32::MAX as u64);
        assert!(t.tag(last + 1, 0).is_err());
        assert_eq!(
            t.advance(last),
            Advance {
                epoch: 0,
                clear: true
            }
        );
        assert_eq!(Tags::new(0), Err(LayoutError::NoLaunches));
        assert!(Tags::new(u32::MAX / 2 + 1).is_err());
        assert_eq!(Tags::new(u32::MAX / 2).unwrap().last_epoch(), 1);
    }

    #[test]
    fn region_rejects_bad_names_and_sizes() {
        let mut b = ScratchLayout::builder();
        assert!(b.region::<u32>("a-b", 1, 1).is_err());
        assert!(b.region::<u32>("", 1, 1).is_err());
        assert!(b.region::<u32>("x", 0, 1).is_err());
        b.region::<f32>("x", 1, 1).unwrap();
        assert!(b.region::<u32>("x", 1, 1).is_err());
        assert!(matches!(
            b.region::<u32>("huge", u32::MAX, 16),
            Err(LayoutError::TooLarge { .. })
        ));
    }
}
