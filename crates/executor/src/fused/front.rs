//! The front half of a full-indexer layer as one fused launch: index keys for the step's new
//! tokens, index queries, scoring runs, then the exact top-k of every row (ARCHITECTURE.md
//! section 5). From the model config, a batch and the CTA count this makes the task graph, its one
//! global order (keys, queries, score tasks, then a rank a row for select, a row's slices a gang),
//! places it on the CTAs and checks it, and generates the fused kernel's source.
//!
//! The hand-off from scoring to select: a run's scores are written, then a release, then the
//! run's completion box (the indexer's). A select task waits on the completion boxes of exactly the
//! runs whose pages hold the positions it reads: one input range over the row's group's runs that
//! overlap its slice, the runs' slots a line each (`sel_args::in_stride`), so it polls the one
//! written box of each.
//!
//! Select's contract here is select's own (`select::reference`): a row of at most k keys lists
//! them all by position then -1; a -inf score (past the row's position) is never selected. Select
//! maps positions to cache slots through the page table the indexer reads (the plan's rows,
//! requests and page list, `kernels/ops/paging.h`): one device form for both stages.
//!
//! The hand-off from select to the list's readers (the attention tasks) in the same launch: row
//! `r`'s list is its k cache slots (`page * 64 + slot`, then -1) at `out[r * k..(r + 1) * k]`
//! (i32), written plainly, then published with a release and ONE tagged box a row,
//! [`FrontPart::list_ready`]`(r)` (value: `r`; [`FrontGraph::list_ready`] for the front half
//! alone). A row of one task (registers or one-CTA kind)
//! puts it when its list is written; a row of slices (a gang) puts it once, from slice 0, after
//! every other slice put its gang box (`SelectBoxes::gang`) following its own part. A reader
//! lists that range among its task's inputs, at a rank after the part's (`FrontPart::ranks`), polls
//! the box until it holds the launch's tag (`mbx_poll`), then `mbx_acquire()` in every thread
//! and a barrier, and only then reads the row's entries. The list box of a row is one box on a
//! line of its own, so a reader of several rows waits on one box a row.

use super::{fused_source, CtaShape, GraphError, LaunchGraph};
use device::KernelSource;
use indexer::layout::{
    max_runs, IndexerBoxes, Limits as PlanLimits, ProjectionWaits, Row, ScorePlan, TaskKind,
    MAX_GROUP_ROWS, MAX_RUNS, RUNS_PER_SCORE_TASK,
};
use indexer::reference::IndexerDims;
use mailbox::gpu::Variant;
use mailbox::layout::{BoxRange, ScratchLayout};
use mailbox::{Placement, Stage, StageKernel, Task, ValidPlacement};
use model::paging::{pages_through, PageTable, PAGE_TOKENS};
use model::ModelConfig;
use select::gpu::Shape as SelectShape;
use select::layout::{
    SelectBoxes, SelectKind, SelectPlan, Slices, Slicing, TopK, MAX_ROW_KEYS, REG_PRODUCTION_ROW,
    SLICE_ROOM,
};
use std::ops::Range;

/// Rows a fused front-half build takes at most: its score boxes and select regions are sized for
/// them, and each row's key and query tasks take a CTA beside the scorers.
pub const MAX_ROWS: u32 = 32;
/// Keys a registers-kind select task holds in the production build (20 a thread of 512). Longer
/// rows of up to [`SLICE_ROOM`] keys take one CTA a row (the whole row in its LDS), longer ones
/// the multi-slice gangs: a gang of two slices passes six digit rounds between its CTAs, and a
/// layer launch at 8K context (8193 keys and more) was slower that way, and slower again with one
/// CTA a row than in registers (PERF.md).
pub const REGISTERS_ROW: u32 = REG_PRODUCTION_ROW;

/// One request of a step: the tokens already in its cache, its query rows this step (a decoded
/// token and its MTP verify rows: one new token each, at consecutive positions after the
/// context), and its physical cache pages by logical page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontRequest {
    pub context: u32,
    pub rows: u32,
    pub pages: Vec<u32>,
}

