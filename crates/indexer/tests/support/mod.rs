//! Scenes for the GPU tests and the GPU benchmark: requests over a paged cache filled by kind, the
//! rows' random inputs, the device side of a launch, and the checks against the reference.
#![allow(dead_code)] // each user (tests/gpu.rs, benches/gpu.rs) takes the part it needs

use device::{Buffer, Device, Stream};
use indexer::gpu::{inv_freq, Grid, IndexerKernels, KernelConfig, PlanBuffers, StageBuffers};
use indexer::layout::{CacheLayout, IndexerBoxes, Limits, Row, ScorePlan, MAX_RUNS};
use indexer::reference::{
    key_from_projection, key_score, query_heads_from_projection, row_query, IndexerDims, RowQuery,
    ScaledVector, VectorFormat,
};
use mailbox::layout::{tag_of, ScratchLayout, Tags};
use mailbox::Stall;
use model::numerics::{bf16_round, e4m3_decode, ue8m0_scale};
use model::paging::{pages_through, PageTable};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

pub type Error = Box<dyn std::error::Error>;

/// How the cache's old keys (those not written by the launch) are filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheKind {
    /// Random E4M3 codes, random power-of-two scales.
    Random,
    /// Four keys repeated over every position: ties everywhere.
    Ties,
    /// All-zero keys.
    Zeros,
    /// Random, with each request's last 4,096 old keys scaled by 8.
    Recent,
}

/// `rows` rows at consecutive positions ending at `last_position` (a draft chain, or one row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub rows: u32,
    pub last_position: u32,
}

impl Request {
    pub fn first_position(&self) -> u32 {
        self.last_position + 1 - self.rows
    }
}

/// What the poisoned slots of new keys hold in the cache a scorer reads: codes of 20 and scales
/// of 0x7e7e7e7e (8.5e37), so a scorer that reads a new key there instead of its pairs is far off.
pub const POISON_CODE: u8 = 0x5a;
pub const POISON_SCALE_BYTE: u8 = 0x7e;

/// Requests over one cache.
pub struct Scene {
    pub dims: IndexerDims,
    pub cache: CacheLayout,
    pub requests: Vec<Request>,
    pub table: PageTable,
    /// The cache as the host wrote it: old keys by kind, new keys' slots poisoned.
    pub bytes: Vec<u8>,
    pub kind: CacheKind,
}

impl Scene {
    pub fn new(dims: IndexerDims, requests: Vec<Request>, kind: CacheKind, seed: u64) -> Scene {
        let cache = CacheLayout::new(dims.head_dim as u32).expect("head dim is a multiple of 16");
        // Pages dealt round-robin, so no request's pages are contiguous or in order with another's.
        let counts: Vec<u32> = requests
            .iter()
            .map(|r| pages_through(r.last_position))
            .collect();
        let mut tables = vec![Vec::new(); requests.len()];
        let mut next = 0u32;
        for i in 0..counts.iter().copied().max().unwrap_or(0) {
            for (r, &count) in counts.iter().enumerate() {
                if i < count {
                    tables[r].push(next);
                    next += 1;
                }
            }
        }
        for table in tables.iter_mut().skip(1).step_by(2) {
            table.reverse();
        }
        let table = PageTable::new(&tables).expect("page table");
        let mut scene = Scene {
            dims,
            cache,
            requests,
            table,
            bytes: vec![0u8; next as usize * cache.page_bytes() as usize],
            kind,
        };
        scene.fill(seed);
        scene
    }

    fn slot(&self, request: usize, t: u32) -> (usize, usize) {
        let (page, slot) = self
            .table
            .locate(request, t)
            .expect("token inside the table");
        (
            self.cache.key_offset(page, slot) as usize,
            self.cache.scale_offset(page, slot) as usize,
        )
    }

