//! Placement of tasks on the CTAs of a persistent launch, and the rule that makes it deadlock-free.
//!
//! Tasks carry one global topological order of ranks ([`Task::order`]). Tasks that wait on each
//! other (the slices of one row's multi-slice top-k all-gathering their histograms) share a rank
//! and form a **gang**; a task alone at its rank is a gang of one. The rule (ARCHITECTURE.md
//! section 5):
//! - every CTA's list is strictly increasing in rank, so a gang's members sit on distinct CTAs;
//! - a task waits only on boxes written by earlier ranks or by its gang peers, never its own;
//! - every CTA of the grid is resident at once;
//! - and, the task functions' part, which no placement can show: a gang member publishes every box
//!   its peers wait on before it waits on any peer, from boxes of earlier ranks only.
//!
//! Why a launch that keeps the rule always finishes: let `r` be the earliest rank with an
//! unfinished task, so every task of an earlier rank has finished. Take any member `M` of rank `r`,
//! on CTA `c`: the tasks before `M` on `c` have earlier ranks (the list is strictly increasing), so
//! they have finished, and `c`, being resident, is running `M`. So every member of rank `r` is
//! running at once. Each member's waits on earlier ranks are satisfied, so each publishes what its
//! peers wait on; then each member's waits on its peers are satisfied as well, and every member of
//! rank `r` finishes. By induction on `r` the launch finishes. An all-gather of several rounds
//! (publish round `k`, wait on the peers' round `k`) finishes by the same step taken round by
//! round, since all members are running.
//!
//! No further rule is needed: a task that waits on a gang member is a peer or has a later rank,
//! and both cases are covered above. The argument fails exactly where the rule is broken: two
//! members on one CTA (the second never starts while the first waits on it), or a task ahead of a
//! member on its CTA that waits on a later rank (that rank's CTA may first need the gang to finish).
//!
//! Three more rules keep hand-offs sound and fast: every box has one writer; boxes written by
//! different CTAs never share a line; and a range of whole lines that a linear, MoE, MLA or head
//! task waits on has one writer a line, since such a task waits on it by the last box of each
//! line (`mbx_poll_range`), which that writer puts after everything it publishes.

use crate::layout::{BoxRange, BOXES_PER_LINE};
use crate::task::{Stage, Task, MAX_INPUTS};
use std::collections::HashMap;

/// Tasks by CTA, each list in the order the CTA runs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    lists: Vec<Vec<Task>>,
}

/// What the launch offers: the co-resident grid (occupancy x multiprocessors on a GPU) and the
/// scratch size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_resident: u32,
    pub scratch_boxes: u32,
}

/// A placement that passed [`Placement::check`]; the only kind the emulator and the GPU launch take
/// without saying `unchecked`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidPlacement {
    placement: Placement,
    limits: Limits,
}

/// The first rule a placement breaks, naming the tasks (by global order) and CTAs involved.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("the placement has no CTAs")]
    EmptyGrid,
    #[error("grid of {ctas} CTAs exceeds the {max_resident} that can be resident at once: a CTA that never starts can starve a waiter")]
    GridTooLarge { ctas: u32, max_resident: u32 },
    #[error("task {task} on CTA {cta} has {inputs} input ranges; at most {MAX_INPUTS}")]
    TooManyInputs { task: u32, cta: u32, inputs: u32 },
    #[error("task {task} on CTA {cta} uses boxes {}..{} beyond the {scratch_boxes}-box scratch", range.first, range.end())]
    OutOfScratch {
        task: u32,
        cta: u32,
        range: BoxRange,
        scratch_boxes: u32,
    },
    #[error("CTA {cta} runs task {before} before task {after} (positions {} and {position}); a CTA's list must increase in the global order", position - 1)]
    NotIncreasing {
        cta: u32,
        position: u32,
        before: u32,
        after: u32,
    },
    #[error("CTA {cta} runs two members of gang {order} (positions {first_position} and {second_position}); a gang's members must sit on distinct CTAs, or the second never starts while the first waits on it")]
    GangOnOneCta {
        order: u32,
        cta: u32,
        first_position: u32,
        second_position: u32,
    },
    #[error("box {box_index} is written by task {first} (CTA {first_cta}) and task {second} (CTA {second_cta}); a box has one writer")]
    TwoWriters {
        box_index: u32,
        first: u32,
        first_cta: u32,
        second: u32,
        second_cta: u32,
    },
    #[error("line {line} (boxes {}..{}) is written by task {first} on CTA {first_cta} and task {second} on CTA {second_cta}; boxes of different CTAs must not share a line", line * BOXES_PER_LINE, (line + 1) * BOXES_PER_LINE)]
    SharedLine {
        line: u32,
        first: u32,
        first_cta: u32,
        second: u32,
        second_cta: u32,
    },
    #[error(
        "task {task} on CTA {cta} waits on box {box_index}, which no task of the launch writes"
    )]
    NoProducer { task: u32, cta: u32, box_index: u32 },
    #[error("task {task} on CTA {cta} waits on box {box_index}, written by task {producer} on CTA {producer_cta}, which is later in the global order")]
    WaitsOnLater {
        task: u32,
        cta: u32,
        box_index: u32,
        producer: u32,
        producer_cta: u32,
    },
    #[error("task {task} on CTA {cta} waits on box {box_index}, which it writes itself")]
    WaitsOnItself { task: u32, cta: u32, box_index: u32 },
    #[error("task {task} on CTA {cta} waits on line {line} whole, by its last box, but box {box_index} has another writer than that box; a line waited on whole is written by one task")]
    SplitLine {
        task: u32,
        cta: u32,
        line: u32,
        box_index: u32,
    },
}