/// What a launch is built for: the CTAs (one a SM) and the pages of the index-key cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrontBuild {
    pub ctas: u32,
    pub cache_pages: u32,
    pub max_rows: u32,
}

/// Bad input, found before anything runs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrontError {
    #[error("a step needs at least one row")]
    NoRows,
    #[error("the step has {rows} rows; the launch was built for at most {max}")]
    TooManyRows { rows: u32, max: u32 },
    #[error("the step has {rows} rows; a grid of {ctas} CTAs takes at most {max} (each row's key and query tasks take a CTA of their own beside a scorer; on the host backend MONO_HOST_CTAS sets the grid)")]
    TooFewCtas { rows: u32, ctas: u32, max: u32 },
    #[error("request {request}: its {context} cached tokens and {rows} new ones need {need} pages; its page table has {have}")]
    ContextPastPages {
        request: usize,
        context: u32,
        rows: u32,
        need: u32,
        have: u32,
    },
    #[error("request {request}: logical page {page} is physical page {physical}, past the cache's {cache_pages} pages")]
    PagePastCache {
        request: usize,
        page: u32,
        physical: u32,
        cache_pages: u32,
    },
    #[error("request {request}: a row at position {position} has more than {MAX_ROW_KEYS} keys, the most select takes")]
    RowTooLong { request: usize, position: u32 },
    #[error("index_topk = {0} from the config is outside what select builds for")]
    BadTopK(usize),
    #[error("indexer: {0}")]
    Indexer(String),
    #[error("select: {0}")]
    Select(String),
    #[error("placement: {0}")]
    Placement(String),
    #[error("select task {task} (row {row}, positions {start}..{end}) does not wait on run {run}, whose pages it reads")]
    MissedRun {
        task: u32,
        row: u32,
        start: u32,
        end: u32,
        run: u32,
    },
}

/// The scratch regions of a front-half launch.
#[derive(Clone, Copy, Debug)]
pub struct FrontBoxes {
    pub indexer: IndexerBoxes,
    pub select: SelectBoxes,
}

/// The task graph of one step's front half, placed and checked.
#[derive(Clone, Debug)]
pub struct FrontGraph {
    pub top: TopK,
    pub plan: ScorePlan,
    pub pages: PageTable,
    /// Keys of each row (its position + 1): select's row lengths.
    pub lens: Vec<u32>,
    pub select_kind: SelectKind,
    pub layout: ScratchLayout,
    pub boxes: FrontBoxes,
    pub placement: ValidPlacement,
    /// The ranks the front half's tasks took.
    pub ranks: Range<u32>,
}

/// The front half as one part of a launch's [`LaunchGraph`]: what its tasks were planned with,
/// and the boxes they use (in the graph's scratch layout).
#[derive(Clone, Debug)]
pub struct FrontPart {
    pub top: TopK,
    pub plan: ScorePlan,
    pub pages: PageTable,
    pub lens: Vec<u32>,
    pub select_kind: SelectKind,
    pub boxes: FrontBoxes,
    /// The ranks its tasks took in the launch's global order.
    pub ranks: Range<u32>,
}

impl FrontPart {
    /// The box a reader of row `row`'s list waits on (the module doc says how): what the part
    /// hands the attention tasks, one box a row, with the list at `out[row * k..]`.
    pub fn list_ready(&self, row: u32) -> Option<BoxRange> {
        if row as usize >= self.lens.len() {
            return None;
        }
        self.boxes.select.list_ready(row)
    }

    /// Plans a step of `requests` on a launch `build` into `g`, with k and the indexer's shape
    /// from `cfg`: its boxes go into the graph's scratch, its tasks after the graph's earlier ranks.
    pub fn plan(
        g: &mut LaunchGraph,
        cfg: &ModelConfig,
        requests: &[FrontRequest],
        build: FrontBuild,
    ) -> Result<FrontPart, FrontError> {
        Self::plan_waiting(g, cfg, requests, build, &ProjectionWaits::default(), None)
    }

