//! Pure placement math of MLA, shared by the reference, the kernels and the executor.

use std::ops::Range;

use mailbox::layout::{BoxRange, BoxValue, LayoutBuilder, Region, BOXES_PER_LINE};
use mailbox::placement::Placement;
use mailbox::task::{Stage, Task};
use model::paging::PageTable;
use model::{mla_cache_bytes_per_token, CacheFormat, ModelConfig, MLA_CACHE_TILE};

use crate::error::{invalid, Result};

const BF16_BYTES: usize = 2;
const F32_BYTES: usize = 4;

/// One cached token's record (spec §3.10, scaled to the config): the latent (E4M3 codes, or bf16),
/// then in FP8 one fp32 scale per 128 latent elements, then the bf16 rope key. GLM-5's FP8 record
/// is 512 + 16 + 128 = 656 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheLayout {
    pub format: CacheFormat,
    pub latent: usize,
    pub rope: usize,
}

impl CacheLayout {
    pub fn new(cfg: &ModelConfig, format: CacheFormat) -> Result<Self> {
        cfg.check_mla_cache(format, "`CacheLayout::new`")?;
        Ok(CacheLayout {
            format,
            latent: cfg.kv_lora_rank,
            rope: cfg.qk_rope_head_dim,
        })
    }

    /// FP8 scale tiles of the latent (0 for bf16).
    pub fn tiles(&self) -> usize {
        match self.format {
            CacheFormat::Fp8 => self.latent / MLA_CACHE_TILE,
            CacheFormat::Bf16 => 0,
        }
    }

    pub fn latent_bytes(&self) -> Range<usize> {
        let width = match self.format {
            CacheFormat::Fp8 => 1,
            CacheFormat::Bf16 => BF16_BYTES,
        };
        0..self.latent * width
    }

    /// The fp32 scales (empty for bf16).
    pub fn scale_bytes(&self) -> Range<usize> {
        let start = self.latent_bytes().end;
        start..start + self.tiles() * F32_BYTES
    }

    pub fn rope_bytes(&self) -> Range<usize> {
        let start = self.scale_bytes().end;
        start..start + self.rope * BF16_BYTES
    }

    pub fn bytes_per_token(&self) -> usize {
        self.rope_bytes().end
    }

    /// Agrees with the byte counts of `model` (which the traffic figures use).
    pub fn matches_model(&self, cfg: &ModelConfig) -> bool {
        mla_cache_bytes_per_token(cfg, self.format) == self.bytes_per_token() as u64
    }
}

/// The cache slot of each row's new token, `(request, position)`, in the paged cache's shared
/// table (`model::paging`): the record the cache write fills (`mla_args::new_slots`), as select's
/// lists name the tokens attention reads. MLA records sit one a slot, so a table's page holds
/// `PAGE_TOKENS` records.
pub fn new_slots(table: &PageTable, rows: &[(u32, u32)]) -> Result<Vec<u32>> {
    rows.iter()
        .enumerate()
        .map(|(row, &(request, position))| {
            table
                .slot(request as usize, position)
                .map(|slot| slot as u32)
                .ok_or_else(|| {
                    invalid(
                        "MLA new slots",
                        format!(
                            "row {row}: position {position} of request {request} is past its \
                             {} pages",
                            table.pages(request as usize).len()
                        ),
                    )
                })
        })
        .collect()
}

/// Where one head's slices sit in q_b_proj, kv_b_proj and o_proj (spec §1.5, §2.7): per head,
/// q_b rows are nope then rope; kv_b rows are W_UK (nope rows) then W_UV (v rows); o_proj columns
/// are the head's v block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeadLayout {
    pub heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
}

impl HeadLayout {
    pub fn new(cfg: &ModelConfig) -> Self {
        HeadLayout {
            heads: cfg.num_attention_heads,
            nope: cfg.qk_nope_head_dim,
            rope: cfg.qk_rope_head_dim,
            v: cfg.v_head_dim,
        }
    }