    fn fill(&mut self, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let d = self.dims.head_dim;
        let random_key = |rng: &mut StdRng, codes: &mut [u8]| -> f32 {
            rng.fill_bytes(codes);
            for c in codes.iter_mut() {
                if *c & 0x7f == 0x7f {
                    *c ^= 1; // no NaN codes
                }
            }
            2f32.powi(rng.gen_range(-6..=-2))
        };
        let mut ties = vec![0u8; 4 * d];
        let tie_scales: Vec<f32> = ties
            .chunks_exact_mut(d)
            .map(|k| random_key(&mut rng, k))
            .collect();
        for r in 0..self.requests.len() {
            let request = self.requests[r];
            let first_new = request.first_position();
            for t in 0..=request.last_position {
                let (key, scale_at) = self.slot(r, t);
                let codes = &mut self.bytes[key..key + d];
                let scale = if t >= first_new {
                    codes.fill(POISON_CODE);
                    f32::from_bits(u32::from_ne_bytes([POISON_SCALE_BYTE; 4]))
                } else {
                    match self.kind {
                        CacheKind::Random => random_key(&mut rng, codes),
                        CacheKind::Recent => {
                            let s = random_key(&mut rng, codes);
                            if t + 4096 >= first_new {
                                s * 8.0
                            } else {
                                s
                            }
                        }
                        CacheKind::Ties => {
                            let i = (t % 4) as usize;
                            codes.copy_from_slice(&ties[i * d..(i + 1) * d]);
                            tie_scales[i]
                        }
                        CacheKind::Zeros => {
                            codes.fill(0);
                            ue8m0_scale(0.0)
                        }
                    }
                };
                self.bytes[scale_at..scale_at + 4].copy_from_slice(&scale.to_ne_bytes());
            }
        }
    }

    /// An old key as the host stored it: decoded codes into `values`, and its scale.
    pub fn old_key(&self, request: usize, t: u32, values: &mut [f32], decode: &[f32; 256]) -> f32 {
        let (key, scale_at) = self.slot(request, t);
        let codes = &self.bytes[key..key + values.len()];
        for (v, &c) in values.iter_mut().zip(codes) {
            *v = decode[c as usize];
        }
        f32::from_ne_bytes(self.bytes[scale_at..scale_at + 4].try_into().unwrap())
    }

    /// The rows of the chosen requests, in order.
    pub fn rows(&self, chosen: &[usize]) -> Vec<Row> {
        chosen
            .iter()
            .flat_map(|&r| {
                let request = self.requests[r];
                (request.first_position()..=request.last_position).map(move |position| Row {
                    request: r as u32,
                    position,
                })
            })
            .collect()
    }
}

pub fn e4m3_table() -> [f32; 256] {
    std::array::from_fn(|c| e4m3_decode(c as u8))
}

/// The rows' inputs: projections in bf16, gates, and the key norm's affine parameters.
pub struct Inputs {
    pub key_proj: Vec<u16>,
    pub query_proj: Vec<u16>,
    pub gates: Vec<f32>,
    pub norm_weight: Vec<f32>,
    pub norm_bias: Vec<f32>,
}

