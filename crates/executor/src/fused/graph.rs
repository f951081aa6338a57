//! One launch's task graph as the parts of a layer build it together (ARCHITECTURE.md section 5).
//! A layer is one fused launch made of parts (the front half, the attention half, the MoE half or
//! the dense MLP, the tail); a part is a function that adds its tasks to a [`LaunchGraph`]:
//!
//! ```text
//! fn xxx_part(g: &mut LaunchGraph, ..., input: Handoff) -> Result<Handoff, ...>
//! ```
//!
//! What the parts share lives here, once:
//! - **ranks**: one global topological order, handed out in the order parts ask
//!   ([`LaunchGraph::rank`]); a part that consumes another's output asks after it, so every wait
//!   points to an earlier rank (the placement rule's deadlock freedom);
//! - **boxes**: one scratch layout; a part adds its regions with [`LaunchGraph::regions`] under
//!   names of its own. A hand-off made by several tasks uses [`LaunchGraph::completion`]: each
//!   producer writes a whole line of boxes (as the linear task does), so the boxes of all of them
//!   are one contiguous range, and a consumer waits on it as one input (a thread a box);
//! - **CTA lists**: a task goes to the end of its CTA's list; [`LaunchGraph::next_cta`] walks the
//!   grid in turn, so parts spread their tasks without knowing of each other; a link that follows
//!   an uneven one takes the CTAs with the fewest tasks instead ([`LaunchGraph::by_load`],
//!   [`LaunchGraph::least_loaded`], [`LaunchGraph::lightest_block`]);
//! - **the activation arena**: the rows handed from part to part live in one device buffer, as
//!   named, aligned byte slices ([`LaunchGraph::arena`]);
//! - **the launch's linear matrices**: the linear stage takes one list of matrices per launch;
//!   a part reserves indices with [`LaunchGraph::matrix`] and fills them when it binds buffers.
//!
//! [`LaunchGraph::finish`] checks the whole placement by the rule (gangs included) before anything
//! can run it.

use mailbox::layout::{
    BoxRange, LayoutBuilder, LayoutError, Region, ScratchLayout, BOXES_PER_LINE,
};
use mailbox::{Limits, Placement, Stage, Task, ValidPlacement};

/// Alignment of every arena slice: a whole line of the widest loads (and of TMA's 128 B).
pub const ARENA_ALIGN: u64 = 256;

/// Bad use of the graph, found while a launch is planned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    #[error("a launch needs at least one CTA")]
    NoCtas,
    #[error("task {order} placed on CTA {cta}; the launch has {ctas}")]
    CtaPastGrid { order: u32, cta: u32, ctas: u32 },
    #[error("task {order} has a rank the graph never handed out (the next is {next})")]
    UnknownRank { order: u32, next: u32 },
    #[error("arena slice `{0}` is named twice")]
    DuplicateSlice(String),
    #[error("boxes: {0}")]
    Layout(#[from] LayoutError),
    #[error("placement: {0}")]
    Placement(#[from] mailbox::PlacementError),
}

/// A slice of the launch's activation arena, in bytes from its start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaSlice {
    pub offset: u64,
    pub bytes: u64,
}

/// What one part hands the next: the data, and the boxes a consumer waits on before reading it
/// (an empty range: the data is ready before the launch starts, e.g. an input the host wrote).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handoff {
    pub data: ArenaSlice,
    pub ready: BoxRange,
}

impl Handoff {
    /// The input ranges a consuming task lists: the ready boxes, or none.
    pub fn waits(&self) -> Vec<BoxRange> {
        if self.ready.len == 0 {
            Vec::new()
        } else {
            vec![self.ready]
        }
    }
}

/// The completion boxes of one hand-off: a line for each producing task.
#[derive(Clone, Copy, Debug)]
pub struct Completion(pub Region<u32>);

impl Completion {
    /// The boxes producer `i` writes (its whole line).
    pub fn line(&self, i: u32) -> Option<BoxRange> {
        self.0.slot(i)
    }