    pub fn qk_dim(&self) -> usize {
        self.nope + self.rope
    }

    pub fn q_b_rows(&self) -> usize {
        self.heads * self.qk_dim()
    }

    pub fn kv_b_rows(&self) -> usize {
        self.heads * (self.nope + self.v)
    }

    pub fn o_cols(&self) -> usize {
        self.heads * self.v
    }

    pub fn q_nope_rows(&self, head: usize) -> Range<usize> {
        let start = head * self.qk_dim();
        start..start + self.nope
    }

    pub fn q_rope_rows(&self, head: usize) -> Range<usize> {
        let start = head * self.qk_dim() + self.nope;
        start..start + self.rope
    }

    /// W_UK\[head\]: maps the latent to the head's nope key.
    pub fn uk_rows(&self, head: usize) -> Range<usize> {
        let start = head * (self.nope + self.v);
        start..start + self.nope
    }

    /// W_UV\[head\]: maps the latent to the head's value.
    pub fn uv_rows(&self, head: usize) -> Range<usize> {
        let start = head * (self.nope + self.v) + self.nope;
        start..start + self.v
    }

    /// The head's block of o_proj's input (and of the concatenated attention output).
    pub fn o_block(&self, head: usize) -> Range<usize> {
        head * self.v..(head + 1) * self.v
    }
}

/// Own kinds of the MLA stage's tasks (`MLA_KIND_*` in `kernels/mla_attn.h`); the task's kind word
/// is [`MlaKind::kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MlaKind {
    /// args `[row, slot]`: the row's new latent and rope key into the record of `slot`.
    CacheWrite = 0,
    /// args `[first_row, n_rows | flag | split << 8, block]`: a group's attention over one block
    /// of each row's selected slots, to partial outputs; with [`SPLIT_AFTER_WRITE`] its input 1
    /// is waited on before any record is read.
    Split = 1,
    /// args `[first_row, n_splits, q0 | nq << 16]`: queries `q0..q0 + nq` of a group from its splits.
    Combine = 2,
    /// args `[first_row, n_rows, which]`: an RMSNorm of rows of the attention half ([`NormOf`]).
    Norm = 3,
    /// args `[first_row, n_rows, 0]`: the rope of every head's rope part of q_b's output.
    RopeQ = 4,
    /// args `[first_row, n_rows, 0]`: the rows' slot lists, in plain memory, published as the
    /// tagged pairs of [`MlaBoxes::slots`]: lists kept from an earlier launch (no inputs), or
    /// written by select in the same launch (inputs: the rows' list boxes, waited on first).
    Slots = 5,
}

/// Which rows a [`MlaKind::Norm`] task normalises (`MLA_NORM_*` in `kernels/mla_rows.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NormOf {
    /// The layer's input rows (RMSNorm_in), read by the indexer (q_a and kv_a norm their x
    /// themselves as they stage it: `linear::gpu::FLAG_RMSNORM`).
    Hidden = 0,
    /// q_a's output (RMSNorm_qa), read by the indexer (q_b norms its x itself).
    QLatent = 1,
    /// kv_a's latent (RMSNorm_kv) to the new latents, and its rope key roped to the new keys.
    KvLatent = 2,
}

impl MlaKind {
    pub const fn kind(self) -> u32 {
        Task::kind_of(Stage::Mla, self as u32)
    }
}

/// A split's flag (`MLA_SPLIT_AFTER_WRITE`): its input 1 is the cache write of its request's
/// group before it, whose rows' new tokens its rows may list; it waits on it before reading any
/// record (the other inputs it waits on with its first records in flight).
pub const SPLIT_AFTER_WRITE: u32 = 0x80;
/// Queries a split scores at once (`MLA_QCHUNK`) and the parts its scores are summed in over K
/// (`MLA_KCHUNKS`).
pub const QUERY_CHUNK: usize = 16;
pub const K_PARTS: usize = 3;
/// LDS a combine keeps for its threads' sums (16 bytes each of up to 512 threads).
const COMBINE_SUM_BYTES: usize = 512 * 16;
/// Most rows one split or combine serves: a distinct slot's rows are bits of one word, and a task
/// holds its rows' slot range in one input.
pub const MAX_GROUP_ROWS: u32 = 32;

