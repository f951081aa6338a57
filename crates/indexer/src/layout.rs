//! Shape and placement math of the indexer, shared by the kernels' host side, the reference checks
//! and the executor:
//! - the paged index-key cache (spec §3.5): 64-token pages, keys first, then the page's scales;
//! - row groups: up to [`MAX_GROUP_ROWS`] consecutive rows of one request scored in one pass, so
//!   a key is read once for all of them;
//! - runs: a group's pages cut into runs of at least [`MIN_RUN_PAGES`] pages, one run a CTA, at
//!   most [`Limits::max_runs`] runs in a launch;
//! - the hand-off boxes of new keys and queries, the score rows the select stage reads and each
//!   run's completion box;
//! - the stage's task list: key, query and score tasks placed on the CTAs of a launch.

use bytemuck::{Pod, Zeroable};
use mailbox::layout::{BoxRange, LayoutBuilder, Region};
use mailbox::{Placement, Stage, Task};
use model::paging::{pages_through, score_stride, PageTable, PAGE_TOKENS};

use crate::error::{shape, Result};

/// Rows of one request that one pass scores together.
pub const MAX_GROUP_ROWS: u32 = 4;
/// A run is at least this long, so a CTA always has a next batch to load while it scores one.
pub const MIN_RUN_PAGES: u32 = 2;
/// Default bound on runs in a launch: about two per SM on an H200 or MI355X (a CTA of the fused
/// shape scores [`RUNS_PER_SCORE_TASK`] at once).
pub const MAX_RUNS: u32 = 256;
/// Runs one score task takes: one a run team of 256 threads, two in a CTA of 512.
pub const RUNS_PER_SCORE_TASK: u32 = 2;
/// Bytes of one fp32 scale.
const SCALE_BYTES: u32 = 4;

/// Byte layout of the index-key cache for one key width: every page holds PAGE_TOKENS keys of
/// `head_dim` E4M3 bytes, token-major, then their PAGE_TOKENS fp32 scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLayout {
    head_dim: u32,
}

impl CacheLayout {
    /// Keys move in 16-byte pieces, so the width must be a multiple of 16.
    pub fn new(head_dim: u32) -> Result<Self> {
        if head_dim == 0 || head_dim % 16 != 0 {
            return Err(shape(
                "index-key cache",
                format!("key width {head_dim} is not a positive multiple of 16 bytes"),
            ));
        }
        Ok(CacheLayout { head_dim })
    }

    pub fn head_dim(&self) -> u32 {
        self.head_dim
    }

    /// 8448 for GLM-5 (8192 of keys, 256 of scales).
    pub fn page_bytes(&self) -> u64 {
        u64::from(PAGE_TOKENS) * u64::from(self.head_dim + SCALE_BYTES)
    }

    /// Where a page's scales start.
    pub fn keys_bytes(&self) -> u64 {
        u64::from(PAGE_TOKENS) * u64::from(self.head_dim)
    }

    /// Byte offset of the key in `slot` of physical page `page`.
    pub fn key_offset(&self, page: u32, slot: u32) -> u64 {
        u64::from(page) * self.page_bytes() + u64::from(slot) * u64::from(self.head_dim)
    }

    /// Byte offset of the scale in `slot` of physical page `page`.
    pub fn scale_offset(&self, page: u32, slot: u32) -> u64 {
        u64::from(page) * self.page_bytes() + self.keys_bytes() + u64::from(slot * SCALE_BYTES)
    }
}

/// One query row (its request and its position) and a request of the page table, as the kernels
/// read them: the page table's device form, shared with select (`model::paging`).
pub use model::paging::{PageRequest as RequestDesc, PageRow as Row};

/// Rows first_row..first_row + n_rows of one request, scored in one pass.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct GroupDesc {
    /// The request (page-table index).
    pub request: u32,
    pub first_row: u32,
    pub n_rows: u32,
    /// The last row's position as planned: the group's runs cover its pages
    /// (`pages_through(last_position)`). The kernels read the rows' positions from the device
    /// (`StageArgs::positions`); this one only says where the group's last run fills −inf up to
    /// the stride (`planned_last` of `idx_group`).
    pub last_position: u32,
}

/// What one scoring CTA does: logical pages first_page..first_page + n_pages of its group; the
/// group's last run (the one that ends at the group's last page) also writes −inf past the
/// group's pages, up to the score stride.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct RunDesc {
    pub group: u32,
    pub first_page: u32,
    pub n_pages: u32,
}