fn bf16_bits(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

pub fn bf16_value(bits: u16) -> f32 {
    half::bf16::from_bits(bits).to_f32()
}

impl Inputs {
    pub fn random(dims: &IndexerDims, rows: usize, seed: u64) -> Inputs {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut uniform = |n: usize, lo: f32, hi: f32| -> Vec<f32> {
            (0..n).map(|_| rng.gen_range(lo..hi)).collect()
        };
        Inputs {
            key_proj: uniform(rows * dims.head_dim, -3.0, 3.0)
                .into_iter()
                .map(bf16_bits)
                .collect(),
            query_proj: uniform(rows * dims.heads * dims.head_dim, -1.0, 1.0)
                .into_iter()
                .map(bf16_bits)
                .collect(),
            gates: uniform(rows * dims.heads, -1.0, 1.0),
            norm_weight: uniform(dims.head_dim, 0.5, 1.5),
            norm_bias: uniform(dims.head_dim, -0.2, 0.2),
        }
    }
}

/// Rows a stage's scratch holds.
pub const MAX_ROWS: u32 = 32;

/// Built kernels, the scratch and its tags, and the per-launch small buffers.
pub struct Stage {
    pub dev: Device,
    pub kernels: IndexerKernels,
    pub config: KernelConfig,
    pub boxes: IndexerBoxes,
    pub scratch: Buffer<u64>,
    pub epoch: Buffer<u32>,
    pub diag: Buffer<u32>,
    pub tags: Tags,
    pub inv_freq: Buffer<f64>,
    /// Where the launches' tasks go.
    pub grid: Grid,
    /// The epoch of the next launch: every launch gets a fresh tag.
    next_epoch: std::cell::Cell<u32>,
}

impl Stage {
    pub fn new(dev: Device, config: KernelConfig) -> Result<Stage, Error> {
        let kernels = IndexerKernels::build(&dev, &config)?;
        let mut builder = ScratchLayout::builder();
        let boxes = IndexerBoxes::add(
            &mut builder,
            MAX_ROWS,
            MAX_RUNS,
            config.dims.heads as u32,
            config.dims.head_dim as u32,
        )?;
        let layout = builder.build();
        Ok(Stage {
            grid: kernels.grid(boxes, layout.boxes()),
            scratch: dev.alloc_zeroed(layout.boxes() as usize)?,
            epoch: dev.alloc_zeroed(1)?,
            diag: dev.alloc_zeroed(mailbox::DIAG_WORDS)?,
            inv_freq: dev.upload(&inv_freq(&config.dims))?,
            tags: Tags::new(1)?,
            boxes,
            kernels,
            config,
            dev,
            next_epoch: std::cell::Cell::new(0),
        })
    }

    pub fn plan(&self, scene: &Scene, chosen: &[usize]) -> Result<ScorePlan, Error> {
        let rows = scene.rows(chosen);
        let max_runs = self.kernels.max_runs(rows.len() as u32)?.min(MAX_RUNS);
        let limits = Limits {
            max_runs,
            ..Limits::default()
        };
        Ok(ScorePlan::new(&rows, &scene.table, limits)?)
    }
}

/// What a launch produced, read back.
#[derive(Clone)]
pub struct Launched {
    pub plan: ScorePlan,
    /// The launch's tag, and the tag in each run's completion box.
    pub tag: u32,
    pub run_tags: Vec<u32>,
    pub scores: Vec<f32>,
    /// Per row: the published query (bf16 values, head weights).
    pub queries: Vec<RowQuery>,
    /// Per row: the published key (decoded codes, scale).
    pub keys: Vec<ScaledVector>,
}

/// Device buffers of one launch that outlive it (the bench replays with them).
pub struct LaunchBuffers {
    pub plan: PlanBuffers,
    pub key_proj: Buffer<u16>,
    pub query_proj: Buffer<u16>,
    pub gates: Buffer<f32>,
    pub norm_weight: Buffer<f32>,
    pub norm_bias: Buffer<f32>,
    pub scores: Buffer<f32>,
}

impl LaunchBuffers {
    pub fn new(
        stage: &Stage,
        scene: &Scene,
        plan: &ScorePlan,
        inputs: &Inputs,
    ) -> Result<Self, Error> {
        let dev = &stage.dev;
        Ok(LaunchBuffers {
            plan: PlanBuffers::upload(dev, plan, &scene.table, &stage.grid)?,
            key_proj: dev.upload(&inputs.key_proj)?,
            query_proj: dev.upload(&inputs.query_proj)?,
            gates: dev.upload(&inputs.gates)?,
            norm_weight: dev.upload(&inputs.norm_weight)?,
            norm_bias: dev.upload(&inputs.norm_bias)?,
            scores: dev.alloc_zeroed(plan.rows.len() * plan.stride as usize)?,
        })
    }

    pub fn stage<'a>(
        &'a self,
        stage: &'a Stage,
        cache_read: &'a Buffer<u8>,
        cache_write: &'a Buffer<u8>,
    ) -> StageBuffers<'a> {
        StageBuffers {
            key_proj: &self.key_proj,
            norm_weight: &self.norm_weight,
            norm_bias: &self.norm_bias,
            query_proj: &self.query_proj,
            gates: &self.gates,
            inv_freq: &stage.inv_freq,
            plan: &self.plan,
            cache_read,
            cache_write,
            scores: &self.scores,
            scratch: &stage.scratch,
            epoch: &stage.epoch,
            diag: &stage.diag,
            trace: None,
            tags: stage.tags,
            launch_index: 0,
            boxes: stage.boxes,
        }
    }
}