/// What the attention kernel is built for (its `MLA_*` defines).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AttendShape {
    pub cache: CacheLayout,
    /// Heads of the rank: any multiple of 8 (8 at GLM-5 TP8).
    pub heads: usize,
    /// Most distinct slots a split holds (`MLA_UNION`): its rows times its block, at most.
    pub union: usize,
}

impl AttendShape {
    pub fn new(cache: CacheLayout, heads: usize, union: usize) -> Result<Self> {
        let why = if heads == 0 || heads % 8 != 0 {
            Some(format!(
                "{heads} heads: a multiple of 8 fills whole MMA tiles"
            ))
        } else if cache.latent % 16 != 0 || cache.rope % 16 != 0 || cache.rope == 0 {
            Some(format!(
                "latent {} and rope {}: both whole 16-element MMA steps",
                cache.latent, cache.rope
            ))
        } else if ((cache.latent + cache.rope) / 16) % K_PARTS != 0 {
            Some(format!(
                "latent + rope = {}: the scores' {K_PARTS} K parts must be whole MMA steps",
                cache.latent + cache.rope
            ))
        } else if cache.bytes_per_token() % 16 != 0 {
            Some(format!(
                "records of {} bytes: the kernel reads them in 16-byte pieces",
                cache.bytes_per_token()
            ))
        } else if union == 0 || union % 16 != 0 {
            Some(format!("union {union}: a positive multiple of 16"))
        } else {
            None
        };
        match why {
            Some(reason) => Err(invalid("MLA attention shape", reason)),
            None => Ok(AttendShape {
                cache,
                heads,
                union,
            }),
        }
    }

    /// Bytes of a split's LDS (`MLA_LDS_BYTES`): keys and queries as padded bf16 rows, the
    /// scores' K parts, the weights, and the slot lists.
    pub fn lds_bytes(&self) -> usize {
        let row = self.cache.latent + self.cache.rope + 8;
        let keys = self.union * row * 2;
        let query = QUERY_CHUNK * row * 2;
        let scores = K_PARTS * QUERY_CHUNK * (self.union + 1) * 4;
        let probs = QUERY_CHUNK * (self.union + 8) * 2;
        keys + query + scores + probs + 4 * self.union * 4 + 16
    }
}

/// One request's rows in a launch: `rows` consecutive rows (its verify rows), whose selected
/// slot lists hold at most `selected` entries that are not -1, all at the front.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRows {
    pub rows: u32,
    pub selected: u32,
}

/// How a launch's attention is cut into tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitChoice {
    /// Most rows of one request a split serves together (their shared slots are loaded once).
    pub group_rows: u32,
    /// Slots of each row a split takes, at most; lowered so that a group's blocks fit the union.
    /// At most k, and a group's splits must not reach past k ([`AttendPlan::new`] refuses both).
    pub block: u32,
    /// Queries (row, head) a combine task finishes.
    pub combine_queries: u32,
}

impl SplitChoice {
    /// The fastest cut measured on the H200 at GLM-5 TP8 (8 heads, k = 2048, FP8 records; see
    /// `crates/mla/PERF.md`): a group a row, 64 slots a split, a combine a query. Verify rows apart
    /// beat verify rows together (their shared slots loaded once) by 26.2 -> 15.9 us at 4 rows, as
    /// a group's split runs its queries in passes over up to `union` slots.
    pub const MEASURED_FASTEST: SplitChoice = SplitChoice {
        group_rows: 1,
        block: 64,
        combine_queries: 1,
    };
}

/// A group: consecutive rows of one request served by the same splits and combines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// Index of the group's request among the plan's.
    pub request: u32,
    pub first_row: u32,
    pub rows: u32,
    pub block: u32,
    pub splits: u32,
    /// Index of the group's first split among the launch's splits.
    pub first_split: u32,
    pub combines: u32,
    pub first_combine: u32,
}

