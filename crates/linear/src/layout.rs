//! Pure shape and placement math of the linear stage: the task kind, how a matrix's tiles are
//! split into tasks over CTAs, the boxes tasks publish and wait on, and the shared memory a CTA
//! needs (`kernels/ops/linear.h` and `kernels/lin_task.h` hold the device twins).

use mailbox::layout::{BoxRange, BOXES_PER_LINE};
use mailbox::{Placement, Stage, Task};
use model::weights::packed::TILE_ROWS;
use model::WEIGHT_BLOCK;

/// `LIN_KIND_TILES`: a range of one matrix's tiles.
pub const KIND_TILES: u32 = Task::kind_of(Stage::Linear, 1);
/// `LIN_KIND_EXPERT_PAIR`: one member of a slot's gang, a range of the gate/up of the expert the
/// slot's box names and then a range of its down (`kernels/lin_task.h` has the contract).
pub const KIND_EXPERT_PAIR: u32 = Task::kind_of(Stage::Linear, 2);
/// A slot box's value when no expert fills the slot (`LIN_NO_EXPERT`).
pub const NO_EXPERT: u32 = u32::MAX;
/// Slots an expert task addresses at most (the high half of its `args[0]`).
pub const MAX_SLOTS: u32 = 1 << 16;
/// The input ranges of a pair task, by position (`LIN_PAIR_*`): its slot's box, the lines of its
/// gang's members before and after it, and (if any) its gate/up's x rows.
pub const PAIR_SLOT: usize = 0;
pub const PAIR_PEERS_BEFORE: usize = 1;
pub const PAIR_PEERS_AFTER: usize = 2;
pub const PAIR_X: usize = 3;

/// `args[0]` of a pair task: its gate/up's bank (its down's is the next) and its slot.
pub fn expert_arg(bank: u32, slot: u32) -> Option<u32> {
    (bank + 1 < 1 << 16 && slot < MAX_SLOTS).then_some(bank | slot << 16)
}

/// `args[1]` and `args[2]` of a pair task: a range of tiles, `first | count << 16`.
pub fn pair_range_arg(r: TileRange) -> Option<u32> {
    (r.first < 1 << 16 && r.count < 1 << 16).then_some(r.first | r.count << 16)
}

/// The range a pair task's `args[1]` or `args[2]` holds.
pub fn pair_range(arg: u32) -> TileRange {
    TileRange {
        first: arg & 0xffff,
        count: arg >> 16,
    }
}
/// Rows of x a launch multiplies at most (`LIN_MAX_ROWS`).
pub const MAX_ROWS: usize = 16;
/// Threads of a group that streams together (`LIN_GROUP`).
pub const GROUP: u32 = 32;
/// bf16 elements a row of x is padded by in LDS (`LIN_X_PAD`).
const X_PAD: usize = 8;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("{rows} rows: the linear takes 1 to {MAX_ROWS}")]
    Rows { rows: usize },
    #[error("a CTA of {threads} threads: the linear needs whole groups of {GROUP}, a power of two of them")]
    Threads { threads: u32 },
    #[error("matrix {matrix}: k = {k} is not a positive multiple of {WEIGHT_BLOCK}")]
    K { matrix: usize, k: usize },
    #[error("matrix {matrix} waits on matrix {after}, which is not earlier")]
    After { matrix: usize, after: usize },
    #[error("matrix {matrix} has no tiles")]
    NoTiles { matrix: usize },
    #[error("no CTAs to place on")]
    NoCtas,
    #[error("{matrices} matrices but {weights} tile sizes")]
    TileBytes { matrices: usize, weights: usize },
    #[error(transparent)]
    Task(#[from] mailbox::task::TooManyInputs),
}

/// 8-row blocks of x the tile multiplies (`RT`): 1 up to 8 rows, 2 up to 16.
pub fn row_tiles(rows: usize) -> Result<usize, LayoutError> {
    match rows {
        1..=8 => Ok(1),
        9..=MAX_ROWS => Ok(2),
        _ => Err(LayoutError::Rows { rows }),
    }
}

/// Rounds of partial sums the register path keeps in LDS before one epilogue adds them
/// (`lin_wide_rounds`): four up to 8 rows; at 16 rows one slot is 16 KB and x at k = 6144 192 KB.
pub fn wide_rounds(row_tiles: usize) -> usize {
    if row_tiles == 1 {
        4
    } else {
        1
    }
}