/// The flattened form the device reads: every CTA's tasks back to back, and `offsets[c]..offsets[c+1]`
/// the slice of CTA `c`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskTable {
    pub tasks: Vec<Task>,
    pub offsets: Vec<u32>,
}

impl Placement {
    pub fn new(lists: Vec<Vec<Task>>) -> Self {
        Placement { lists }
    }

    pub fn ctas(&self) -> u32 {
        self.lists.len() as u32
    }

    pub fn lists(&self) -> &[Vec<Task>] {
        &self.lists
    }

    /// Mutable access, for building placements and for tests that break the rule on purpose.
    pub fn lists_mut(&mut self) -> &mut Vec<Vec<Task>> {
        &mut self.lists
    }

    /// Every task with its CTA.
    pub fn tasks(&self) -> impl Iterator<Item = (u32, &Task)> {
        self.lists
            .iter()
            .enumerate()
            .flat_map(|(cta, list)| list.iter().map(move |t| (cta as u32, t)))
    }

    pub fn table(&self) -> TaskTable {
        let mut offsets = Vec::with_capacity(self.lists.len() + 1);
        offsets.push(0);
        let mut tasks = Vec::new();
        for list in &self.lists {
            tasks.extend_from_slice(list);
            offsets.push(tasks.len() as u32);
        }
        TaskTable { tasks, offsets }
    }

    /// Checks every rule and wraps the placement as valid, or names the first rule it breaks.
    pub fn check(self, limits: Limits) -> Result<ValidPlacement, PlacementError> {
        self.validate(limits)?;
        Ok(ValidPlacement {
            placement: self,
            limits,
        })
    }

    /// The rules, without taking the placement.
    pub fn validate(&self, limits: Limits) -> Result<(), PlacementError> {
        let ctas = self.ctas();
        if ctas == 0 {
            return Err(PlacementError::EmptyGrid);
        }
        if ctas > limits.max_resident {
            return Err(PlacementError::GridTooLarge {
                ctas,
                max_resident: limits.max_resident,
            });
        }
        self.check_lists(limits)?;
        let writers = self.writers(limits.scratch_boxes)?;
        self.check_waits(&writers)?;
        self.check_lines(&writers)
    }

    /// Shapes of single tasks, gangs on distinct CTAs, and the increasing order of each list.
    fn check_lists(&self, limits: Limits) -> Result<(), PlacementError> {
        for (cta, list) in self.lists.iter().enumerate() {
            let cta = cta as u32;
            let mut positions: HashMap<u32, u32> = HashMap::new();
            for (position, task) in list.iter().enumerate() {
                if task.n_inputs as usize > MAX_INPUTS {
                    return Err(PlacementError::TooManyInputs {
                        task: task.order,
                        cta,
                        inputs: task.n_inputs,
                    });
                }
                for range in std::iter::once(&task.out).chain(task.inputs()) {
                    if range.end() > limits.scratch_boxes as u64 {
                        return Err(PlacementError::OutOfScratch {
                            task: task.order,
                            cta,
                            range: *range,
                            scratch_boxes: limits.scratch_boxes,
                        });
                    }
                }
                let position = position as u32;
                if let Some(first_position) = positions.insert(task.order, position) {
                    return Err(PlacementError::GangOnOneCta {
                        order: task.order,
                        cta,
                        first_position,
                        second_position: position,
                    });
                }
                if position > 0 && list[position as usize - 1].order > task.order {
                    return Err(PlacementError::NotIncreasing {
                        cta,
                        position,
                        before: list[position as usize - 1].order,
                        after: task.order,
                    });
                }
            }
        }
        Ok(())
    }