    /// [`Self::plan`] in a launch that makes the indexer's projections itself: the key tasks wait
    /// on `waits.key` (what writes `key_proj`), the query tasks on `waits.query` (`query_proj`
    /// and `gates`), before they read them. With `key_cta`, the part's tasks are turned around the
    /// grid so that row 0's key task is on that CTA (the rows' key and query tasks follow it on
    /// consecutive CTAs): a launch keeps those CTAs free of the tasks ahead of them.
    pub fn plan_waiting(
        g: &mut LaunchGraph,
        cfg: &ModelConfig,
        requests: &[FrontRequest],
        build: FrontBuild,
        waits: &ProjectionWaits,
        key_cta: Option<u32>,
    ) -> Result<FrontPart, FrontError> {
        let top = TopK::of(cfg)
            .and_then(TopK::for_kernels)
            .map_err(|_| FrontError::BadTopK(cfg.index_topk))?;
        let dims = IndexerDims::new(cfg).map_err(|e| FrontError::Indexer(e.to_string()))?;
        if g.ctas() != build.ctas {
            return Err(FrontError::Placement(format!(
                "the launch graph has {} CTAs; the front half was built for {}",
                g.ctas(),
                build.ctas
            )));
        }
        let rows = rows_of(requests, build)?;
        let table: Vec<Vec<u32>> = requests.iter().map(|r| r.pages.clone()).collect();
        let pages = PageTable::new(&table).map_err(|e| FrontError::Indexer(e.to_string()))?;
        let n_rows = rows.len() as u32;
        let most_runs = max_runs(build.ctas, n_rows).ok_or(FrontError::TooFewCtas {
            rows: n_rows,
            ctas: build.ctas,
            max: build.ctas.saturating_sub(1) / 2,
        })?;
        let plan = ScorePlan::new(
            &rows,
            &pages,
            PlanLimits {
                max_runs: most_runs.min(MAX_RUNS),
                group_rows: MAX_GROUP_ROWS,
            },
        )
        .map_err(|e| FrontError::Indexer(e.to_string()))?;
        let lens: Vec<u32> = rows.iter().map(|r| r.position + 1).collect();
        let longest = lens.iter().copied().max().unwrap_or(0);
        let select_kind = if longest <= REGISTERS_ROW {
            SelectKind::Registers
        } else if longest <= SLICE_ROOM {
            SelectKind::OneCta
        } else {
            SelectKind::Slice
        };
        let indexer = IndexerBoxes::add(
            g.regions(),
            n_rows,
            plan.runs.len() as u32,
            dims.heads as u32,
            dims.head_dim as u32,
        )
        .map_err(|e| FrontError::Indexer(e.to_string()))?;
        let select = SelectBoxes::add(g.regions(), "sel", n_rows, top)
            .map_err(|e| FrontError::Select(e.to_string()))?;
        let boxes = FrontBoxes { indexer, select };
        let ranks = place(g, &plan, &lens, select_kind, top, &boxes, waits, key_cta)?;
        Ok(FrontPart {
            top,
            plan,
            pages,
            lens,
            select_kind,
            boxes,
            ranks,
        })
    }
}

impl FrontGraph {
    /// Plans a step of `requests` on a launch `build` that runs the front half alone, with k and
    /// the indexer's shape from `cfg`.
    pub fn new(
        cfg: &ModelConfig,
        requests: &[FrontRequest],
        build: FrontBuild,
    ) -> Result<FrontGraph, FrontError> {
        let placement = |e: GraphError| FrontError::Placement(e.to_string());
        let mut g = LaunchGraph::new(build.ctas).map_err(placement)?;
        let part = FrontPart::plan(&mut g, cfg, requests, build)?;
        let planned = g.finish().map_err(placement)?;
        let graph = FrontGraph {
            top: part.top,
            plan: part.plan,
            pages: part.pages,
            lens: part.lens,
            select_kind: part.select_kind,
            layout: planned.layout,
            boxes: part.boxes,
            placement: planned.placement,
            ranks: part.ranks,
        };
        graph.check_handoff(graph.placement.placement())?;
        Ok(graph)
    }

