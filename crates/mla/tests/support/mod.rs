//! Scenes of the MLA attention tasks: requests with their caches (the reference's records), the
//! new tokens the launch writes, queries and selected slots; the reference's outputs; and, on a
//! GPU, the launch of the standalone task list. Shared by tests/gpu.rs and benches/gpu.rs.
#![allow(dead_code)]

use device::{Buffer, Device, Graph, Stream};
use half::bf16;
use mailbox::gpu::{DeviceTable, EpochNode, LaunchTable, Variant};
use mailbox::layout::{ScratchLayout, Tags};
use mailbox::placement::Limits;
use mla::gpu::{check_standalone, MlaArgs, MlaBuffers, MlaKernel, CTA_THREADS};
use mla::layout::{deal, AttendPlan, AttendShape, MlaBoxes, RequestRows, SplitChoice};
use mla::reference::{attend_latent, CacheStore, MlaCache};
use mla::CacheLayout;
use model::{CacheFormat, ModelConfig};
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

pub type Error = Box<dyn std::error::Error>;

/// What a step runs after the slots' publication.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Attend {
    /// Nothing.
    No,
    /// The attention kernel over lists with no tasks, on as many CTAs: the launch's own cost.
    Empty,
    /// The attention tasks.
    Tasks,
}

/// How a request's rows pick their slots.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pick {
    /// Every position up to the row's own when they fit k, else a random k of them in position
    /// order, consecutive rows sharing about three quarters.
    Random,
    /// Every entry the row's own position (a slot listed k times counts once).
    SamePosition,
}

/// One request: its context (tokens cached including this launch's rows) and its rows.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub context: usize,
    pub rows: usize,
}

#[derive(Clone, Copy, Debug)]
pub struct Adversary {
    /// The first row's first selected token scores about this much above the rest (0: none).
    pub outlier: f32,
    /// Every cached token the same latent and rope key.
    pub equal_tokens: bool,
}

pub const PLAIN: Adversary = Adversary {
    outlier: 0.0,
    equal_tokens: false,
};

/// Host-side data of a launch and its expected results.
#[derive(Clone)]
pub struct Scene {
    pub shape: AttendShape,
    pub topk: usize,
    pub plan: AttendPlan,
    pub q_abs: Vec<u16>,
    pub q_pe: Vec<u16>,
    pub new_latent: Vec<u16>,
    pub new_rope: Vec<u16>,
    pub new_slots: Vec<u32>,
    /// The records before the launch: the new tokens' records poisoned (NaN codes).
    pub cache_before: Vec<u8>,
    /// The records after the reference's writes.
    pub cache_after: Vec<u8>,
    /// `[rows][topk]` cache slots (-1 padding).
    pub slots: Vec<i32>,
    /// `[rows][heads][latent]` from the reference.
    pub expected: Vec<f32>,
    pub scale: f32,
    /// Records of distinct slots the launch reads (for traffic figures).
    pub distinct_slots: usize,
    /// The requests' rows, as the plan was made from them.
    pub requests: Vec<RequestRows>,
}

fn bits(v: f32) -> u16 {
    bf16::from_f32(v).to_bits()
}
fn value(b: u16) -> f32 {
    bf16::from_bits(b).to_f32()
}

pub fn shape(format: CacheFormat, heads: usize) -> AttendShape {
    let cfg = ModelConfig::preset("glm-5").unwrap();
    AttendShape::new(CacheLayout::new(&cfg, format).unwrap(), heads, 128).unwrap()
}

/// The splitting of the tests and benchmarks: groups of up to 4 rows, 64 slots a row a split at
/// one row (32 splits of 2048), fewer with more rows (the union holds 128).
pub fn choice(heads: usize) -> SplitChoice {
    SplitChoice {
        group_rows: 4,
        block: 64,
        combine_queries: (heads as u32 / 8).max(1),
    }
}