/// Bounds the planner keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_runs: u32,
    pub group_rows: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_runs: MAX_RUNS,
            group_rows: MAX_GROUP_ROWS,
        }
    }
}

/// The scoring work of one launch: groups, runs, and the score rows' stride.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScorePlan {
    pub rows: Vec<Row>,
    /// One per request of the page table, indexed like it.
    pub requests: Vec<RequestDesc>,
    pub groups: Vec<GroupDesc>,
    pub runs: Vec<RunDesc>,
    /// Scores of row r are `scores[r * stride ..][..stride]` ([`score_stride`] of the longest
    /// row); entries past a row's position are −inf.
    pub stride: u32,
}

impl ScorePlan {
    /// Plans `rows` (each request's rows adjacent, at consecutive increasing positions) over the
    /// requests' `pages`.
    pub fn new(rows: &[Row], pages: &PageTable, limits: Limits) -> Result<Self> {
        if limits.group_rows == 0 || limits.group_rows > MAX_GROUP_ROWS {
            return Err(shape(
                "score plan",
                format!(
                    "groups of {} rows; the scorer holds 1 to {MAX_GROUP_ROWS}",
                    limits.group_rows
                ),
            ));
        }
        let requests = requests_of(rows, pages)?;
        let groups = groups_of(&requests, rows, limits.group_rows);
        let longest = rows
            .iter()
            .map(|r| r.position.saturating_add(1))
            .max()
            .ok_or_else(|| shape("score plan", "a launch needs at least one row"))?;
        let runs = runs_of(&groups, limits.max_runs)?;
        Ok(ScorePlan {
            rows: rows.to_vec(),
            requests,
            groups,
            runs,
            stride: score_stride(longest),
        })
    }

    /// Key and scale bytes the scoring reads from the cache: each group's pages once.
    pub fn cache_bytes_read(&self, cache: &CacheLayout) -> u64 {
        self.runs
            .iter()
            .map(|run| u64::from(run.n_pages) * cache.page_bytes())
            .sum()
    }
}

/// One descriptor per request of the page table (n_rows 0 for those without rows), after
/// checking the row rules.
fn requests_of(rows: &[Row], pages: &PageTable) -> Result<Vec<RequestDesc>> {
    let mut requests = pages.device_requests();
    for (index, row) in rows.iter().enumerate() {
        let request = row.request as usize;
        let Some(desc) = requests.get_mut(request) else {
            return Err(shape(
                "score plan",
                format!(
                    "row {index} names request {request}; the page table has {}",
                    pages.requests()
                ),
            ));
        };
        let have = pages.pages(request).len() as u32;
        if have < pages_through(row.position) {
            return Err(shape(
                "score plan",
                format!(
                    "row {index} at position {} needs {} pages of request {request}; it has {have}",
                    row.position,
                    pages_through(row.position)
                ),
            ));
        }
        if desc.n_rows == 0 {
            *desc = RequestDesc {
                first_row: index as u32,
                n_rows: 1,
                first_position: row.position,
                page_offset: desc.page_offset,
            };
            continue;
        }
        let (next_row, next_position) = (
            desc.first_row + desc.n_rows,
            desc.first_position + desc.n_rows,
        );
        if index as u32 != next_row {
            return Err(shape(
                "score plan",
                format!("the rows of request {request} are not adjacent (again at row {index})"),
            ));
        }
        if row.position != next_position {
            return Err(shape(
                "score plan",
                format!(
                    "row {index} of request {request} is at position {}; the rows before it end at {}",
                    row.position,
                    next_position - 1
                ),
            ));
        }
        desc.n_rows += 1;
    }
    Ok(requests)
}

/// Each request's rows cut into ceil(n / group_rows) groups of near-equal size, longer first.
fn groups_of(requests: &[RequestDesc], rows: &[Row], group_rows: u32) -> Vec<GroupDesc> {
    let mut groups = Vec::new();
    for (index, request) in requests.iter().enumerate() {
        if request.n_rows == 0 {
            continue;
        }
        let count = request.n_rows.div_ceil(group_rows);
        let mut first_row = request.first_row;
        for g in 0..count {
            let n_rows = request.n_rows / count + u32::from(g < request.n_rows % count);
            groups.push(GroupDesc {
                request: index as u32,
                first_row,
                n_rows,
                last_position: rows[(first_row + n_rows - 1) as usize].position,
            });
            first_row += n_rows;
        }
    }
    groups
}

/// Runs a group of `pages` pages is cut into when runs aim at `length` pages: as many as fit,
/// none shorter than MIN_RUN_PAGES (a group of one page is one run).
fn run_count(pages: u32, length: u32) -> u32 {
    pages.div_ceil(length).min(pages / MIN_RUN_PAGES).max(1)
}