    /// The box a reader of row `row`'s list waits on (as an input range of its task), put by
    /// the row's select tasks once the whole list is written (the module doc says how to wait).
    pub fn list_ready(&self, row: u32) -> Option<BoxRange> {
        if row as usize >= self.lens.len() {
            return None;
        }
        self.boxes.select.list_ready(row)
    }

    /// The first rank after the front half's tasks: a task that reads the lists takes this or a
    /// later one, so that it waits only on earlier ranks.
    pub fn next_rank(&self) -> u32 {
        self.ranks.end
    }

    /// The graph with a list reader a row after the front half ([`READER_KIND`], row `r`'s at
    /// rank [`Self::next_rank`]` + r`, on the CTAs from the last down, where the scorers leave
    /// room): the stand-in for the attention tasks, waiting on [`Self::list_ready`] as they will.
    pub fn with_readers(mut self) -> Result<FrontGraph, FrontError> {
        let limits = self.placement.limits();
        let mut placement = self.placement.placement().clone();
        let ctas = limits.max_resident;
        placement.lists_mut().resize(ctas as usize, Vec::new());
        let first = self.next_rank();
        for row in 0..self.lens.len() as u32 {
            let ready = self
                .list_ready(row)
                .ok_or_else(|| FrontError::Select(format!("row {row} has no list box")))?;
            let task = Task::new(
                Task::kind_of(Stage::Synthetic, READER_KIND),
                first + row,
                BoxRange::default(),
                &[ready],
                [row, 0, 0],
            )
            .map_err(|e| FrontError::Placement(e.to_string()))?;
            placement.lists_mut()[(ctas - 1 - row % ctas) as usize].push(task);
        }
        self.placement = placement
            .check(limits)
            .map_err(|e| FrontError::Placement(e.to_string()))?;
        Ok(self)
    }

    /// Each row's request (the plan's rows): with [`FrontGraph::pages`], the page table as
    /// select's rows see it.
    pub fn row_requests(&self) -> Vec<u32> {
        self.plan.rows.iter().map(|r| r.request).collect()
    }

    /// Positions a select task reads: its row's slice (the whole row for the one-task kinds).
    pub fn select_range(task: &Task) -> Range<u32> {
        let len = task.args[1];
        if task.kind != SelectKind::Slice.kind() {
            return 0..len;
        }
        let (me, count) = (task.args[2] & 0xffff, task.args[2] >> 16);
        Slices::new(len, count).map_or(0..len, |s| s.range(me))
    }

    /// Runs (indices into the plan) whose pages hold positions `range` of `row`.
    pub fn runs_of(&self, row: u32, range: Range<u32>) -> Range<u32> {
        runs_in(&self.plan, row, range)
    }

    /// Every select task of `placement` waits on the completion box of every run it reads (the
    /// hand-off's rule, which the placement check cannot see: it only knows boxes).
    pub fn check_handoff(&self, placement: &Placement) -> Result<(), FrontError> {
        let run = self.boxes.indexer.run;
        for (_, task) in placement.tasks() {
            if task.stage_bits() != Stage::Select as u32 {
                continue;
            }
            let range = Self::select_range(task);
            for r in self.runs_of(task.args[0], range.clone()) {
                let Some(slot) = run.box_index(r, 0) else {
                    continue;
                };
                if !task
                    .inputs()
                    .iter()
                    .any(|i| i.boxes().contains(&u64::from(slot)))
                {
                    return Err(FrontError::MissedRun {
                        task: task.order,
                        row: task.args[0],
                        start: range.start,
                        end: range.end,
                        run: r,
                    });
                }
            }
        }
        Ok(())
    }

    /// Bytes the launch must move at least: the index-key pages it scores, and the scores written
    /// then read once.
    pub fn floor_bytes(&self, head_dim: u32) -> u64 {
        let page = u64::from(PAGE_TOKENS) * u64::from(head_dim + 4);
        let pages: u64 = self.plan.runs.iter().map(|r| u64::from(r.n_pages)).sum();
        let scores: u64 = self.lens.iter().map(|&l| u64::from(l) * 4 * 2).sum();
        pages * page + scores
    }
}

