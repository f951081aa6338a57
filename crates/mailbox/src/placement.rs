//! Placement of tasks on the CTAs of a persistent launch, and the rule that makes it deadlock-free.
//!
//! The rule (ARCHITECTURE.md section 5): tasks carry one global topological order; each CTA's list is
//! increasing in it; a task waits only on boxes written by tasks earlier in it; every CTA of the
//! grid is resident at once. Then the earliest unfinished task can always run: everything it
//! waits on is earlier, so finished, and everything before it on its CTA is earlier, so finished.
//! Two more rules keep hand-offs sound and fast: every box has one writer, and boxes written by
//! different CTAs never share a line.

use crate::layout::{BoxRange, BOXES_PER_LINE};
use crate::task::{Task, MAX_INPUTS};
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
    #[error("task order {order} is used twice, on CTA {first_cta} and CTA {second_cta}")]
    DuplicateOrder {
        order: u32,
        first_cta: u32,
        second_cta: u32,
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
    #[error("task {task} on CTA {cta} waits on box {box_index}, written by task {producer} on CTA {producer_cta}, which is not earlier in the global order")]
    WaitsOnLater {
        task: u32,
        cta: u32,
        box_index: u32,
        producer: u32,
        producer_cta: u32,
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
        self.check_waits(&writers)
    }

    /// Shapes of single tasks and the increasing order of each list, and unique orders.
    fn check_lists(&self, limits: Limits) -> Result<(), PlacementError> {
        let mut seen: HashMap<u32, u32> = HashMap::new();
        for (cta, list) in self.lists.iter().enumerate() {
            let cta = cta as u32;
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
                if position > 0 && list[position - 1].order >= task.order {
                    if list[position - 1].order == task.order {
                        return Err(PlacementError::DuplicateOrder {
                            order: task.order,
                            first_cta: cta,
                            second_cta: cta,
                        });
                    }
                    return Err(PlacementError::NotIncreasing {
                        cta,
                        position: position as u32,
                        before: list[position - 1].order,
                        after: task.order,
                    });
                }
                if let Some(first_cta) = seen.insert(task.order, cta) {
                    return Err(PlacementError::DuplicateOrder {
                        order: task.order,
                        first_cta,
                        second_cta: cta,
                    });
                }
            }
        }
        Ok(())
    }

    /// The writer (order, CTA) of every box, checking one writer per box and one CTA per line.
    fn writers(&self, scratch_boxes: u32) -> Result<Vec<Option<(u32, u32)>>, PlacementError> {
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
                    Some((producer, producer_cta)) if producer >= task.order => {
                        return Err(PlacementError::WaitsOnLater {
                            task: task.order,
                            cta,
                            box_index,
                            producer,
                            producer_cta,
                        })
                    }
                    Some(_) => {}
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