/// The shortest run length whose runs fit in `max_runs`, then each group's runs of near-equal size.
fn runs_of(groups: &[GroupDesc], max_runs: u32) -> Result<Vec<RunDesc>> {
    if groups.len() as u64 > u64::from(max_runs) {
        return Err(shape(
            "score plan",
            format!(
                "{} row groups need at least as many runs; the limit is {max_runs}",
                groups.len()
            ),
        ));
    }
    let group_pages: Vec<u32> = groups
        .iter()
        .map(|g| pages_through(g.last_position))
        .collect();
    let total: u64 = group_pages.iter().map(|&p| u64::from(p)).sum();
    let longest = group_pages.iter().copied().max().unwrap_or(1);
    let mut length = (total.div_ceil(u64::from(max_runs)) as u32).max(MIN_RUN_PAGES);
    // Terminates: at length >= longest every group is one run, and groups <= max_runs.
    while length < longest
        && group_pages
            .iter()
            .map(|&p| u64::from(run_count(p, length)))
            .sum::<u64>()
            > u64::from(max_runs)
    {
        length += 1;
    }
    let mut runs = Vec::new();
    for (index, &pages) in group_pages.iter().enumerate() {
        let count = run_count(pages, length);
        let mut first_page = 0;
        for r in 0..count {
            let n_pages = pages / count + u32::from(r < pages % count);
            runs.push(RunDesc {
                group: index as u32,
                first_page,
                n_pages,
            });
            first_page += n_pages;
        }
    }
    Ok(runs)
}

/// Boxes that carry one row's new key: head_dim / 4 words of four E4M3 codes, then the scale.
pub fn key_box_words(head_dim: u32) -> u32 {
    head_dim / 4 + 1
}

/// Boxes that carry one row's query: heads * head_dim / 2 words of two bf16 (head-major, dims in
/// order), then one f32 head weight per head. An FP8 query (the wgmma scorer's) uses the first
/// heads * head_dim / 4 words for E4M3 codes, four a word, and its weights follow them.
pub fn query_box_words(heads: u32, head_dim: u32) -> u32 {
    heads * head_dim / 2 + heads
}

/// The indexer's regions of a launch's scratch: a slot per row for its key and for its query, and
/// a slot per run whose one box says the run's scores are written (a release before it).
#[derive(Clone, Copy, Debug)]
pub struct IndexerBoxes {
    pub key: Region<u32>,
    pub query: Region<u32>,
    pub run: Region<u32>,
}

impl IndexerBoxes {
    pub fn add(
        builder: &mut LayoutBuilder,
        rows: u32,
        runs: u32,
        heads: u32,
        head_dim: u32,
    ) -> Result<Self> {
        let region = |b: &mut LayoutBuilder, name, slots, words| {
            b.region::<u32>(name, slots, words)
                .map_err(|e| shape("indexer boxes", e.to_string()))
        };
        Ok(IndexerBoxes {
            key: region(builder, "idx_key", rows, key_box_words(head_dim))?,
            query: region(builder, "idx_query", rows, query_box_words(heads, head_dim))?,
            run: region(builder, "idx_run", runs, 1)?,
        })
    }

    /// Slots `first..first + n` of `region`, padding included: a slot is its one writer's, so a
    /// task that writes a slot owns its padding, and a range over several slots has no gap.
    fn slots(region: &Region<u32>, first: u32, n: u32) -> BoxRange {
        BoxRange::new(
            region.offset() + first * region.stride(),
            n * region.stride(),
        )
    }
}

/// The indexer's task kinds (`IDX_KIND_*` in `kernels/idx_common.h`), within [`Stage::Indexer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskKind {
    /// args: `[row]`. The row's index key, stored into its cache slot and published.
    Key = 0,
    /// args: `[row]`. The row's index query, published.
    Query = 1,
    /// args: `[first run, runs]`. The runs' scores, then each run's completion box.
    Score = 2,
}

impl TaskKind {
    /// The task descriptor's kind word.
    pub const fn kind(self) -> u32 {
        Task::kind_of(Stage::Indexer, self as u32)
    }
}

/// Which tasks a launch's list holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageTasks {
    /// Keys, queries, then scoring that waits on them: the stage's step.
    Whole,
    /// Scoring alone, reading queries and new keys an earlier launch with the same tag published
    /// (benchmarks): its tasks wait on no box of their own launch.
    ScoreOnly,
}