/// The step's rows in request order, after checking the batch against the build.
fn rows_of(requests: &[FrontRequest], build: FrontBuild) -> Result<Vec<Row>, FrontError> {
    let mut rows = Vec::new();
    for (index, r) in requests.iter().enumerate() {
        if r.rows == 0 {
            continue;
        }
        let last = r.context + r.rows - 1;
        if last >= MAX_ROW_KEYS {
            return Err(FrontError::RowTooLong {
                request: index,
                position: last,
            });
        }
        let need = pages_through(last);
        if (r.pages.len() as u64) < u64::from(need) {
            return Err(FrontError::ContextPastPages {
                request: index,
                context: r.context,
                rows: r.rows,
                need,
                have: r.pages.len() as u32,
            });
        }
        if let Some((page, &physical)) = r
            .pages
            .iter()
            .enumerate()
            .find(|(_, &p)| p >= build.cache_pages)
        {
            return Err(FrontError::PagePastCache {
                request: index,
                page: page as u32,
                physical,
                cache_pages: build.cache_pages,
            });
        }
        rows.extend((0..r.rows).map(|i| Row {
            request: index as u32,
            position: r.context + i,
        }));
    }
    if rows.is_empty() {
        return Err(FrontError::NoRows);
    }
    if rows.len() as u32 > build.max_rows {
        return Err(FrontError::TooManyRows {
            rows: rows.len() as u32,
            max: build.max_rows,
        });
    }
    Ok(rows)
}

/// The global order and the CTAs, ranks counted from the graph's next one: row r's key task rank
/// r and its query rows + r, score task k rank 2 rows + k on CTA k, the key and query tasks on
/// the CTAs after the scorers (wrapping), then select: row r's tasks at rank 2 rows + scorers + r,
/// on CTAs in turn from CTA 0 (a row's slices a gang on distinct CTAs), each waiting on the
/// completion boxes of the runs it reads; with `key_cta`, every CTA turned by the number that
/// puts row 0's key task there. Returns the ranks taken.
#[allow(clippy::too_many_arguments)]
fn place(
    g: &mut LaunchGraph,
    plan: &ScorePlan,
    lens: &[u32],
    kind: SelectKind,
    top: TopK,
    boxes: &FrontBoxes,
    waits: &ProjectionWaits,
    key_cta: Option<u32>,
) -> Result<Range<u32>, FrontError> {
    let ctas = g.ctas();
    let idx = |e: indexer::IndexerError| FrontError::Indexer(e.to_string());
    let indexer_lists = indexer::layout::stage_placement_waiting(
        plan,
        &boxes.indexer,
        ctas,
        indexer::layout::StageTasks::Whole,
        waits,
    )
    .map_err(idx)?;
    let rows = plan.rows.len() as u32;
    let scorers = (plan.runs.len() as u32).div_ceil(RUNS_PER_SCORE_TASK);
    let first_order = 2 * rows + scorers;
    let mut select = SelectPlan::new(
        lens,
        kind,
        top,
        ctas,
        Slicing::production(SLICE_ROOM),
        first_order,
    )
    .map_err(|e| FrontError::Select(e.to_string()))?;
    let run = boxes.indexer.run;
    for planned in select.tasks_mut() {
        let t = planned.task;
        let range = FrontGraph::select_range(&t);
        let runs = runs_in(plan, planned.row, range);
        let inputs = if runs.is_empty() {
            Vec::new()
        } else {
            vec![BoxRange::new(
                run.offset() + runs.start * run.stride(),
                runs.len() as u32 * run.stride(),
            )]
        };
        planned.task = Task::new(t.kind, t.order, t.out, &inputs, t.args)
            .map_err(|e| FrontError::Select(e.to_string()))?;
    }
    select
        .publish(&boxes.select)
        .map_err(|e| FrontError::Select(e.to_string()))?;
    let ranks = g.ranks(first_order + rows);
    let placement = |e: GraphError| FrontError::Placement(e.to_string());
    // Turning every list by the same number of CTAs keeps each CTA's order and a gang's CTAs
    // distinct.
    let first_key = indexer_lists
        .tasks()
        .find(|(_, t)| t.kind == TaskKind::Key.kind() && t.args[0] == 0)
        .map(|(cta, _)| cta);
    let shift = match (key_cta, first_key) {
        (Some(want), Some(have)) => (want % ctas + ctas - have) % ctas,
        _ => 0,
    };
    let turned = |cta: u32| (cta + shift) % ctas;
    for (cta, list) in indexer_lists.lists().iter().enumerate() {
        for t in list {
            let task = Task {
                order: t.order + ranks.start,
                ..*t
            };
            g.push(turned(cta as u32), task).map_err(placement)?;
        }
    }
    for t in select.tasks() {
        let task = Task {
            order: t.task.order + ranks.start,
            ..t.task
        };
        g.push(turned(t.cta), task).map_err(placement)?;
    }
    Ok(ranks)
}