impl Scene {
    pub fn new(
        shape: AttendShape,
        topk: usize,
        requests: &[Request],
        pick: Pick,
        adv: Adversary,
        seed: u64,
    ) -> Result<Scene, Error> {
        let cfg = ModelConfig::preset("glm-5").unwrap();
        let cfg = ModelConfig {
            kv_lora_rank: shape.cache.latent,
            qk_rope_head_dim: shape.cache.rope,
            ..cfg
        };
        let (latent, rope, heads) = (shape.cache.latent, shape.cache.rope, shape.heads);
        let mut rng = StdRng::seed_from_u64(seed);
        let uniform = |n: usize, a: f32, rng: &mut StdRng| -> Vec<f32> {
            (0..n).map(|_| value(bits(rng.gen_range(-a..a)))).collect()
        };
        let (mut q_abs, mut q_pe, mut new_latent, mut new_rope, mut new_slots) =
            (vec![], vec![], vec![], vec![], vec![]);
        let (mut before, mut after, mut slots, mut expected) = (vec![], vec![], vec![], vec![]);
        let mut distinct = 0;
        let mut requests_rows = Vec::new();
        let shared = uniform(latent + rope, 2.0, &mut rng);
        for req in requests {
            assert!(req.rows >= 1 && req.context >= req.rows);
            let mut cache = MlaCache::new(&cfg, CacheStore::Format(shape.cache.format))?;
            let base = before.len() / shape.cache.bytes_per_token();
            let first_new = req.context - req.rows;
            let mut tokens = Vec::new();
            for _ in 0..req.context {
                let t = if adv.equal_tokens {
                    shared.clone()
                } else {
                    uniform(latent + rope, 2.0, &mut rng)
                };
                tokens.push(t);
            }
            let mut row_lists: Vec<Vec<i32>> = Vec::new();
            for r in 0..req.rows {
                let p = first_new + r;
                let list: Vec<i32> = match pick {
                    Pick::SamePosition => vec![p as i32; topk],
                    Pick::Random if p < topk => (0..=p as i32)
                        .chain(std::iter::repeat(-1))
                        .take(topk)
                        .collect(),
                    Pick::Random => {
                        let mut set: Vec<usize> = match row_lists.last() {
                            Some(prev) => {
                                let mut v: Vec<usize> = prev.iter().map(|&x| x as usize).collect();
                                let mut taken: std::collections::HashSet<usize> =
                                    v.iter().copied().collect();
                                for i in 0..topk / 4 {
                                    let at = (i * 4 + 1) % topk;
                                    loop {
                                        let cand = rng.gen_range(0..=p);
                                        if taken.insert(cand) {
                                            taken.remove(&v[at]);
                                            v[at] = cand;
                                            break;
                                        }
                                    }
                                }
                                v
                            }
                            None => sample(&mut rng, p + 1, topk).into_vec(),
                        };
                        set.sort_unstable();
                        set.into_iter().map(|x| x as i32).collect()
                    }
                };
                row_lists.push(list);
            }
            if adv.outlier != 0.0 {
                // The first row's first selected token: its rope key against the queries' rope parts.
                let t = row_lists[0][0] as usize;
                for v in &mut tokens[t][latent..] {
                    *v = 16.0;
                }
            }
            for (i, t) in tokens.iter().enumerate() {
                cache.push(&t[..latent], &t[latent..])?;
                if i >= first_new {
                    new_latent.extend(t[..latent].iter().map(|&v| bits(v)));
                    new_rope.extend(t[latent..].iter().map(|&v| bits(v)));
                    new_slots.push((base + i) as u32);
                }
            }
            let rec = shape.cache.bytes_per_token();
            let bytes = cache.bytes().unwrap();
            after.extend_from_slice(bytes);
            before.extend_from_slice(&bytes[..first_new * rec]);
            before.extend(std::iter::repeat_n(0x7fu8, req.rows * rec));
            let mut union = std::collections::HashSet::new();
            for (r, list) in row_lists.iter().enumerate() {
                let mut qa = uniform(heads * latent, 4.0, &mut rng);
                let mut qp = uniform(heads * rope, 1.0, &mut rng);
                if adv.outlier != 0.0 && r == 0 {
                    // 64 x 16 x q_pe / 16 = outlier: q_pe = outlier / 64 on every dim.
                    for v in &mut qp {
                        *v = value(bits(adv.outlier / rope as f32));
                    }
                    for v in &mut qa {
                        *v *= 0.0;
                    }
                }
                let scale = 1.0 / ((cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) as f64).sqrt();
                expected.extend(attend_latent(&qa, &qp, &cache, list, scale)?);
                q_abs.extend(qa.iter().map(|&v| bits(v)));
                q_pe.extend(qp.iter().map(|&v| bits(v)));
                slots.extend(list.iter().map(|&t| {
                    if t < 0 {
                        -1
                    } else {
                        (base + t as usize) as i32
                    }
                }));
                union.extend(list.iter().filter(|&&t| t >= 0).copied());
            }
            distinct += union.len();
            requests_rows.push(RequestRows {
                rows: req.rows as u32,
                selected: row_lists
                    .iter()
                    .map(|l| l.iter().filter(|&&t| t >= 0).count() as u32)
                    .max()
                    .unwrap(),
            });
        }
        let plan = AttendPlan::new(&shape, topk as u32, &requests_rows, choice(heads))?;
        let scale = 1.0 / ((cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) as f32).sqrt();
        Ok(Scene {
            shape,
            topk,
            plan,
            q_abs,
            q_pe,
            new_latent,
            new_rope,
            new_slots,
            cache_before: before,
            cache_after: after,
            slots,
            expected,
            scale,
            distinct_slots: distinct,
            requests: requests_rows,
        })
    }

