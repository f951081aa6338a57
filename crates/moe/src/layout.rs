//! Pure shape and placement math of the MoE layer: the rows each routed expert serves (the
//! dispatch the reference walks), and the MoE launch's tasks, boxes, placement and shared memory
//! (`kernels/moe_task.h` and the linear stage's `lin_task.h` hold the device twins).

use crate::error::{invalid, Result};
use linear::layout::{
    expert_arg, pair_range_arg, split_tiles, LayoutError as LinLayoutError, TileRange,
    KIND_EXPERT_PAIR, KIND_TILES,
};
use mailbox::layout::{BoxRange, BOXES_PER_LINE};
use mailbox::{Placement, Stage, Task};
use model::weights::packed::{Pairing, TILE_ROWS};
use model::{ModelConfig, RankShapes, WeightFormat};

/// One of a row's routed experts and its weight in the row's sum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Route {
    pub expert: usize,
    pub weight: f32,
}

/// For every expert, the (row, slot) pairs routed to it, rows ascending; `slot` indexes the row's
/// routes. Every (row, slot) appears exactly once. Experts are visited in ascending order by
/// whoever walks the result, which is also the order transformers sums a row's experts in.
pub fn dispatch(routes: &[Vec<Route>], experts: usize) -> Result<Vec<Vec<(usize, usize)>>> {
    let mut table = vec![Vec::new(); experts];
    for (row, row_routes) in routes.iter().enumerate() {
        for (slot, route) in row_routes.iter().enumerate() {
            let served = table.get_mut(route.expert).ok_or_else(|| {
                invalid(
                    "dispatch",
                    format!("row {row} routes to expert {} of {experts}", route.expert),
                )
            })?;
            served.push((row, slot));
        }
    }
    Ok(table)
}

// ---- the MoE launch: tasks, boxes, placement ----------------------------------------------------

/// `MOE_KIND_ROUTE`: the router's choice, published to the slots.
pub const KIND_ROUTE: u32 = Task::kind_of(Stage::Moe, 1);
/// `MOE_KIND_COMBINE`: a column range of residual + shared + the routed experts' weighted sum.
pub const KIND_COMBINE: u32 = Task::kind_of(Stage::Moe, 2);
/// `MOE_NORM_TOPK` of `moe_args.flags`.
pub const FLAG_NORM_TOPK: u32 = 1;
/// Columns a combine task takes at most.
pub const COMBINE_COLUMNS: u32 = 256;
/// A combine task's columns start and end on multiples of this (`moe_combine`: a thread's
/// column pair, one 4-byte load).
pub const COMBINE_CHUNK: u32 = 2;

/// The matrices of a launch's `lin_args.mats` (the router's k-splits from `MAT_ROUTER` on), and
/// its expert banks (`lin_args.experts`).
pub const MAT_SHARED_GATE_UP: u32 = 0;
pub const MAT_SHARED_DOWN: u32 = 1;
pub const MAT_ROUTER: u32 = 2;
/// The router is split along k into at most this many matrices, so that its 16 tiles of 256
/// experts spread over more CTAs: the routed experts cannot start before it ends. The route task
/// loads every split's logits at once, up to this many (`MOE_MAX_ROUTER_SPLITS`).
pub const MAX_ROUTER_SPLITS: usize = 4;
/// The route task routes a row by one wave, each lane holding this many experts
/// (`MOE_ROUTE_PER_LANE`).
pub const ROUTE_LANE_EXPERTS: usize = 8;
/// The experts the route task takes: a lane's share times the narrower (32-lane) wave.
pub const ROUTE_MAX_EXPERTS: usize = 32 * ROUTE_LANE_EXPERTS;
/// A row's scores in the route task's shared memory (`MOE_ROW_SCORES`): a lane's share times the
/// wider (64-lane) wave.
pub const ROUTE_ROW_SCORES: usize = 64 * ROUTE_LANE_EXPERTS;
/// The expert groups the route task takes: one a lane of a 32-lane wave.
pub const ROUTE_MAX_GROUPS: usize = 32;
pub const BANK_GATE_UP: u32 = 0;
/// The bank after the gate/up's: a pair task reads its down from the bank after its gate/up's.
pub const BANK_DOWN: u32 = BANK_GATE_UP + 1;

/// One MoE launch's shape: a TP rank's slices of every expert, the step's rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeShape {
    pub rows: usize,
    pub hidden: usize,
    /// The rank's slice of an expert's intermediate (the shared expert's too).
    pub inter: usize,
    pub experts: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    /// The experts' and shared expert's weights (the router is bf16).
    pub format: WeightFormat,
}