/// The attention tasks of a launch, from the requests' rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttendPlan {
    pub heads: u32,
    pub topk: u32,
    pub rows: u32,
    pub groups: Vec<Group>,
    pub combine_queries: u32,
}

impl AttendPlan {
    pub fn new(
        shape: &AttendShape,
        topk: u32,
        requests: &[RequestRows],
        choice: SplitChoice,
    ) -> Result<Self> {
        let heads = shape.heads as u32;
        if requests.is_empty() || requests.iter().any(|r| r.rows == 0) {
            return Err(invalid("MLA attention plan", "every request needs a row"));
        }
        if choice.group_rows == 0 || choice.group_rows > MAX_GROUP_ROWS {
            return Err(invalid(
                "MLA attention plan",
                format!("group of {} rows; 1..={MAX_GROUP_ROWS}", choice.group_rows),
            ));
        }
        if choice.block == 0 || choice.combine_queries == 0 || choice.combine_queries > 0xffff {
            return Err(invalid(
                "MLA attention plan",
                "block and combine_queries must be positive (combine_queries below 2^16)",
            ));
        }
        // A split waits on `block` slot boxes of each of its rows from `split * block`; boxes past
        // a row's k are never written (line padding or the next row's list), so such a split would
        // wait forever or read another row's slots.
        if choice.block > topk {
            return Err(invalid(
                "MLA attention plan",
                format!(
                    "a split block of {} slots is larger than k = {topk}: a split waits on its \
                     block's slot boxes of each row, and a row has k of them",
                    choice.block
                ),
            ));
        }
        if let Some(r) = requests.iter().find(|r| r.selected > topk) {
            return Err(invalid(
                "MLA attention plan",
                format!("{} selected slots of a row, but k is {topk}", r.selected),
            ));
        }
        let mut groups = Vec::new();
        let (mut row, mut splits, mut combines) = (0u32, 0u32, 0u32);
        for (index, req) in requests.iter().enumerate() {
            let mut left = req.rows;
            while left > 0 {
                let rows = left.min(choice.group_rows);
                let block = choice.block.min(shape.union as u32 / rows);
                if block == 0 {
                    return Err(invalid(
                        "MLA attention plan",
                        format!("{rows} rows do not fit a union of {}", shape.union),
                    ));
                }
                let n_splits = req.selected.div_ceil(block).max(1);
                if u64::from(n_splits) * u64::from(block) > u64::from(topk) {
                    return Err(invalid(
                        "MLA attention plan",
                        format!(
                            "request {index}: {n_splits} splits of {block} slots (a group of \
                             {rows} rows in a union of {}) wait on slot boxes past k = {topk}; \
                             pick a block that divides k",
                            shape.union
                        ),
                    ));
                }
                let n_combines = (rows * heads).div_ceil(choice.combine_queries);
                groups.push(Group {
                    request: index as u32,
                    first_row: row,
                    rows,
                    block,
                    splits: n_splits,
                    first_split: splits,
                    combines: n_combines,
                    first_combine: combines,
                });
                row += rows;
                left -= rows;
                splits += n_splits;
                combines += n_combines;
            }
        }
        let max_splits = groups.iter().map(|g| g.splits).max().unwrap_or(0) as usize;
        // A combine's LDS: each (query, split)'s weight, and a 16-byte sum a thread of the CTA.
        if choice.combine_queries as usize * (max_splits + 1) * 4 + COMBINE_SUM_BYTES
            > shape.lds_bytes()
        {
            return Err(invalid(
                "MLA attention plan",
                format!(
                    "a combine of {} queries over {max_splits} splits needs more LDS than {} bytes",
                    choice.combine_queries,
                    shape.lds_bytes()
                ),
            ));
        }
        Ok(AttendPlan {
            heads,
            topk,
            rows: row,
            groups,
            combine_queries: choice.combine_queries,
        })
    }