    /// Every producer's line: what a consumer of the whole hand-off waits on.
    pub fn all(&self) -> BoxRange {
        BoxRange::new(self.0.offset(), self.0.slots() * self.0.stride())
    }
}

/// The arena's slices by name, and its size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArenaLayout {
    pub slices: Vec<(String, ArenaSlice)>,
    pub bytes: u64,
}

impl ArenaLayout {
    pub fn get(&self, name: &str) -> Option<ArenaSlice> {
        self.slices.iter().find(|(n, _)| n == name).map(|(_, s)| *s)
    }
}

/// A planned launch, checked: what the device side needs to run it.
#[derive(Clone, Debug)]
pub struct PlannedLaunch {
    pub layout: ScratchLayout,
    pub placement: ValidPlacement,
    pub arena: ArenaLayout,
    /// Length of the launch's linear matrix list.
    pub matrices: u32,
}

/// The graph of one launch while its parts add to it.
#[derive(Debug)]
pub struct LaunchGraph {
    ctas: u32,
    regions: LayoutBuilder,
    lists: Vec<Vec<Task>>,
    next_rank: u32,
    cursor: u32,
    arena: ArenaLayout,
    matrices: u32,
}

impl LaunchGraph {
    /// An empty graph for a grid of `ctas` CTAs (one a SM).
    pub fn new(ctas: u32) -> Result<Self, GraphError> {
        if ctas == 0 {
            return Err(GraphError::NoCtas);
        }
        Ok(LaunchGraph {
            ctas,
            regions: LayoutBuilder::new(),
            lists: vec![Vec::new(); ctas as usize],
            next_rank: 0,
            cursor: 0,
            arena: ArenaLayout::default(),
            matrices: 0,
        })
    }

    pub fn ctas(&self) -> u32 {
        self.ctas
    }

    /// The launch's scratch layout, for a part to add its box regions to.
    pub fn regions(&mut self) -> &mut LayoutBuilder {
        &mut self.regions
    }

    /// Completion boxes for a hand-off made by `producers` tasks: a whole line each (producer i
    /// writes `slot(i)` with `BOXES_PER_LINE` boxes), so [`Completion::all`] is one range.
    pub fn completion(&mut self, name: &str, producers: u32) -> Result<Completion, GraphError> {
        Ok(Completion(self.regions.region(
            name,
            producers,
            BOXES_PER_LINE,
        )?))
    }

    /// The next rank of the global order. Tasks given the same rank form a gang.
    pub fn rank(&mut self) -> u32 {
        self.next_rank += 1;
        self.next_rank - 1
    }

    /// `n` consecutive ranks, for a part that numbers its tasks itself (counted from the start).
    pub fn ranks(&mut self, n: u32) -> std::ops::Range<u32> {
        self.next_rank += n;
        self.next_rank - n..self.next_rank
    }

    /// The CTA after the one this returned last, wrapping: parts that take CTAs in turn spread
    /// the launch's tasks over the grid.
    pub fn next_cta(&mut self) -> u32 {
        let cta = self.cursor;
        self.cursor = (self.cursor + 1) % self.ctas;
        cta
    }