impl Stage {
    /// Sets a fresh epoch (so a fresh tag) for the next launch and clears the diagnostics;
    /// returns the tag.
    pub fn next_tag(&self) -> Result<u32, Error> {
        let epoch = self.next_epoch.get();
        self.epoch.write(&[epoch])?;
        self.next_epoch.set(epoch + 1);
        self.diag.zero()?;
        Ok(self.tags.tag(epoch, 0)?)
    }

    /// One whole-stage launch of `buffers` on `stream` under a fresh tag (key tasks store into
    /// `cache_write`, scorers read `cache_read`): it also publishes the rows' queries and new keys
    /// for scoring launches with the same tag (`IndexerKernels::score`).
    pub fn publish(
        &self,
        stream: &Stream,
        buffers: &LaunchBuffers,
        cache_read: &Buffer<u8>,
        cache_write: &Buffer<u8>,
    ) -> Result<u32, Error> {
        let tag = self.next_tag()?;
        self.kernels
            .launch(stream, &buffers.stage(self, cache_read, cache_write))?;
        Ok(tag)
    }

    /// The whole stage once, on `plan`'s rows, then everything read back. `cache_write` is where
    /// key tasks store; scorers read `cache_read`.
    pub fn launch(
        &self,
        scene: &Scene,
        plan: &ScorePlan,
        inputs: &Inputs,
        cache_read: &Buffer<u8>,
        cache_write: &Buffer<u8>,
    ) -> Result<Launched, Error> {
        let buffers = LaunchBuffers::new(self, scene, plan, inputs)?;
        let stream = self.dev.stream();
        let tag = self.publish(stream, &buffers, cache_read, cache_write)?;
        stream.sync()?;
        let diag = self.diag.download()?;
        if let Some((stall, count)) = Stall::from_diag(&diag, self.poll_limit()) {
            return Err(format!("{count} waits gave up; first: {stall}").into());
        }
        let words = self.scratch.download()?;
        let (queries, keys) = published(&self.config, &self.boxes, &words, plan.rows.len() as u32);
        let run_tags = (0..plan.runs.len() as u32)
            .map(|r| {
                tag_of(words[self.boxes.run.box_index(r, 0).expect("run in the boxes") as usize])
            })
            .collect();
        Ok(Launched {
            plan: plan.clone(),
            tag,
            run_tags,
            scores: buffers.scores.download()?,
            queries,
            keys,
        })
    }

    pub fn poll_limit(&self) -> u64 {
        self.config
            .mailbox
            .debug
            .map_or(u64::MAX, |d| u64::from(d.poll_limit))
    }
}

/// What the key and query tasks published for rows `0..rows` in a launch's scratch `words`: per
/// row its query (bf16 values or decoded E4M3 codes, then the head weights) and its key (decoded
/// codes, scale).
pub fn published(
    config: &KernelConfig,
    boxes: &IndexerBoxes,
    words: &[u64],
    rows: u32,
) -> (Vec<RowQuery>, Vec<ScaledVector>) {
    let value = |b: u32| words[b as usize] as u32;
    let d = &config.dims;
    let mut queries = Vec::new();
    let mut keys = Vec::new();
    for row in 0..rows {
        let q_box = |w| boxes.query.box_index(row, w).expect("row in the boxes");
        // bf16 pairs, or E4M3 fours; then the weights.
        let (value_words, q): (u32, Vec<f32>) = if config.query == VectorFormat::Fp8 {
            let words = (d.heads * d.head_dim / 4) as u32;
            let q = (0..words)
                .flat_map(|w| value(q_box(w)).to_le_bytes())
                .map(e4m3_decode)
                .collect();
            (words, q)
        } else {
            let words = (d.heads * d.head_dim / 2) as u32;
            let q = (0..words)
                .flat_map(|w| {
                    let v = value(q_box(w));
                    [bf16_value(v as u16), bf16_value((v >> 16) as u16)]
                })
                .collect();
            (words, q)
        };
        let weights = (0..d.heads as u32)
            .map(|h| f32::from_bits(value(q_box(value_words + h))))
            .collect();
        queries.push(RowQuery { q, weights });
        let k_box = |w| boxes.key.box_index(row, w).expect("row in the boxes");
        let values = (0..d.head_dim as u32 / 4)
            .flat_map(|w| value(k_box(w)).to_le_bytes())
            .map(e4m3_decode)
            .collect();
        let scale = f32::from_bits(value(k_box(d.head_dim as u32 / 4)));
        keys.push(ScaledVector { values, scale });
    }
    (queries, keys)
}