/// Dynamic shared memory of a CTA of `threads` for a matrix of `k` and `rows`: `wide_rounds` slots
/// of the groups' partial sums (16 packed rows x 8 RT x fp32 each) and x (8 RT rows of k + 8 bf16).
pub fn lds_bytes(threads: u32, k: usize, rows: usize) -> Result<u32, LayoutError> {
    if threads % GROUP != 0 || !(threads / GROUP).is_power_of_two() {
        return Err(LayoutError::Threads { threads });
    }
    let rt = row_tiles(rows)?;
    let groups = (threads / GROUP) as usize;
    let partials = groups * TILE_ROWS * 8 * rt * 4;
    Ok((wide_rounds(rt) * partials + 8 * rt * (k + X_PAD) * 2) as u32)
}

/// A contiguous run of one matrix's tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileRange {
    pub first: u32,
    pub count: u32,
}

/// `tiles` split into at most `parts` runs of nearly equal size (longer runs first), none empty.
pub fn split_tiles(tiles: u32, parts: u32) -> Vec<TileRange> {
    let parts = parts.min(tiles).max(1);
    let (base, extra) = (tiles / parts, tiles % parts);
    let mut first = 0;
    (0..parts)
        .map(|p| {
            let count = base + u32::from(p < extra);
            let r = TileRange { first, count };
            first += count;
            r
        })
        .filter(|r| r.count > 0)
        .collect()
}

/// One matrix of a launch as the placement sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixPlan {
    pub tiles: u32,
    /// The earlier matrix whose tasks its tasks all wait for (its x is that matrix's y).
    pub after: Option<usize>,
}

/// The tasks of a launch of several matrices, in order: each matrix split over `ctas` CTAs into
/// at most `ctas` tasks, the split of matrix m starting on the CTA after matrix m - 1's last one,
/// so that small matrices spread over the grid. Every task writes one line of boxes (its own);
/// a task of a matrix that comes after an earlier one waits on all of that matrix's lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchPlan {
    pub placement: Placement,
    /// Boxes the scratch needs.
    pub boxes: u32,
    /// The tasks of each matrix: (CTA, tile range, box range).
    pub tasks: Vec<Vec<(u32, TileRange, BoxRange)>>,
}

pub fn place(matrices: &[MatrixPlan], ctas: u32) -> Result<LaunchPlan, LayoutError> {
    if ctas == 0 {
        return Err(LayoutError::NoCtas);
    }
    let mut lists = vec![Vec::new(); ctas as usize];
    let (mut order, mut cta, mut next_box) = (0u32, 0u32, 0u32);
    let mut tasks: Vec<Vec<(u32, TileRange, BoxRange)>> = Vec::new();
    for (m, plan) in matrices.iter().enumerate() {
        if plan.tiles == 0 {
            return Err(LayoutError::NoTiles { matrix: m });
        }
        let inputs: Vec<BoxRange> = match plan.after {
            Some(a) if a < m => {
                let before = &tasks[a];
                let (first, last) = (before[0].2.first, before[before.len() - 1].2);
                vec![BoxRange::new(first, last.first + last.len - first)]
            }
            Some(a) => {
                return Err(LayoutError::After {
                    matrix: m,
                    after: a,
                })
            }
            None => Vec::new(),
        };
        let mut mine = Vec::new();
        for range in split_tiles(plan.tiles, ctas) {
            let out = BoxRange::new(next_box, BOXES_PER_LINE);
            next_box += BOXES_PER_LINE;
            let args = [m as u32, range.first, range.count];
            lists[cta as usize].push(Task::new(KIND_TILES, order, out, &inputs, args)?);
            mine.push((cta, range, out));
            order += 1;
            cta = (cta + 1) % ctas;
        }
        tasks.push(mine);
    }
    Ok(LaunchPlan {
        placement: Placement::new(lists),
        boxes: next_box.max(BOXES_PER_LINE),
        tasks,
    })
}

/// Whether matrix m waits on an earlier one, as a step of the chain: 0 for a matrix that waits on
/// none, else one more than the matrix it waits on.
fn levels(matrices: &[MatrixPlan]) -> Result<Vec<u32>, LayoutError> {
    let mut level = Vec::with_capacity(matrices.len());
    for (m, plan) in matrices.iter().enumerate() {
        if plan.tiles == 0 {
            return Err(LayoutError::NoTiles { matrix: m });
        }
        level.push(match plan.after {
            None => 0,
            Some(a) if a < m => level[a] + 1,
            Some(a) => {
                return Err(LayoutError::After {
                    matrix: m,
                    after: a,
                })
            }
        });
    }
    Ok(level)
}