    pub fn splits(&self) -> u32 {
        self.groups.iter().map(|g| g.splits).sum()
    }

    pub fn combines(&self) -> u32 {
        self.groups.iter().map(|g| g.combines).sum()
    }

    /// The partial outputs' splits a row (`max_splits` of the kernel's arguments).
    pub fn max_splits(&self) -> u32 {
        self.groups.iter().map(|g| g.splits).max().unwrap_or(0)
    }

    /// Elements of the partial outputs: `[rows][max_splits][heads]` times latent, and times 2.
    pub fn partial_queries(&self) -> usize {
        self.rows as usize * self.max_splits() as usize * self.heads as usize
    }
}

/// The boxes of a launch's attention: the selected slots (input, `topk` a row, written by select
/// or a stand-in) and the completion boxes of each group's cache write, each split and each
/// combine. Each of these boxes owns its line ([`BOXES_PER_LINE`] words declared, every one
/// written), so that one input range covers several of them: a split's the cache writes of its
/// request's earlier groups, a combine's its group's splits (it polls every
/// `range.len / n_splits`-th box) and a consumer's all the combines (it polls them all).
#[derive(Debug, Clone, Copy)]
pub struct MlaBoxes {
    pub slots: Region<i32>,
    pub cache_done: Region<u32>,
    pub split_done: Region<u32>,
    pub out_done: Region<u32>,
}

impl MlaBoxes {
    pub fn add(builder: &mut LayoutBuilder, prefix: &str, plan: &AttendPlan) -> Result<Self> {
        Ok(MlaBoxes {
            slots: region(builder, prefix, "slots", plan.rows, plan.topk)?,
            cache_done: region(
                builder,
                prefix,
                "cache_done",
                plan.groups.len() as u32,
                BOXES_PER_LINE,
            )?,
            split_done: region(builder, prefix, "split_done", plan.splits(), BOXES_PER_LINE)?,
            out_done: region(builder, prefix, "out_done", plan.combines(), BOXES_PER_LINE)?,
        })
    }
}

fn region<T: BoxValue>(
    b: &mut LayoutBuilder,
    prefix: &str,
    name: &str,
    slots: u32,
    words: u32,
) -> Result<Region<T>> {
    b.region(&format!("{prefix}_{name}"), slots, words)
        .map_err(|e| invalid("MLA boxes", e.to_string()))
}

fn slot_of<T: BoxValue>(region: &Region<T>, slot: u32) -> BoxRange {
    region
        .slot(slot)
        .expect("the plan sized every region it indexes")
}

/// What a launch's attention waits on beyond its slots, when the launch makes its own queries and
/// new tokens (the attention half, `executor::fused::attention`). A standalone launch's inputs are
/// written before it: [`AttendWaits::NONE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttendWaits {
    /// The cache writes wait on these: the new latents and rope keys.
    pub new_tokens: Option<BoxRange>,
    /// The splits wait on these (at most two): the queries (q_abs, q_pe). A split waits on the
    /// new latents and rope keys it makes its rows' own tokens from as well: on `new_tokens`, or
    /// through the cache writes before it.
    pub queries: [Option<BoxRange>; 2],
    /// A split also waits on the cache writes of its request's earlier groups, whose new tokens
    /// its rows may list (a group's own rows' tokens it makes from the new latents), before it
    /// reads any record: on all of them, one range of whole lines. The cache writes themselves
    /// wait on the new tokens alone, so a request's groups write at once rather than each after
    /// the one before (a chain of hand-offs as long as the request's groups, on the splits' path).
    pub earlier_cache_writes: bool,
}

impl AttendWaits {
    pub const NONE: AttendWaits = AttendWaits {
        new_tokens: None,
        queries: [None, None],
        earlier_cache_writes: false,
    };
}