/// Every run's completion box holds the launch's tag (the scores it vouches for are checked by
/// [`check_scores`]).
pub fn check_runs_done(launched: &Launched) -> Result<(), String> {
    match launched.run_tags.iter().position(|&t| t != launched.tag) {
        None => Ok(()),
        Some(r) => Err(format!(
            "run {r}'s completion box holds tag {}, not the launch's {}",
            launched.run_tags[r], launched.tag
        )),
    }
}

/// Checks the published keys and queries against the reference computed from the same inputs:
/// a key's codes may differ by one step where the kernel's fp32 LayerNorm rounds the other way,
/// a query element by one bf16 step; an FP8 query, like a key, by one E4M3 step, its scale (in
/// the head weight) by a factor of two.
pub fn check_rows(
    config: &KernelConfig,
    launched: &Launched,
    inputs: &Inputs,
) -> Result<(), String> {
    let d = &config.dims;
    let opts = config.options();
    for (r, row) in launched.plan.rows.iter().enumerate() {
        let projected: Vec<f32> = inputs.key_proj[r * d.head_dim..][..d.head_dim]
            .iter()
            .map(|&b| bf16_value(b))
            .collect();
        let want = key_from_projection(
            d,
            &opts,
            &projected,
            &inputs.norm_weight,
            &inputs.norm_bias,
            u64::from(row.position),
        )
        .map_err(|e| e.to_string())?;
        let got = &launched.keys[r];
        let scale_ratio = got.scale / want.scale;
        if ![0.5, 1.0, 2.0].contains(&scale_ratio) {
            return Err(format!(
                "row {r}: key scale {} against {}",
                got.scale, want.scale
            ));
        }
        for (i, (&g, &w)) in got.values.iter().zip(&want.values).enumerate() {
            let (g, w) = (g * got.scale, w * want.scale);
            let step = (w.abs() / 8.0).max(want.scale.max(got.scale) * 2f32.powi(-9));
            if (g - w).abs() > step * 1.0001 {
                return Err(format!("row {r}: key dim {i} is {g}, reference {w}"));
            }
        }
        let projected: Vec<f32> = inputs.query_proj[r * d.heads * d.head_dim..]
            [..d.heads * d.head_dim]
            .iter()
            .map(|&b| bf16_value(b))
            .collect();
        let heads = query_heads_from_projection(d, &opts, &projected, u64::from(row.position))
            .map_err(|e| e.to_string())?;
        let gates = &inputs.gates[r * d.heads..][..d.heads];
        let want = row_query(d, &heads, gates).map_err(|e| e.to_string())?;
        let got = &launched.queries[r];
        if config.query == VectorFormat::Fp8 {
            check_fp8_query(r, d, got, &want)?;
            continue;
        }
        for (h, head) in want.q.chunks_exact(d.head_dim).enumerate() {
            let largest = head.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (i, &w) in head.iter().enumerate() {
                let g = got.q[h * d.head_dim + i];
                let step = w.abs() / 128.0 + largest * 1e-5;
                if (g - w).abs() > step || bf16_round(g) != g {
                    return Err(format!(
                        "row {r}: query head {h} dim {i} is {g}, reference {w}"
                    ));
                }
            }
        }
        for (h, (&g, &w)) in got.weights.iter().zip(&want.weights).enumerate() {
            if (g - w).abs() > w.abs() * 1e-6 {
                return Err(format!("row {r}: head weight {h} is {g}, reference {w}"));
            }
        }
    }
    Ok(())
}