    /// The same scene cut into tasks by `choice`.
    pub fn replan(mut self, choice: SplitChoice) -> Result<Scene, Error> {
        self.plan = AttendPlan::new(&self.shape, self.topk as u32, &self.requests, choice)?;
        Ok(self)
    }

    /// The largest relative L2 error of a (row, head) output against the reference.
    pub fn error(&self, out: &[u16]) -> f64 {
        let latent = self.shape.cache.latent;
        self.expected
            .chunks(latent)
            .zip(out.chunks(latent))
            .map(|(e, o)| {
                let diff: f64 = e
                    .iter()
                    .zip(o)
                    .map(|(&e, &o)| (f64::from(e) - f64::from(value(o))).powi(2))
                    .sum();
                let norm: f64 = e.iter().map(|&e| f64::from(e).powi(2)).sum();
                if diff.is_nan() {
                    f64::INFINITY
                } else {
                    (diff / norm.max(1e-30)).sqrt()
                }
            })
            .fold(0.0, f64::max)
    }
}

/// A scene on the device, ready to launch: its kernel, buffers, task table and graphs.
pub struct GpuScene {
    pub kernel: MlaKernel,
    pub boxes: MlaBoxes,
    pub table: DeviceTable,
    /// As many CTAs as `table`, with no tasks.
    pub empty: DeviceTable,
    /// A trace build's marks ([`GpuScene::traced`]).
    pub trace: Option<Buffer<u64>>,
    pub scratch: Buffer<u64>,
    pub epoch: Buffer<u32>,
    pub diag: Buffer<u32>,
    pub slots: Buffer<i32>,
    pub cache: Buffer<u8>,
    pub out: Buffer<u16>,
    pub args: MlaArgs,
    pub tags: Tags,
    pub epoch_node: EpochNode,
    /// Global orders of the launch (the slot stand-ins' and the tasks').
    orders: usize,
    // Inputs the arguments point at.
    _inputs: Vec<Buffer<u16>>,
    _new_slots: Buffer<u32>,
    _parts: (Buffer<f32>, Buffer<f32>),
}