impl MoeShape {
    /// The shape of a TP `tp` rank of `cfg` for `rows` rows.
    pub fn new(cfg: &ModelConfig, tp: usize, rows: usize, format: WeightFormat) -> Result<Self> {
        let ranks = RankShapes::new(cfg, tp)?;
        if cfg.n_shared_experts != 1 {
            return Err(invalid(
                "moe launch",
                format!(
                    "{} shared experts; the launch takes one",
                    cfg.n_shared_experts
                ),
            ));
        }
        let shape = MoeShape {
            rows,
            hidden: cfg.hidden_size,
            inter: ranks.expert_intermediate,
            experts: cfg.n_routed_experts,
            top_k: cfg.num_experts_per_tok,
            n_group: cfg.n_group,
            topk_group: cfg.topk_group,
            format,
        };
        shape.check()?;
        Ok(shape)
    }

    fn check(&self) -> Result<()> {
        if !(1..=linear::layout::MAX_ROWS).contains(&self.rows) {
            return Err(invalid(
                "moe launch",
                format!(
                    "{} rows; the launch takes 1 to {}",
                    self.rows,
                    linear::layout::MAX_ROWS
                ),
            ));
        }
        let routing = crate::reference::Routing {
            top_k: self.top_k,
            norm_topk_prob: true,
            scaling: 1.0,
            n_group: self.n_group,
            topk_group: self.topk_group,
        };
        routing.check(self.experts)?;
        if self.experts > ROUTE_MAX_EXPERTS || self.n_group > ROUTE_MAX_GROUPS {
            return Err(invalid(
                "moe launch",
                format!(
                    "{} experts in {} groups; the route task takes at most {ROUTE_MAX_EXPERTS} \
                     experts in at most {ROUTE_MAX_GROUPS} groups",
                    self.experts, self.n_group
                ),
            ));
        }
        for (what, k) in [("hidden", self.hidden), ("expert intermediate", self.inter)] {
            if k == 0 || k % model::WEIGHT_BLOCK != 0 {
                return Err(invalid(
                    "moe launch",
                    format!(
                        "{what} {k} is not a positive multiple of {}",
                        model::WEIGHT_BLOCK
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Slots of distinct chosen experts a step can fill.
    pub fn slots(&self) -> usize {
        (self.rows * self.top_k).min(self.experts)
    }

    /// Splits of the router along k: the most, up to [`MAX_ROUTER_SPLITS`], that cut hidden into
    /// whole k-blocks.
    pub fn router_splits(&self) -> usize {
        let blocks = self.hidden / model::WEIGHT_BLOCK;
        (1..=MAX_ROUTER_SPLITS.min(blocks))
            .rev()
            .find(|s| blocks % s == 0)
            .unwrap_or(1)
    }

    /// Tiles of each of the router's splits.
    pub fn router_tiles(&self) -> u32 {
        self.experts.div_ceil(TILE_ROWS) as u32
    }

    pub fn gate_up_tiles(&self) -> u32 {
        self.inter.div_ceil(Pairing::GateUp.columns_per_tile()) as u32
    }

    pub fn down_tiles(&self) -> u32 {
        self.hidden.div_ceil(TILE_ROWS) as u32
    }
}

/// Dynamic shared memory of a CTA of `threads`: the largest of the linear tasks' and the route
/// task's (`moe_route`: each row's chosen set as [`ROUTE_LANE_EXPERTS`] ballot words and their
/// union, each row's experts and weights, the slots' experts, the experts' slots, the bias, each
/// row's [`ROUTE_ROW_SCORES`] scores and biased scores).
pub fn lds_bytes(shape: &MoeShape, threads: u32) -> std::result::Result<u32, LinLayoutError> {
    let lin = |k| linear::layout::lds_bytes(threads, k, shape.rows);
    let (r, k, n) = (shape.rows, shape.top_k, ROUTE_ROW_SCORES);
    let words = 8 * (r + 1) * ROUTE_LANE_EXPERTS;
    let route = words + 4 * (2 * r * k + shape.slots() + n + shape.experts + 2 * r * n);
    Ok(lin(shape.hidden)?.max(lin(shape.inter)?).max(route as u32))
}

/// Where a launch's MoE tasks start: the first free box (a line boundary), the first free rank,
/// the index of its first matrix in the launch's list (its matrices are `first_matrix + MAT_*`),
/// and the boxes that say the input rows and the residual are ready (none in a launch of its own).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MoeStart {
    pub first_box: u32,
    pub first_order: u32,
    pub first_matrix: u32,
    pub input: Vec<BoxRange>,
    pub residual: Vec<BoxRange>,
}

/// The placed tasks of one MoE launch and the boxes each group of them writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoePlan {
    pub placement: Placement,
    /// One past the last box (a line boundary).
    pub end_box: u32,
    /// One past the last rank.
    pub end_order: u32,
    pub router: BoxRange,
    /// Slot j's box is `slots.first + j` (its value: the expert, or `linear::layout::NO_EXPERT`).
    pub slots: BoxRange,
    pub shared_gate_up: BoxRange,
    pub shared_down: BoxRange,
    /// Each slot's gang of pair tasks: a line a member, the line's first box its gate/up's.
    pub experts: Vec<BoxRange>,
    /// Every slot's gang, slot by slot: the routed experts' outputs are ready when all are.
    pub routed: BoxRange,
    /// The combine tasks' boxes: the MoE output rows are ready when all are.
    pub combine: BoxRange,
}

struct Cursor {
    lists: Vec<Vec<Task>>,
    cta: u32,
    order: u32,
    next_box: u32,
}

impl Cursor {
    /// Adds a task on the next CTA with its own line of boxes, or `lines` of them, at the current
    /// rank (a gang's members share it: the caller moves to the next rank after the last).
    fn push_member(
        &mut self,
        kind: u32,
        inputs: &[BoxRange],
        args: [u32; 3],
        lines: u32,
    ) -> Result<()> {
        let out = BoxRange::new(self.next_box, lines * BOXES_PER_LINE);
        let task = Task::new(kind, self.order, out, inputs, args)
            .map_err(|e| invalid("moe launch", e.to_string()))?;
        self.lists[self.cta as usize].push(task);
        self.next_box += out.len;
        self.cta = (self.cta + 1) % self.lists.len() as u32;
        Ok(())
    }

    /// Adds a task of a rank of its own.
    fn push(&mut self, kind: u32, inputs: &[BoxRange], args: [u32; 3], lines: u32) -> Result<()> {
        self.push_member(kind, inputs, args, lines)?;
        self.order += 1;
        Ok(())
    }

    /// One matrix's tiles split into at most `parts` tasks; returns the boxes they write.
    fn matrix(
        &mut self,
        kind: u32,
        arg0: u32,
        tiles: u32,
        parts: u32,
        inputs: &[BoxRange],
    ) -> Result<BoxRange> {
        let first = self.next_box;
        for r in split_tiles(tiles, parts) {
            self.push(kind, inputs, [arg0, r.first, r.count], 1)?;
        }
        Ok(BoxRange::new(first, self.next_box - first))
    }

    /// Slot `slot`'s expert as a gang of `members` pair tasks on consecutive CTAs, member i with
    /// the i-th runs of the gate/up's and the down's tiles (empty where a matrix has fewer tiles
    /// than members); each member waits on the lines of the others. Returns the gang's lines.
    fn expert_gang(
        &mut self,
        shape: &MoeShape,
        slot: u32,
        slot_box: BoxRange,
        members: u32,
        input: &[BoxRange],
    ) -> Result<BoxRange> {
        let runs = |tiles| {
            let mut r = split_tiles(tiles, members);
            r.resize(
                members as usize,
                TileRange {
                    first: tiles,
                    count: 0,
                },
            );
            r
        };
        let too_large = || invalid("moe launch", format!("slot {slot} or its tiles"));
        let bank = expert_arg(BANK_GATE_UP, slot).ok_or_else(too_large)?;
        let first = self.next_box;
        for (i, (up, down)) in (0..members).zip(
            runs(shape.gate_up_tiles())
                .into_iter()
                .zip(runs(shape.down_tiles())),
        ) {
            let before = BoxRange::new(first, i * BOXES_PER_LINE);
            let after = BoxRange::new(
                first + (i + 1) * BOXES_PER_LINE,
                (members - i - 1) * BOXES_PER_LINE,
            );
            let mut inputs = vec![slot_box, before, after];
            inputs.extend_from_slice(input);
            let args = [
                bank,
                pair_range_arg(up).ok_or_else(too_large)?,
                pair_range_arg(down).ok_or_else(too_large)?,
            ];
            self.push_member(KIND_EXPERT_PAIR, &inputs, args, 1)?;
        }
        self.order += 1;
        Ok(BoxRange::new(first, self.next_box - first))
    }
}

/// The MoE launch's task graph placed over `ctas` CTAs, in one global order: the router's partial
/// logits (its k-splits, each a linear matrix of a task a tile), the route task, the shared
/// expert's gate/up and down (which wait on the input alone, so they run beside the router, over a
/// quarter of the CTAs each), every slot's expert as a gang of pair tasks, then the combine tasks.
/// Tasks go to CTAs in turn from CTA 0; each slot's gang has `ctas / slots` members, so that the
/// gangs together take the grid once. An expert's weights can only be read once the route has
/// named it; a member streams its run of the gate/up, and its run of the down lands in its LDS
/// meanwhile, so the down's weights are on chip once the gang's gate/up parts are stored (at one
/// row, 8 slots: 16 members of 2 gate/up tiles and 24 down tiles each).
pub fn place(shape: &MoeShape, ctas: u32, start: &MoeStart) -> Result<MoePlan> {
    shape.check()?;
    if ctas == 0 {
        return Err(invalid("moe launch", "no CTAs to place on"));
    }
    if start.first_box % BOXES_PER_LINE != 0 || start.input.len() > 1 || start.residual.len() > 1 {
        return Err(invalid(
            "moe launch",
            format!(
                "boxes from {} with {} input and {} residual ranges: a line boundary and at most one range each",
                start.first_box,
                start.input.len(),
                start.residual.len()
            ),
        ));
    }
    let mat = |m: u32| start.first_matrix + m;
    let slots = shape.slots() as u32;
    let mut c = Cursor {
        lists: vec![Vec::new(); ctas as usize],
        cta: 0,
        order: start.first_order,
        next_box: start.first_box,
    };
    let input = &start.input[..];
    let first_router = c.next_box;
    let splits = shape.router_splits() as u32;
    for s in 0..splits {
        let parts = ctas / splits;
        c.matrix(
            KIND_TILES,
            mat(MAT_ROUTER + s),
            shape.router_tiles(),
            parts.max(1),
            input,
        )?;
    }
    let router = BoxRange::new(first_router, c.next_box - first_router);
    let slot_lines = slots.div_ceil(BOXES_PER_LINE);
    let slot_boxes = BoxRange::new(c.next_box, slots);
    c.push(KIND_ROUTE, &[router], [0; 3], slot_lines)?;
    // The shared expert over a quarter of the CTAs for each of its matrices, so that it is done
    // about when the route is; the slots split the grid between them.
    let shared_parts = (ctas / 4).max(1);
    let shared_gate_up = c.matrix(
        KIND_TILES,
        mat(MAT_SHARED_GATE_UP),
        shape.gate_up_tiles(),
        shared_parts,
        input,
    )?;
    let shared_down = c.matrix(
        KIND_TILES,
        mat(MAT_SHARED_DOWN),
        shape.down_tiles(),
        shared_parts,
        &[shared_gate_up],
    )?;
    let parts = (ctas / slots.max(1)).max(1);
    let members = parts.min(shape.gate_up_tiles().max(shape.down_tiles()));
    let first_expert = c.next_box;
    let mut experts = Vec::new();
    for j in 0..slots {
        let slot = BoxRange::new(slot_boxes.first + j, 1);
        experts.push(c.expert_gang(shape, j, slot, members, input)?);
    }
    let routed = BoxRange::new(first_expert, c.next_box - first_expert);
    let first_combine = c.next_box;
    // In runs of COMBINE_CHUNK columns (hidden is a multiple of the weight block), a thread's
    // loads in `moe_combine`.
    let chunks = shape.hidden as u32 / COMBINE_CHUNK;
    let combines = chunks.div_ceil(COMBINE_COLUMNS / COMBINE_CHUNK).min(ctas);
    for r in split_tiles(chunks, combines) {
        let r = TileRange {
            first: r.first * COMBINE_CHUNK,
            count: r.count * COMBINE_CHUNK,
        };
        let mut inputs = vec![
            BoxRange::new(slot_boxes.first, slot_lines * BOXES_PER_LINE),
            shared_down,
            routed,
        ];
        inputs.extend(start.residual.iter().copied());
        c.push(KIND_COMBINE, &inputs, [r.first, r.count, 0], 1)?;
    }
    let combine = BoxRange::new(first_combine, c.next_box - first_combine);
    Ok(MoePlan {
        placement: Placement::new(c.lists),
        end_box: c.next_box,
        end_order: c.order,
        router,
        slots: slot_boxes,
        shared_gate_up,
        shared_down,
        experts,
        routed,
        combine,
    })
}