/// An FP8 query against the reference's: per head, the weights' ratio is the scales' (1, or 2^+-1
/// where the kernel's f32 rounding put the head's largest across a power of two), and each
/// element, in the reference's scale, within one E4M3 step.
fn check_fp8_query(
    r: usize,
    d: &IndexerDims,
    got: &RowQuery,
    want: &RowQuery,
) -> Result<(), String> {
    for h in 0..d.heads {
        let (gw, ww) = (got.weights[h], want.weights[h]);
        let ratio = [0.5f32, 1.0, 2.0]
            .into_iter()
            .find(|&k| (gw - k * ww).abs() <= (k * ww).abs() * 1e-6)
            .ok_or_else(|| format!("row {r}: head weight {h} is {gw}, reference {ww}"))?;
        for i in 0..d.head_dim {
            let (g, w) = (
                got.q[h * d.head_dim + i] * ratio,
                want.q[h * d.head_dim + i],
            );
            let step = (w.abs() / 8.0).max(ratio.max(1.0) * 2f32.powi(-9));
            if (g - w).abs() > step * 1.0001 {
                return Err(format!(
                    "row {r}: query head {h} dim {i} is {g}, reference {w} (reference scale)"
                ));
            }
        }
    }
    Ok(())
}

/// How close a launch's scores came to the reference.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScoreStats {
    /// max |gpu - ref| / max |ref| over each row's valid keys, the worst row.
    pub worst: f64,
    pub keys: u64,
}

/// Scores against the reference computed from the launch's own quantised inputs (its published
/// queries and new keys, the host's old keys): within 1e-4 of the row's largest reference score
/// for t <= position, exactly -inf after it up to the stride.
pub fn check_scores(scene: &Scene, launched: &Launched) -> Result<ScoreStats, String> {
    let d = &scene.dims;
    let plan = &launched.plan;
    let stride = plan.stride as usize;
    let decode = e4m3_table();
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let mut stats = ScoreStats::default();
    for (r, row) in plan.rows.iter().enumerate() {
        let request = row.request as usize;
        let first_new = scene.requests[request].first_position();
        // The launch's row index of each new key of this request.
        let new_row = |t: u32| {
            plan.rows
                .iter()
                .position(|x| x.request == row.request && x.position == t)
                .expect("a new key belongs to a row of the launch")
        };
        let n = row.position as usize + 1;
        let chunk = n.div_ceil(threads);
        let query = &launched.queries[r];
        let mut reference = vec![0.0f64; n];
        std::thread::scope(|s| {
            for (c, out) in reference.chunks_mut(chunk).enumerate() {
                s.spawn(move || {
                    let mut values = vec![0.0f32; d.head_dim];
                    for (i, slot) in out.iter_mut().enumerate() {
                        let t = (c * chunk + i) as u32;
                        *slot = if t < first_new {
                            let scale = scene.old_key(request, t, &mut values, &decode);
                            key_score(d, query, &values, scale)
                        } else {
                            let key = &launched.keys[new_row(t)];
                            key_score(d, query, &key.values, key.scale)
                        };
                    }
                });
            }
        });
        let got = &launched.scores[r * stride..][..stride];
        let largest = reference.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let mut worst = 0.0f64;
        for (t, &g) in got.iter().enumerate() {
            if t >= n {
                if g != f32::NEG_INFINITY {
                    return Err(format!(
                        "row {r} (position {}): score {t} is {g}, not -inf",
                        row.position
                    ));
                }
                continue;
            }
            let error = (f64::from(g) - reference[t]).abs();
            // A NaN score fails too.
            let within = error <= 1e-4 * largest;
            if !within {
                return Err(format!(
                    "row {r} (request {request}, position {}): score {t} is {g}, reference {} (largest {largest})",
                    row.position, reference[t]
                ));
            }
            worst = worst.max(if largest > 0.0 {
                error / largest
            } else {
                error
            });
        }
        stats.worst = stats.worst.max(worst);
        stats.keys += n as u64;
    }
    Ok(stats)
}

/// The key tasks' stores: every new key of the chosen requests, in `cache`, equals its pairs.
pub fn check_stored(scene: &Scene, launched: &Launched, cache: &[u8]) -> Result<(), String> {
    for (r, row) in launched.plan.rows.iter().enumerate() {
        let (key, scale_at) = scene.slot(row.request as usize, row.position);
        let stored = &cache[key..key + scene.dims.head_dim];
        let published = &launched.keys[r];
        let scale = f32::from_ne_bytes(cache[scale_at..scale_at + 4].try_into().unwrap());
        let codes: Vec<u8> = published.codes();
        if stored != codes.as_slice() || scale != published.scale {
            return Err(format!(
                "row {r}: the cached key differs from the published one"
            ));
        }
    }
    Ok(())
}