    /// The writer (order, CTA) of every box, checking one writer per box and one CTA per line.
    pub(crate) fn writers(
        &self,
        scratch_boxes: u32,
    ) -> Result<Vec<Option<(u32, u32)>>, PlacementError> {
        let mut by_box: Vec<Option<(u32, u32)>> = vec![None; scratch_boxes as usize];
        let lines = scratch_boxes.div_ceil(BOXES_PER_LINE) as usize;
        let mut by_line: Vec<Option<(u32, u32)>> = vec![None; lines];
        for (cta, task) in self.tasks() {
            for b in task.out.boxes() {
                let b = b as u32;
                if let Some((first, first_cta)) = by_box[b as usize] {
                    return Err(PlacementError::TwoWriters {
                        box_index: b,
                        first,
                        first_cta,
                        second: task.order,
                        second_cta: cta,
                    });
                }
                by_box[b as usize] = Some((task.order, cta));
                let line = b / BOXES_PER_LINE;
                match by_line[line as usize] {
                    Some((first, first_cta)) if first_cta != cta => {
                        return Err(PlacementError::SharedLine {
                            line,
                            first,
                            first_cta,
                            second: task.order,
                            second_cta: cta,
                        })
                    }
                    Some(_) => {}
                    None => by_line[line as usize] = Some((task.order, cta)),
                }
            }
        }
        Ok(by_box)
    }

    /// Every wait is on an earlier rank or on a gang peer (same rank, another CTA).
    fn check_waits(&self, writers: &[Option<(u32, u32)>]) -> Result<(), PlacementError> {
        for (cta, task) in self.tasks() {
            for b in task.inputs().iter().flat_map(|r| r.boxes()) {
                let box_index = b as u32;
                match writers[b as usize] {
                    None => {
                        return Err(PlacementError::NoProducer {
                            task: task.order,
                            cta,
                            box_index,
                        })
                    }
                    Some((producer, producer_cta)) if producer > task.order => {
                        return Err(PlacementError::WaitsOnLater {
                            task: task.order,
                            cta,
                            box_index,
                            producer,
                            producer_cta,
                        })
                    }
                    // Same rank on the same CTA: after `check_lists`, the task itself.
                    Some((producer, producer_cta))
                        if producer == task.order && producer_cta == cta =>
                    {
                        return Err(PlacementError::WaitsOnItself {
                            task: task.order,
                            cta,
                            box_index,
                        })
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }
}

/// Whether a task's waits go a line at a time: the linear, MoE, MLA and head stages wait on a
/// range of whole lines by the last box of each line (`mbx_poll_range`), which its writer puts
/// after everything it publishes.
fn waits_by_line(task: &Task) -> bool {
    matches!(
        Stage::from_bits(task.stage_bits()),
        Some(Stage::Linear | Stage::Moe | Stage::Mla | Stage::Head)
    )
}

/// Whether `range` is whole lines: the ranges a task that waits by line waits on by their last boxes.
fn whole_lines(range: &BoxRange) -> bool {
    range.len != 0 && range.first % BOXES_PER_LINE == 0 && range.len % BOXES_PER_LINE == 0
}

impl Placement {
    /// Every line of a range of whole lines that a task waiting by line waits on has one writer:
    /// seeing its last box must mean every box of the line is written.
    fn check_lines(&self, writers: &[Option<(u32, u32)>]) -> Result<(), PlacementError> {
        for (cta, task) in self.tasks().filter(|(_, t)| waits_by_line(t)) {
            for range in task.inputs().iter().filter(|r| whole_lines(r)) {
                for line_first in
                    (range.first..range.first + range.len).step_by(BOXES_PER_LINE as usize)
                {
                    let last = writers[(line_first + BOXES_PER_LINE - 1) as usize];
                    if let Some(b) = (line_first..line_first + BOXES_PER_LINE)
                        .find(|&b| writers[b as usize] != last)
                    {
                        return Err(PlacementError::SplitLine {
                            task: task.order,
                            cta,
                            line: line_first / BOXES_PER_LINE,
                            box_index: b,
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

impl ValidPlacement {
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn into_inner(self) -> Placement {
        self.placement
    }
}