/// [`FrontGraph::runs_of`] before the graph exists.
fn runs_in(plan: &ScorePlan, row: u32, range: Range<u32>) -> Range<u32> {
    if range.is_empty() {
        return 0..0;
    }
    let (first_page, last_page) = (range.start / PAGE_TOKENS, (range.end - 1) / PAGE_TOKENS);
    let Some(group) = plan
        .groups
        .iter()
        .position(|g| (g.first_row..g.first_row + g.n_rows).contains(&row))
    else {
        return 0..0;
    };
    let hits: Vec<u32> = plan
        .runs
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            r.group == group as u32
                && r.first_page <= last_page
                && first_page < r.first_page + r.n_pages
        })
        .map(|(i, _)| i as u32)
        .collect();
    match (hits.first(), hits.last()) {
        (Some(&a), Some(&b)) => a..b + 1,
        _ => 0..0,
    }
}

/// The name of the front half's fused kernel source.
pub const SOURCE_NAME: &str = "fused_front";

/// Own kind, under [`Stage::Synthetic`], of the list reader (`kernels/list_reader.h`).
pub const READER_KIND: u32 = 1;

/// The list reader's stage: the stand-in for the attention tasks in a front half built to check
/// the lists' hand-off ([`FrontGraph::with_readers`]).
pub fn reader_stage() -> StageKernel {
    StageKernel {
        stage: Stage::Synthetic,
        include: "list_reader.h",
        headers: vec![("list_reader.h", include_str!("../../kernels/list_reader.h"))],
        args_type: "list_reader_args",
        decoder: "list_reader_decode",
        defines: Default::default(),
    }
}

/// The front half's fused kernel for a CTA `shape`, the indexer's stage (its configuration's
/// `stage_kernel`: a target's production one from `indexer::gpu::KernelConfig::production` at any
/// preset's shape, or the kernel table's of `indexer::gpu::stage_kernel`) and k: select's
/// production build (every kind, slices of up to [`SLICE_ROOM`] keys, registers rows of up to
/// [`REGISTERS_ROW`]), one switch over the decoders, the mailbox's `variant`.
pub fn front_source(
    shape: CtaShape,
    indexer: StageKernel,
    top: TopK,
    variant: Variant,
) -> Result<KernelSource, FrontError> {
    front_source_with(shape, indexer, top, variant, &[])
}

/// [`front_source`] with more stages after select's (their kernel arguments follow select's):
/// the list reader of a build that checks the lists' hand-off.
pub fn front_source_with(
    shape: CtaShape,
    indexer: StageKernel,
    top: TopK,
    variant: Variant,
    more: &[StageKernel],
) -> Result<KernelSource, FrontError> {
    let select_shape =
        SelectShape::production(top).map_err(|e| FrontError::Select(e.to_string()))?;
    if select_shape.threads != shape.threads {
        return Err(FrontError::Select(format!(
            "select's tasks take {} threads; the fused CTA has {}",
            select_shape.threads, shape.threads
        )));
    }
    let mut stages = vec![indexer, select::gpu::stage_kernel(select_shape)];
    stages.extend_from_slice(more);
    let source = fused_source(SOURCE_NAME, &stages, shape)
        .map_err(|e| FrontError::Placement(e.to_string()))?;
    Ok(variant.apply(source))
}