    /// Every CTA, those with the fewest tasks so far first, ties in turn from the one
    /// [`Self::next_cta`] returns next. A link whose tasks all wait on the one before does best on
    /// the CTAs that are done first: a CTA that took two of the last link's tasks would start its
    /// task of this link a whole task later than the others, and the link ends with its last task.
    pub fn by_load(&self) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.ctas)
            .map(|i| (self.cursor + i) % self.ctas)
            .collect();
        order.sort_by_key(|&c| self.lists[c as usize].len());
        order
    }

    /// The CTAs with the fewest tasks so far, in the order of [`Self::by_load`].
    pub fn least_loaded(&self) -> Vec<u32> {
        let order = self.by_load();
        let least = self.lists[order[0] as usize].len();
        order
            .into_iter()
            .take_while(|&c| self.lists[c as usize].len() == least)
            .collect()
    }

    /// The CTAs that hold a task of `stage` so far, in CTA order.
    pub fn holding(&self, stage: Stage) -> Vec<u32> {
        (0..self.ctas)
            .filter(|&c| {
                self.lists[c as usize]
                    .iter()
                    .any(|t| Stage::from_bits(t.stage_bits()) == Some(stage))
            })
            .collect()
    }

    /// The first CTA of the `n` consecutive CTAs (wrapping) whose busiest holds the fewest tasks so
    /// far, ties to the first in turn from the one [`Self::next_cta`] returns next: where a part
    /// whose tasks sit on consecutive CTAs runs soonest.
    pub fn lightest_block(&self, n: u32) -> u32 {
        let n = n.clamp(1, self.ctas);
        let load = |c: u32| self.lists[(c % self.ctas) as usize].len();
        (0..self.ctas)
            .map(|i| (self.cursor + i) % self.ctas)
            .min_by_key(|&first| (first..first + n).map(load).max().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Appends `task` to CTA `cta`'s list. The rule's other conditions (increasing ranks on a
    /// CTA, waits on earlier ranks, gangs on distinct CTAs) are checked by [`Self::finish`].
    pub fn push(&mut self, cta: u32, task: Task) -> Result<(), GraphError> {
        if cta >= self.ctas {
            return Err(GraphError::CtaPastGrid {
                order: task.order,
                cta,
                ctas: self.ctas,
            });
        }
        if task.order >= self.next_rank {
            return Err(GraphError::UnknownRank {
                order: task.order,
                next: self.next_rank,
            });
        }
        self.lists[cta as usize].push(task);
        Ok(())
    }

    /// A slice of `bytes` of the activation arena, named for dumps and errors.
    pub fn arena(&mut self, name: &str, bytes: u64) -> Result<ArenaSlice, GraphError> {
        if self.arena.get(name).is_some() {
            return Err(GraphError::DuplicateSlice(name.to_owned()));
        }
        let slice = ArenaSlice {
            offset: self.arena.bytes,
            bytes,
        };
        self.arena.bytes = (slice.offset + bytes).next_multiple_of(ARENA_ALIGN);
        self.arena.slices.push((name.to_owned(), slice));
        Ok(slice)
    }

    /// Bytes of the arena the parts have taken so far (0 before the first slice).
    pub fn arena_bytes(&self) -> u64 {
        self.arena.bytes
    }

    /// Reserves the next index of the launch's linear matrix list.
    pub fn matrix(&mut self) -> u32 {
        self.matrices += 1;
        self.matrices - 1
    }

    /// The graph as a checked placement, with its scratch layout and arena.
    pub fn finish(self) -> Result<PlannedLaunch, GraphError> {
        let layout = self.regions.build();
        let placement = Placement::new(self.lists).check(Limits {
            max_resident: self.ctas,
            scratch_boxes: layout.boxes(),
        })?;
        Ok(PlannedLaunch {
            layout,
            placement,
            arena: self.arena,
            matrices: self.matrices,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(g: &mut LaunchGraph, order: u32, out: BoxRange, waits: &[BoxRange]) -> Task {
        let _ = g;
        Task::new(
            Task::kind_of(Stage::Synthetic, 1),
            order,
            out,
            waits,
            [0; 3],
        )
        .unwrap()
    }

    /// Two parts, the second waiting on the first's boxes: a valid placement.
    #[test]
    fn parts_compose_into_one_checked_launch() {
        let mut g = LaunchGraph::new(4).unwrap();
        let first = g.completion("a_done", 2).unwrap();
        let x = g.arena("a_rows", 100).unwrap();
        for line in 0..2 {
            let rank = g.rank();
            let cta = g.next_cta();
            let t = task(&mut g, rank, first.line(line).unwrap(), &[]);
            g.push(cta, t).unwrap();
        }
        let handoff = Handoff {
            data: x,
            ready: first.all(),
        };
        let second = g.completion("b_done", 1).unwrap();
        let y = g.arena("b_rows", 10).unwrap();
        assert_eq!(y.offset % ARENA_ALIGN, 0);
        assert!(y.offset >= x.offset + x.bytes);
        let rank = g.rank();
        let cta = g.next_cta();
        let t = task(&mut g, rank, second.line(0).unwrap(), &handoff.waits());
        g.push(cta, t).unwrap();
        let launch = g.finish().unwrap();
        assert_eq!(launch.arena.get("b_rows"), Some(y));
        assert_eq!(launch.placement.placement().lists()[2].len(), 1);
    }

    /// A consumer given a rank before its producer's waits on a later rank: the check refuses.
    #[test]
    fn a_wait_on_a_later_rank_is_refused() {
        let mut g = LaunchGraph::new(2).unwrap();
        let boxes = g.regions().region::<u32>("done", 1, 1).unwrap();
        let early = g.rank();
        let late = g.rank();
        let consumer = task(
            &mut g,
            early,
            BoxRange::default(),
            &[boxes.slot(0).unwrap()],
        );
        let producer = task(&mut g, late, boxes.slot(0).unwrap(), &[]);
        g.push(0, consumer).unwrap();
        g.push(1, producer).unwrap();
        assert!(matches!(g.finish(), Err(GraphError::Placement(_))));
    }

    /// CTAs by their tasks so far, ties in turn from the cursor; the lightest run of consecutive
    /// CTAs wraps around the grid.
    #[test]
    fn ctas_order_by_load() {
        let mut g = LaunchGraph::new(5).unwrap();
        for cta in [0, 0, 1, 3, 4] {
            let rank = g.rank();
            let t = task(&mut g, rank, BoxRange::default(), &[]);
            g.push(cta, t).unwrap();
        }
        g.next_cta();
        g.next_cta();
        g.next_cta();
        assert_eq!(g.by_load(), vec![2, 3, 4, 1, 0]);
        assert_eq!(g.least_loaded(), vec![2]);
        assert_eq!(g.lightest_block(2), 3);
        assert_eq!(g.lightest_block(3), 1);
        let rank = g.rank();
        let t = task(&mut g, rank, BoxRange::default(), &[]);
        g.push(2, t).unwrap();
        assert_eq!(g.least_loaded(), vec![3, 4, 1, 2]);
        assert_eq!(g.lightest_block(4), 1);
    }

    /// The CTAs holding a stage's tasks (of any of its kinds), whatever else they hold.
    #[test]
    fn ctas_holding_a_stage() {
        let mut g = LaunchGraph::new(4).unwrap();
        for (cta, stage, own) in [
            (0, Stage::Synthetic, 1),
            (2, Stage::Select, 1),
            (2, Stage::Linear, 1),
            (3, Stage::Select, 2),
        ] {
            let rank = g.rank();
            let kind = Task::kind_of(stage, own);
            let t = Task::new(kind, rank, BoxRange::default(), &[], [0; 3]).unwrap();
            g.push(cta, t).unwrap();
        }
        assert_eq!(g.holding(Stage::Select), vec![2, 3]);
        assert_eq!(g.holding(Stage::Linear), vec![2]);
        assert_eq!(g.holding(Stage::Moe), Vec::<u32>::new());
    }

    #[test]
    fn bad_ctas_ranks_and_names_are_errors() {
        assert_eq!(LaunchGraph::new(0).unwrap_err(), GraphError::NoCtas);
        let mut g = LaunchGraph::new(2).unwrap();
        let unranked = task(&mut g, 0, BoxRange::default(), &[]);
        assert!(matches!(
            g.push(0, unranked),
            Err(GraphError::UnknownRank { .. })
        ));
        let rank = g.rank();
        let t = task(&mut g, rank, BoxRange::default(), &[]);
        assert!(matches!(g.push(2, t), Err(GraphError::CtaPastGrid { .. })));
        g.arena("x", 8).unwrap();
        assert_eq!(
            g.arena("x", 8).unwrap_err(),
            GraphError::DuplicateSlice("x".into())
        );
    }
}