impl AttendPlan {
    /// The launch's tasks in global order from `first_order`: each group's cache write (its rows'
    /// new tokens, to the slots the kernel reads from `new_slots`), the splits, then the combines.
    /// A split waits on its rows' slots; a row's own new token it makes from the new latent as the
    /// cache write does, so it never waits on the cache write (whose box is for later launches). A
    /// combine waits on its group's splits.
    pub fn tasks(&self, boxes: &MlaBoxes, first_order: u32) -> Vec<Task> {
        self.tasks_waiting(boxes, first_order, &AttendWaits::NONE)
    }

    /// [`AttendPlan::tasks`] whose cache writes and splits also wait on `waits`.
    pub fn tasks_waiting(
        &self,
        boxes: &MlaBoxes,
        first_order: u32,
        waits: &AttendWaits,
    ) -> Vec<Task> {
        let mut tasks = Vec::new();
        let mut order = first_order;
        let mut push = |kind: MlaKind, out: BoxRange, inputs: &[BoxRange], args: [u32; 3]| {
            tasks.push(
                Task::new(kind.kind(), order, out, inputs, args).expect("at most four inputs"),
            );
            order += 1;
        };
        // The cache writes of the earlier groups of group i's request, if any: their lines, one
        // range (the groups of a request are consecutive).
        let before = |i: usize| {
            let first = self.groups[..i]
                .iter()
                .rposition(|g| g.request != self.groups[i].request)
                .map_or(0, |j| j + 1);
            (waits.earlier_cache_writes && first < i).then(|| {
                BoxRange::new(
                    slot_of(&boxes.cache_done, first as u32).first,
                    (i - first) as u32 * boxes.cache_done.stride(),
                )
            })
        };
        for (i, g) in self.groups.iter().enumerate() {
            let inputs: Vec<BoxRange> = waits.new_tokens.into_iter().collect();
            push(
                MlaKind::CacheWrite,
                slot_of(&boxes.cache_done, i as u32),
                &inputs,
                [g.first_row, g.rows, 0],
            );
        }
        for (i, g) in self.groups.iter().enumerate() {
            let slots = BoxRange::new(
                slot_of(&boxes.slots, g.first_row).first,
                (g.rows - 1) * boxes.slots.stride() + self.topk,
            );
            // The earlier cache writes come first: the split waits on them before reading records.
            let after = before(i);
            let flag = if after.is_some() {
                SPLIT_AFTER_WRITE
            } else {
                0
            };
            // A split makes its rows' own tokens from the new latents: those cache writes waited
            // on them, so through them the split has seen them too; a group without any waits on
            // them.
            let inputs: Vec<BoxRange> = std::iter::once(slots)
                .chain(after.or(waits.new_tokens))
                .chain(waits.queries.iter().flatten().copied())
                .collect();
            for s in 0..g.splits {
                push(
                    MlaKind::Split,
                    slot_of(&boxes.split_done, g.first_split + s),
                    &inputs,
                    [g.first_row, g.rows | flag | s << 8, g.block],
                );
            }
        }
        for g in &self.groups {
            let done = BoxRange::new(
                slot_of(&boxes.split_done, g.first_split).first,
                g.splits * boxes.split_done.stride(),
            );
            let queries = g.rows * self.heads;
            for c in 0..g.combines {
                let q0 = c * self.combine_queries;
                let nq = self.combine_queries.min(queries - q0);
                push(
                    MlaKind::Combine,
                    slot_of(&boxes.out_done, g.first_combine + c),
                    &[done],
                    [g.first_row, g.splits, q0 | nq << 16],
                );
            }
        }
        tasks
    }
}

/// The one-stage list of a standalone launch: tasks dealt to at most `ctas` CTAs in order, task i
/// to CTA i % ctas, so every CTA's list increases in the global order.
pub fn deal(tasks: Vec<Task>, ctas: u32) -> Placement {
    let ctas = ctas.max(1).min(tasks.len().max(1) as u32) as usize;
    let mut lists = vec![Vec::new(); ctas];
    for (i, t) in tasks.into_iter().enumerate() {
        lists[i % ctas].push(t);
    }
    Placement::new(lists)
}