/// The least level L with sum over CTAs of max(0, L - load) >= bytes: filling every CTA up to L
/// holds `bytes` and leaves the fullest CTA as empty as it can be.
fn water_level(load: &[u64], bytes: u64) -> u64 {
    let room = |level: u64| -> u64 { load.iter().map(|&l| level.saturating_sub(l)).sum() };
    let (mut lo, mut hi) = (0, load.iter().copied().max().unwrap_or(0) + bytes);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if room(mid) >= bytes {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// Like [`place`], but balancing when each CTA ends, counted in the bytes it streams, with
/// `tile_bytes[m]` the bytes of a tile of matrix m. Matrices go in steps: a run of consecutive
/// matrices that wait on nothing, or on matrices of one earlier step, is one step. A CTA begins a
/// step once its own earlier tasks are done and, if the step waits, once the CTAs holding what it
/// waits on are done (their bytes so far): a CTA that ran nothing before a matrix it must wait for
/// gains nothing from having been idle. A step's tiles, matrix after matrix, are one stream, cut
/// into contiguous runs that fill the CTAs from their beginnings up to one water level (the
/// earliest take the most); a tile goes to the CTA whose share holds its middle byte. So in every
/// step no CTA ends later than the latest beginning plus the step's mean plus one tile, and a CTA
/// takes one task per matrix its run meets: nine experts' gate/ups and downs become two or three
/// tasks a CTA, not eleven, and a chain's every link is split evenly.
pub fn place_weighted(
    matrices: &[MatrixPlan],
    tile_bytes: &[u64],
    ctas: u32,
) -> Result<LaunchPlan, LayoutError> {
    if ctas == 0 {
        return Err(LayoutError::NoCtas);
    }
    if tile_bytes.len() != matrices.len() {
        return Err(LayoutError::TileBytes {
            matrices: matrices.len(),
            weights: tile_bytes.len(),
        });
    }
    let level = levels(matrices)?;
    // Each matrix's runs: (CTA, tiles), in stream order.
    let mut runs: Vec<Vec<(u32, TileRange)>> = vec![Vec::new(); matrices.len()];
    let mut load = vec![0u64; ctas as usize];
    let mut start = 0;
    while start < matrices.len() {
        let end = (start..matrices.len())
            .find(|&m| level[m] != level[start])
            .unwrap_or(matrices.len());
        let bytes: u64 = (start..end)
            .map(|m| u64::from(matrices[m].tiles) * tile_bytes[m])
            .sum();
        // The step begins on every CTA no sooner than the CTAs it waits on are done.
        let ready = (start..end)
            .filter_map(|m| matrices[m].after)
            .flat_map(|a| runs[a].iter().map(|&(c, _)| load[c as usize]))
            .max()
            .unwrap_or(0);
        for l in &mut load {
            *l = (*l).max(ready);
        }
        let fill = water_level(&load, bytes);
        // CTA c's share of the stream is [from[c], from[c + 1]).
        let mut from = vec![0u64; ctas as usize + 1];
        for c in 0..ctas as usize {
            from[c + 1] = from[c] + fill.saturating_sub(load[c]);
        }
        let (mut offset, mut cta) = (0u64, 0usize);
        for m in start..end {
            let b = tile_bytes[m];
            for t in 0..matrices[m].tiles {
                // Twice the middle byte, so that odd tile sizes stay exact.
                let middle2 = 2 * offset + b;
                while cta + 1 < ctas as usize && 2 * from[cta + 1] <= middle2 {
                    cta += 1;
                }
                load[cta] += b;
                match runs[m].last_mut() {
                    Some((c, r)) if *c == cta as u32 => r.count += 1,
                    _ => runs[m].push((cta as u32, TileRange { first: t, count: 1 })),
                }
                offset += b;
            }
        }
        start = end;
    }
    let mut lists = vec![Vec::new(); ctas as usize];
    let (mut order, mut next_box) = (0u32, 0u32);
    let mut tasks: Vec<Vec<(u32, TileRange, BoxRange)>> = Vec::new();
    for (m, plan) in matrices.iter().enumerate() {
        let inputs: Vec<BoxRange> = match plan.after {
            Some(a) => {
                let before: &Vec<(u32, TileRange, BoxRange)> = &tasks[a];
                let (first, last) = (before[0].2.first, before[before.len() - 1].2);
                vec![BoxRange::new(first, last.first + last.len - first)]
            }
            None => Vec::new(),
        };
        let mut mine = Vec::new();
        for &(cta, range) in &runs[m] {
            let out = BoxRange::new(next_box, BOXES_PER_LINE);
            next_box += BOXES_PER_LINE;
            let args = [m as u32, range.first, range.count];
            lists[cta as usize].push(Task::new(KIND_TILES, order, out, &inputs, args)?);
            mine.push((cta, range, out));
            order += 1;
        }
        tasks.push(mine);
    }
    Ok(LaunchPlan {
        placement: Placement::new(lists),
        boxes: next_box.max(BOXES_PER_LINE),
        tasks,
    })
}