impl GpuScene {
    /// `slots` replaces the scene's slot lists (a negative control), `scale` its softmax scale.
    pub fn new(
        dev: &Device,
        kernel: MlaKernel,
        scene: &Scene,
        slots: Option<&[i32]>,
        scale: Option<f32>,
    ) -> Result<GpuScene, Error> {
        let mut builder = ScratchLayout::builder();
        let boxes = MlaBoxes::add(&mut builder, "mla", &scene.plan)?;
        let layout = builder.build();
        let tasks = scene.plan.tasks(&boxes, scene.plan.rows);
        let sms = dev.info().multiprocessors;
        let placement = deal(tasks, kernel.max_resident()?.min(sms));
        check_standalone(
            &placement,
            &scene.plan,
            &boxes,
            Limits {
                max_resident: kernel.max_resident()?,
                scratch_boxes: layout.boxes(),
            },
        )?;
        let table = DeviceTable::upload_unchecked(dev, &placement)?;
        let empty = DeviceTable::upload_unchecked(
            dev,
            &mailbox::placement::Placement::new(vec![Vec::new(); placement.ctas() as usize]),
        )?;
        let orders = scene.plan.rows as usize + tasks_len(&scene.plan);
        let scratch = dev.alloc_zeroed::<u64>(layout.boxes() as usize)?;
        let epoch = dev.alloc_zeroed::<u32>(1)?;
        let diag = dev.alloc_zeroed::<u32>(mailbox::DIAG_WORDS)?;
        let q_abs = dev.upload(&scene.q_abs)?;
        let q_pe = dev.upload(&scene.q_pe)?;
        let new_latent = dev.upload(&scene.new_latent)?;
        let new_rope = dev.upload(&scene.new_rope)?;
        let new_slots = dev.upload(&scene.new_slots)?;
        let cache = dev.upload(&scene.cache_before)?;
        let parts = scene.plan.partial_queries().max(1);
        let part_o = dev.alloc_zeroed::<f32>(parts * scene.shape.cache.latent)?;
        let part_ml = dev.alloc_zeroed::<f32>(parts * 2)?;
        let out = dev.alloc_zeroed::<u16>(scene.expected.len())?;
        let slots = dev.upload(slots.unwrap_or(&scene.slots))?;
        let args = MlaArgs::new(
            &scene.shape,
            &scene.plan,
            &boxes,
            &MlaBuffers {
                q_abs: &q_abs,
                q_pe: &q_pe,
                new_latent: &new_latent,
                new_rope: &new_rope,
                new_slots: &new_slots,
                cache: &cache,
                part_o: &part_o,
                part_ml: &part_ml,
                out: &out,
            },
            scale.unwrap_or(scene.scale),
        )?;
        Ok(GpuScene {
            kernel,
            boxes,
            table,
            empty,
            trace: None,
            scratch,
            epoch,
            diag,
            slots,
            cache,
            out,
            args,
            tags: Tags::new(1)?,
            epoch_node: EpochNode::build(dev, Variant::default())?,
            orders,
            _inputs: vec![q_abs, q_pe, new_latent, new_rope],
            _new_slots: new_slots,
            _parts: (part_o, part_ml),
        })
    }

    /// Gives the tasks a trace buffer (the kernel must be a trace build to fill it).
    pub fn traced(mut self, dev: &Device) -> Result<GpuScene, Error> {
        let words = self.orders * mla::trace::WORDS_PER_TASK;
        let trace = dev.alloc_zeroed::<u64>(words)?;
        self.args.trace = trace.device_ptr();
        self.trace = Some(trace);
        Ok(self)
    }

    /// Enqueues one step: the epoch's advance, the slots' publication, then what `attend` says.
    pub fn enqueue(&self, stream: &Stream, topk: u32, attend: Attend) -> Result<(), Error> {
        self.epoch_node
            .enqueue(stream, &self.epoch, &self.scratch, self.tags)?;
        self.kernel.publish_slots(
            stream,
            &self.slots,
            topk,
            &self.boxes,
            &self.scratch,
            &self.epoch,
            self.tags,
            0,
        )?;
        if attend != Attend::No {
            let table = match attend {
                Attend::Empty => &self.empty,
                _ => &self.table,
            };
            let l = LaunchTable::new(table, &self.scratch, &self.epoch, &self.diag, self.tags, 0)?;
            self.kernel.launch(stream, &l, &self.args)?;
        }
        Ok(())
    }

    /// A graph of one step.
    pub fn graph(&self, stream: &Stream, topk: u32, attend: Attend) -> Result<Graph, Error> {
        stream.begin_capture()?;
        self.enqueue(stream, topk, attend)?;
        Ok(stream.end_capture()?)
    }
}

fn tasks_len(plan: &AttendPlan) -> usize {
    (plan.groups.len() + plan.splits() as usize + plan.combines() as usize).max(1)
}

/// Builds the kernel of `shape` (debug polls bounded, so a wrong wait reports instead of hanging;
/// `trace`: a trace build).
pub fn kernel(
    dev: &Device,
    shape: AttendShape,
    debug: bool,
    trace: bool,
) -> Result<MlaKernel, Error> {
    let variant = if debug {
        Variant {
            debug: Some(mailbox::gpu::DebugBound {
                poll_limit: 1 << 26,
                trap: false,
            }),
            ..Variant::default()
        }
    } else {
        Variant::default()
    };
    Ok(MlaKernel::build(dev, shape, CTA_THREADS, variant, trace)?)
}