/// Runs a launch of `ctas` CTAs can score at once beside the key and query tasks of `rows` rows
/// (each on a CTA of its own), or `None` when none is left for scoring.
pub fn max_runs(ctas: u32, rows: u32) -> Option<u32> {
    ctas.checked_sub(2 * rows)
        .filter(|&c| c > 0)
        .map(|c| c * RUNS_PER_SCORE_TASK)
}

/// The stage's task list on `ctas` CTAs. Orders: row r's key task r, its query task rows + r, then
/// score task k (runs [`RUNS_PER_SCORE_TASK`] k ..) 2 rows + k. Score task k runs on CTA k, the
/// key and query tasks on the CTAs after the scorers' (wrapping around when there are too few,
/// where they run before the scoring on the same CTA). A score task waits on its runs' groups'
/// query slots and on the key slots of their requests' rows up to the group's last.
pub fn stage_placement(
    plan: &ScorePlan,
    boxes: &IndexerBoxes,
    ctas: u32,
    which: StageTasks,
) -> Result<Placement> {
    stage_placement_waiting(plan, boxes, ctas, which, &ProjectionWaits::default())
}

/// What the key and query tasks wait on before they read their inputs: the completion boxes of
/// the tasks that write `key_proj` (keys) and `query_proj` with `gates` (queries) in the same
/// launch. Empty where the host wrote them before the launch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProjectionWaits {
    pub key: Vec<BoxRange>,
    pub query: Vec<BoxRange>,
}

/// [`stage_placement`] with the key and query tasks waiting on `waits` (the kernels wait on every
/// box of a key or query task's inputs, then acquire, before reading a projection).
pub fn stage_placement_waiting(
    plan: &ScorePlan,
    boxes: &IndexerBoxes,
    ctas: u32,
    which: StageTasks,
    waits: &ProjectionWaits,
) -> Result<Placement> {
    let rows = plan.rows.len() as u32;
    let runs = plan.runs.len() as u32;
    if ctas == 0 {
        return Err(shape("indexer tasks", "a launch needs at least one CTA"));
    }
    if boxes.key.slots() < rows || boxes.query.slots() < rows || boxes.run.slots() < runs {
        return Err(shape(
            "indexer tasks",
            format!(
                "the boxes hold {} rows and {} runs; the plan has {rows} and {runs}",
                boxes.key.slots().min(boxes.query.slots()),
                boxes.run.slots()
            ),
        ));
    }
    let task = |kind: TaskKind, order, out, inputs: &[BoxRange], args| {
        Task::new(kind.kind(), order, out, inputs, args)
            .map_err(|e| shape("indexer tasks", e.to_string()))
    };
    let mut lists = vec![Vec::new(); ctas as usize];
    let score_tasks = runs.div_ceil(RUNS_PER_SCORE_TASK);
    let whole = which == StageTasks::Whole;
    if whole {
        for r in 0..rows {
            let key = IndexerBoxes::slots(&boxes.key, r, 1);
            let query = IndexerBoxes::slots(&boxes.query, r, 1);
            let cta = |i: u32| ((score_tasks + 2 * r + i) % ctas) as usize;
            lists[cta(0)].push(task(TaskKind::Key, r, key, &waits.key, [r, 0, 0])?);
            lists[cta(1)].push(task(
                TaskKind::Query,
                rows + r,
                query,
                &waits.query,
                [r, 0, 0],
            )?);
        }
    }
    for k in 0..score_tasks {
        let first = k * RUNS_PER_SCORE_TASK;
        let n = RUNS_PER_SCORE_TASK.min(runs - first);
        let mut inputs: Vec<BoxRange> = Vec::new();
        if whole {
            for run in &plan.runs[first as usize..(first + n) as usize] {
                let group = plan.groups[run.group as usize];
                let request = plan.requests[group.request as usize];
                let last_row = group.first_row + group.n_rows - 1;
                for range in [
                    IndexerBoxes::slots(&boxes.query, group.first_row, group.n_rows),
                    IndexerBoxes::slots(
                        &boxes.key,
                        request.first_row,
                        last_row + 1 - request.first_row,
                    ),
                ] {
                    if !inputs.contains(&range) {
                        inputs.push(range);
                    }
                }
            }
        }
        let out = IndexerBoxes::slots(&boxes.run, first, n);
        let order = if whole { 2 * rows + k } else { k };
        lists[(k % ctas) as usize].push(task(TaskKind::Score, order, out, &inputs, [first, n, 0])?);
    }
    for list in &mut lists {
        list.sort_by_key(|t| t.order);
    }
    Ok(Placement::new(lists))
}
