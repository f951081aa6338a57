//! One launch of the step on a device: the fused kernel of its kind ([`LayerKernel`], built once
//! per kind and shared by every launch of that kind) and one planned launch bound to its weights,
//! caches and the step's arena ([`LayerLaunch`], a [`StepLaunch`]).
//!
//! Binding fills each stage's arguments from the parts' plans (`fused::layer::LayerPlan`): the
//! launch's matrix list by the parts' own `matrices` / `bind`, the expert banks and `moe_args`
//! ([`super::moe`]), `idx_args` and `sel_args` ([`super::front`]), `mla_args`, and the head
//! stage's descriptors; then checks every named matrix of the plan (`LayerPlan::matrices`) against
//! the address bound for it, so a part that bound the wrong tensor is refused before anything runs.

use device::{Args, Buffer, Device, Kernel, KernelSource, Launch, Module, Stream};
use head::gpu::HeadArgs;
use indexer::gpu::KernelConfig;
use indexer::reference::{IndexerDims, IndexerOptions};
use linear::gpu::{LinArgs, LinExpert, LinMatrix};
use mailbox::gpu::{DeviceTable, LaunchTable, Variant};
use mailbox::{Stage, Stall, DIAG_WORDS};
use model::traffic::{launch_traffic, Formats, LaunchKind, LaunchTraffic, Load};
use model::{ModelConfig, RankShapes};
use moe::reference::Routing;
use select::gpu::FLAG_NAMES;

use super::caches::StepCaches;
use super::front::{bind_front, FrontAt, FrontBinding};
use super::moe::{bind_moe, MoeRows};
use super::weights::{LayerWeights, MlpWeights, ModelWeights};
use crate::fused::head::HeadDescriptors;
use crate::fused::layer::{
    layer_source, IndexWeights, LaunchAt, LayerBuild, LayerPlan, MatrixSource,
};
use crate::fused::{ArenaSlice, CtaShape, FusedKernel};
use crate::step::graph::{ChosenFloor, DeviceBytes, LaunchRecords, LaunchSlot, Output, StepLaunch};
use crate::step::{Result, StepError};

fn invalid(reason: impl Into<String>) -> StepError {
    StepError::Invalid(reason.into())
}

/// The fused CTA shape of `dev` (the host backend runs the production shape on CPU threads).
pub fn cta_shape(dev: &Device) -> Result<CtaShape> {
    Ok(CtaShape::of_device(dev, "the step's fused kernels")?)
}

/// The fused kernel of one launch kind.
pub struct LayerKernel {
    // Declared before the module: a kernel must not outlive its module.
    kernel: Kernel,
    _module: Module,
    pub kind: LaunchKind,
    pub shape: CtaShape,
    pub ctas: u32,
    variant: Variant,
    /// Built to record every task's start and end (`mailbox::trace::traced`).
    pub traced: bool,
    /// Built to record the milestones of every linear tile too (`LIN_STAMPS`): a record of
    /// `linear::gpu::STAMP_WORDS` words a box of the launch, at an address built into the kernel,
    /// so each launch of the kind overwrites the one before.
    tile_stamps: Option<TileStamps>,
}

/// The linear tiles' milestone records of a kernel's launches, and how many boxes they cover.
struct TileStamps {
    words: Buffer<u64>,
    boxes: u32,
}

impl LayerKernel {
    /// Builds the kernel of `kind` for `cfg` on `build` and checks that one CTA of the fused
    /// shape is resident on every SM at once.
    pub fn build(
        dev: &Device,
        cfg: &ModelConfig,
        build: &LayerBuild,
        kind: LaunchKind,
        variant: Variant,
    ) -> Result<Self> {
        let source = Self::source(dev, cfg, build, kind, variant, false)?;
        Self::from_source(dev, build, kind, variant, source, false, None)
    }

    /// The same kernel recording every task's start and end into its launch's trace buffer
    /// (`mono trace`; the stamps cost time, so nothing else runs it), and with `tile_boxes`, the
    /// milestones of every linear tile of launches of up to that many boxes
    /// ([`LayerKernel::take_tile_stamps`]).
    pub fn build_traced(
        dev: &Device,
        cfg: &ModelConfig,
        build: &LayerBuild,
        kind: LaunchKind,
        variant: Variant,
        tile_boxes: Option<u32>,
    ) -> Result<Self> {
        let source = Self::source(dev, cfg, build, kind, variant, true)?;
        Self::from_source(dev, build, kind, variant, source, true, tile_boxes)
    }

    /// The kernel's source for `kind`, with task records when `traced` (without the tiles'
    /// milestone buffer, which [`LayerKernel::build_traced`] adds).
    pub fn source(
        dev: &Device,
        cfg: &ModelConfig,
        build: &LayerBuild,
        kind: LaunchKind,
        variant: Variant,
        traced: bool,
    ) -> Result<KernelSource> {
        let source = layer_source(cfg, build, cta_shape(dev)?, kind, variant)
            .map_err(|e| invalid(format!("{} launch: {e}", kind.name())))?;
        Ok(if traced {
            mailbox::trace::traced(source)
        } else {
            source
        })
    }

    /// The kernel of `kind` from its [`LayerKernel::source`] and whether that was traced, with
    /// `tile_boxes` the milestones of its linear tiles too.
    pub fn from_source(
        dev: &Device,
        build: &LayerBuild,
        kind: LaunchKind,
        variant: Variant,
        source: KernelSource,
        traced: bool,
        tile_boxes: Option<u32>,
    ) -> Result<Self> {
        let shape = cta_shape(dev)?;
        let tile_stamps = match tile_boxes {
            Some(boxes) => Some(TileStamps {
                words: dev.alloc_zeroed((boxes.max(1) as usize) * linear::gpu::STAMP_WORDS)?,
                boxes,
            }),
            None => None,
        };
        let source = match &tile_stamps {
            Some(t) => source
                .define("LIN_STAMPS", 1)
                .define("LIN_STAMP_BUF", t.words.device_ptr()),
            None => source,
        };
        let ctas = build.ctas;
        let FusedKernel {
            kernel,
            module,
            shape,
        } = FusedKernel::build(dev, kind.name(), &source, shape, 0, ctas)?;
        Ok(LayerKernel {
            kernel,
            _module: module,
            kind,
            shape,
            ctas,
            variant,
            traced,
            tile_stamps,
        })
    }

    /// The linear tiles' milestone records of the kernel's last launch (`linear::gpu::STAMP_WORDS`
    /// words a box, zero where no tile wrote), then cleared; None for a kernel built without them.
    pub fn take_tile_stamps(&self) -> Result<Option<Vec<u64>>> {
        let Some(t) = &self.tile_stamps else {
            return Ok(None);
        };
        let words = t.words.download()?;
        t.words.write(&vec![0u64; words.len()])?;
        Ok(Some(words))
    }
}

/// A slice of the step's arena, read back for digests.
pub struct ArenaView<'a> {
    pub arena: &'a Buffer<u8>,
    pub slice: ArenaSlice,
}

impl DeviceBytes for ArenaView<'_> {
    fn bytes(&self) -> Result<Vec<u8>, device::DeviceError> {
        let s = self.slice;
        self.arena
            .download_range(s.offset as usize..(s.offset + s.bytes) as usize)
    }
}

/// A device-to-device copy a launch makes before or after its kernel (the step's inputs into the
/// arena, the picked tokens out to the feed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy {
    pub dst: u64,
    pub src: u64,
    pub bytes: usize,
}

/// What a launch is built from besides its plan.
pub struct LaunchParts<'a> {
    pub cfg: &'a ModelConfig,
    pub build: &'a LayerBuild,
    pub weights: &'a ModelWeights,
    pub caches: &'a StepCaches,
    /// The step's one activation arena (at least the plan's `launch.arena.bytes`).
    pub arena: &'a Buffer<u8>,
    /// The softmax scale of the attention (`None`: the model's, 1/sqrt(qk_head_dim)).
    pub scale: Option<f32>,
}

/// One launch of the step, bound.
pub struct LayerLaunch<'a> {
    name: String,
    kernel: &'a LayerKernel,
    pub plan: LayerPlan,
    arena: &'a Buffer<u8>,
    table: DeviceTable,
    slot: LaunchSlot,
    diag: Buffer<u32>,
    _mats: Buffer<LinMatrix>,
    _banks: Buffer<LinExpert>,
    _head_lists: [Buffer<u8>; 4],
    _front: Option<FrontBinding>,
    /// The kernel's arguments after `mbx_launch`, in stage order.
    stage_args: Vec<StageArg>,
    /// What the launch writes, for digests.
    views: Vec<(String, ArenaView<'a>)>,
    before: Vec<Copy>,
    after: Vec<Copy>,
    /// What the launch must move, the routed experts counted for as many as its rows may touch.
    traffic: Option<LaunchTraffic>,
    /// Select's flags, `[rows][FLAG_NAMES]` (full layers).
    flags: Option<Buffer<u32>>,
    /// The task records of a traced kernel's launch.
    trace: Option<Buffer<u64>>,
}

fn upload_list<T: bytemuck::Pod + Default>(dev: &Device, list: &[T]) -> Result<Buffer<T>> {
    // A list nobody uses still gets a valid address.
    if list.is_empty() {
        return Ok(dev.upload(&[T::default()])?);
    }
    Ok(dev.upload(list)?)
}

/// One stage's kernel argument.
#[derive(Clone, Copy, Debug)]
enum StageArg {
    Indexer(indexer::gpu::StageArgs),
    Select(select::gpu::SelArgs),
    Mla(mla::gpu::MlaArgs),
    Linear(LinArgs),
    Moe(moe::memory::MoeArgs),
    Head(HeadArgs),
}

impl StageArg {
    fn push(&self, args: Args) -> Args {
        match self {
            StageArg::Indexer(a) => args.value(a),
            StageArg::Select(a) => args.value(a),
            StageArg::Mla(a) => args.value(a),
            StageArg::Linear(a) => args.value(a),
            StageArg::Moe(a) => args.value(a),
            StageArg::Head(a) => args.value(a),
        }
    }
}

impl<'a> LayerLaunch<'a> {
    /// Binds `plan` (launch `slot.launch_index` of the step) on `kernel`; `before` and `after`
    /// are copies it makes around its kernel.
    pub fn new(
        dev: &Device,
        kernel: &'a LayerKernel,
        plan: LayerPlan,
        parts: &LaunchParts<'a>,
        slot: LaunchSlot,
        before: Vec<Copy>,
        after: Vec<Copy>,
    ) -> Result<Self> {
        let LaunchParts {
            cfg,
            build,
            weights,
            caches,
            arena: arena_buf,
            scale,
        } = *parts;
        let name = match plan.at {
            LaunchAt::Layer(i) => format!("layer {i} ({})", plan.kind.name()),
            LaunchAt::Tail => "tail".to_owned(),
        };
        if plan.kind != kernel.kind {
            return Err(invalid(format!(
                "{name}: a {} launch on the {} kernel",
                plan.kind.name(),
                kernel.kind.name()
            )));
        }
        if let Some(t) = &kernel.tile_stamps {
            if plan.launch.layout.boxes() > t.boxes {
                return Err(invalid(format!(
                    "{name}: {} boxes; the kernel's tile stamps hold {}",
                    plan.launch.layout.boxes(),
                    t.boxes
                )));
            }
        }
        if plan.launch.placement.placement().ctas() != kernel.ctas {
            return Err(invalid(format!(
                "{name}: planned for {} CTAs; the kernel runs {}",
                plan.launch.placement.placement().ctas(),
                kernel.ctas
            )));
        }
        if (arena_buf.len() as u64) < plan.launch.arena.bytes {
            return Err(invalid(format!(
                "{name}: the launch's arena takes {} bytes; the step's holds {}",
                plan.launch.arena.bytes,
                arena_buf.len()
            )));
        }
        if slot.scratch.len() < plan.launch.layout.boxes() as usize {
            return Err(invalid(format!(
                "{name}: the launch's boxes take {} words of scratch; the step has {}",
                plan.launch.layout.boxes(),
                slot.scratch.len()
            )));
        }
        let need = lds_bytes(cfg, &plan, kernel.shape.threads)?;
        if need > kernel.shape.shared_bytes {
            return Err(invalid(format!(
                "{name}: the tasks take {need} bytes of shared memory; a CTA gets {}",
                kernel.shape.shared_bytes
            )));
        }
        let arena = arena_buf.device_ptr();
        let mut mats = vec![LinMatrix::default(); plan.launch.matrices as usize];
        let mut banks: Vec<LinExpert> = Vec::new();
        let mut d = HeadDescriptors::new(&plan.head_lists);
        let mut mla = None;
        let mut moe_args = None;
        let mut front = None;
        // Select's flags in a buffer of the launch's own (not the shared arena, which later
        // launches overwrite before a step's checks read them).
        let flags_buf: Option<Buffer<u32>> = match &plan.index {
            Some(_) => Some(dev.alloc_zeroed(plan.rows as usize * FLAG_NAMES.len())?),
            None => None,
        };
        let layer: Option<&LayerWeights> = match plan.at {
            LaunchAt::Layer(i) => Some(weights.layer(i)?),
            LaunchAt::Tail => None,
        };
        if let Some(embed) = &plan.embed {
            let tokens = arena + plan.slices.tokens.offset;
            embed.bind(arena, weights.embedding, weights.vocab, tokens, &mut d);
        }
        if let (Some(half), Some(lw)) = (&plan.attention, layer) {
            let cache = caches.layer(lw.plan.index)?;
            let s = scale.unwrap_or(half.model_scale());
            mla = Some(half.mla_args(arena, cache.mla.device_ptr(), &lw.attention, s));
            let half_mats = half
                .matrices(arena, &lw.attention)
                .map_err(|e| invalid(format!("{name}: {e}")))?;
            for (i, m) in half_mats.into_iter().enumerate() {
                mats[half.first_matrix as usize + i] = m;
            }
        }
        if let (Some(ix), Some(lw)) = (&plan.index, layer) {
            let iw = lw.indexer.as_ref().ok_or_else(|| {
                invalid(format!(
                    "{name}: a full-indexer launch without indexer weights"
                ))
            })?;
            let w = IndexWeights {
                wq_b: iw.wq_b,
                wk: iw.wk,
                weights_proj: iw.weights_proj,
                q_a_norm: lw.attention.q_a_norm,
            };
            let ix_mats = ix
                .projections
                .matrices(arena, &w)
                .map_err(|e| invalid(format!("{name}: {e}")))?;
            for (i, m) in ix_mats {
                mats[i as usize] = m;
            }
            let cache = caches.layer(lw.plan.index)?;
            let keys = cache.index_keys.as_ref().ok_or_else(|| {
                invalid(format!(
                    "{name}: no index-key cache for a full-indexer layer"
                ))
            })?;
            let dims = IndexerDims::new(cfg).map_err(|e| invalid(e.to_string()))?;
            let p = &ix.projections;
            let at = FrontAt {
                key_proj: arena + p.key_proj.offset,
                query_proj: arena + p.query_proj.offset,
                gates: arena + p.gates.offset,
                norm_weight: iw.k_norm_weight,
                norm_bias: iw.k_norm_bias,
                inv_freq: arena + plan.slices.inv_freq.offset,
                positions: arena + plan.slices.positions.offset,
                cache: keys.device_ptr(),
                scores: arena + ix.scores.offset,
                lists: arena + plan.slices.slot_lists.offset,
                flags: flags_buf.as_ref().map_or(0, |f| f.device_ptr()),
            };
            front = Some(bind_front(dev, &ix.front, &dims, at)?);
        }
        if let (Some(dense), Some(lw)) = (&plan.dense, layer) {
            let MlpWeights::Dense(w) = &lw.mlp else {
                return Err(invalid(format!(
                    "{name}: a dense launch without dense weights"
                )));
            };
            dense.bind(arena, w, &mut mats, &mut d);
        }
        if let (Some(part), Some(lw)) = (&plan.moe, layer) {
            let MlpWeights::Moe(w) = &lw.mlp else {
                return Err(invalid(format!("{name}: a MoE launch without MoE weights")));
            };
            let Some(half) = &plan.attention else {
                return Err(invalid(format!("{name}: a MoE part without its inputs")));
            };
            let rows = MoeRows {
                h: half.out.data,
                norm: lw.post_norm,
                eps: cfg.rms_norm_eps as f32,
                out: plan.out.data,
            };
            let b = bind_moe(part, arena, rows, w, &Routing::new(cfg))?;
            for (i, m) in b.mats {
                mats[i as usize] = m;
            }
            banks = b.banks.to_vec();
            moe_args = Some(b.args);
        }
        if let Some(tail) = &plan.tail {
            tail.bind(arena, &weights.tail, &mut mats, &mut d);
        }
        check_names(&name, &plan, &mats, weights)?;
        if let Some(i) = mats.iter().position(|m| m.w == 0) {
            return Err(invalid(format!(
                "{name}: matrix {i} of the launch is not bound"
            )));
        }
        let mats_buf = upload_list(dev, &mats)?;
        let banks_buf = upload_list(dev, &banks)?;
        let bytes = |v: &[u8]| -> Result<Buffer<u8>> { upload_list(dev, v) };
        let head_lists = [
            bytes(bytemuck::cast_slice(&d.embeds))?,
            bytes(bytemuck::cast_slice(&d.norms))?,
            bytes(bytemuck::cast_slice(&d.argmaxes))?,
            bytes(bytemuck::cast_slice(&d.picks))?,
        ];
        let head = HeadArgs {
            embeds: head_lists[0].device_ptr(),
            norms: head_lists[1].device_ptr(),
            argmaxes: head_lists[2].device_ptr(),
            picks: head_lists[3].device_ptr(),
            n_embeds: d.embeds.len() as u32,
            n_norms: d.norms.len() as u32,
            n_argmaxes: d.argmaxes.len() as u32,
            n_picks: d.picks.len() as u32,
        };
        let lin = LinArgs {
            mats: mats_buf.device_ptr(),
            experts: banks_buf.device_ptr(),
            n_mats: mats.len() as u32,
            n_experts: banks.len() as u32,
        };
        let mut stage_args = Vec::new();
        for stage in &plan.stages {
            let missing = |what: &str| invalid(format!("{name}: the {what} stage has no part"));
            stage_args.push(match stage {
                Stage::Indexer => {
                    StageArg::Indexer(front.as_ref().ok_or_else(|| missing("indexer"))?.idx)
                }
                Stage::Select => {
                    StageArg::Select(front.as_ref().ok_or_else(|| missing("select"))?.sel)
                }
                Stage::Mla => StageArg::Mla(mla.ok_or_else(|| missing("MLA"))?),
                Stage::Linear => StageArg::Linear(lin),
                Stage::Moe => StageArg::Moe(moe_args.ok_or_else(|| missing("MoE"))?),
                Stage::Head => StageArg::Head(head),
                Stage::Synthetic => return Err(missing("synthetic")),
            });
        }
        let traffic = traffic(cfg, build, &plan);
        let view = |slice| ArenaView {
            arena: arena_buf,
            slice,
        };
        let mut views = vec![(
            if plan.tail.is_some() {
                "tokens"
            } else {
                "hidden"
            }
            .to_owned(),
            view(plan.out.data),
        )];
        if plan.index.is_some() {
            let lists = plan.slices.rows_of(plan.slices.slot_lists, plan.rows);
            views.push(("slot lists".to_owned(), view(lists)));
        }
        let table = DeviceTable::upload(dev, &plan.launch.placement)?;
        let trace = if kernel.traced {
            Some(table.trace_buffer(dev)?)
        } else {
            None
        };
        Ok(LayerLaunch {
            views,
            name,
            kernel,
            table,
            trace,
            diag: dev.alloc_zeroed(DIAG_WORDS)?,
            flags: flags_buf,
            plan,
            arena: arena_buf,
            slot,
            _mats: mats_buf,
            _banks: banks_buf,
            _head_lists: head_lists,
            _front: front,
            stage_args,
            before,
            after,
            traffic,
        })
    }
}

/// Every matrix the plan names by a whole tensor is bound at that tensor's address.
fn check_names(
    name: &str,
    plan: &LayerPlan,
    mats: &[LinMatrix],
    weights: &ModelWeights,
) -> Result<()> {
    for m in &plan.matrices {
        let MatrixSource::Tensor(tensor) = &m.source else {
            continue;
        };
        let want = weights.tensor_ptr(tensor)?;
        let bound = mats.get(m.index as usize).copied().unwrap_or_default();
        if bound.w != want {
            return Err(invalid(format!(
                "{name}: matrix {} is bound at {:#x}; {tensor} is at {want:#x}",
                m.index, bound.w
            )));
        }
        let fp8 = weights.tensor_fp8(tensor)?;
        if (bound.flags & linear::gpu::FLAG_FP8 != 0) != fp8 {
            return Err(invalid(format!(
                "{name}: matrix {} is read as {}; {tensor} is stored {}",
                m.index,
                if fp8 { "bf16" } else { "FP8" },
                if fp8 { "FP8" } else { "bf16" }
            )));
        }
    }
    Ok(())
}

/// Shared memory the launch's tasks take in CTAs of `threads`.
fn lds_bytes(cfg: &ModelConfig, plan: &LayerPlan, threads: u32) -> Result<u32> {
    let e = |e: &dyn std::fmt::Display| invalid(e.to_string());
    let mut need = 0;
    if let Some(h) = &plan.attention {
        need = need.max(h.lds_bytes(threads).map_err(|x| e(&x))?);
    }
    if let Some(d) = &plan.dense {
        need = need.max(d.lds_bytes(threads).map_err(|x| e(&x))?);
    }
    if let Some(t) = &plan.tail {
        need = need.max(t.lds_bytes(threads).map_err(|x| e(&x))?);
    }
    if let Some(m) = &plan.moe {
        need = need.max(moe::layout::lds_bytes(&m.shape, threads).map_err(|x| e(&x))?);
    }
    if let Some(ix) = &plan.index {
        let dims = IndexerDims::new(cfg).map_err(|x| e(&x))?;
        let config = KernelConfig::new(dims, &IndexerOptions::deepseek(cfg)).map_err(|x| e(&x))?;
        let select = select::gpu::Shape::production(ix.front.top).map_err(|x| e(&x))?;
        need = need.max(config.score_lds_bytes()).max(select.lds_bytes());
    }
    Ok(need)
}

/// What the launch must move: its kind's weights (the routed experts its rows may touch, at most)
/// and cache traffic (`model::traffic`).
fn traffic(cfg: &ModelConfig, build: &LayerBuild, plan: &LayerPlan) -> Option<LaunchTraffic> {
    let shapes = RankShapes::new(cfg, build.tp).ok()?;
    let requests = plan
        .index
        .as_ref()
        .map_or(1, |ix| ix.front.plan.requests.len().max(1)) as u64;
    let rows = u64::from(plan.rows);
    let context = plan
        .attention
        .as_ref()
        .and_then(|h| h.positions.iter().max())
        .map_or(0, |&p| u64::from(p) + 1);
    let load = Load {
        requests,
        rows_per_request: rows.div_ceil(requests),
        context,
    };
    let formats = Formats {
        weights: build.weights,
        cache: build.cache,
    };
    Some(launch_traffic(&shapes, plan.kind, formats, load))
}

/// Distinct experts in a `[rows, top_k]` list of the router's choices (entries past the expert
/// count are not choices).
fn distinct_experts(row_experts: &[u32], experts: u32) -> u32 {
    let mut chosen: Vec<u32> = row_experts
        .iter()
        .copied()
        .filter(|&e| e < experts)
        .collect();
    chosen.sort_unstable();
    chosen.dedup();
    chosen.len() as u32
}

impl LayerLaunch<'_> {
    /// The rows this launch hands on (the layer's output, or the tail's tokens).
    pub fn out(&self) -> ArenaView<'_> {
        ArenaView {
            arena: self.arena,
            slice: self.plan.out.data,
        }
    }
}

impl StepLaunch for LayerLaunch<'_> {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn kind(&self) -> String {
        self.plan.kind.name().to_owned()
    }

    fn enqueue(&self, stream: &Stream) -> Result<()> {
        for c in &self.before {
            stream.copy(c.dst, c.src, c.bytes)?;
        }
        // Select only raises its flags: they start each launch at zero.
        if let Some(flags) = &self.flags {
            stream.memset(flags.device_ptr(), 0, flags.bytes())?;
        }
        let table = LaunchTable::new(
            &self.table,
            &self.slot.scratch,
            &self.slot.epoch,
            &self.diag,
            self.slot.tags,
            self.slot.launch_index,
        )?;
        let table = match &self.trace {
            Some(trace) => table.with_trace(&self.table, trace)?,
            None => table,
        };
        let k = self.kernel;
        let launch = Launch::new(self.table.ctas, k.shape.threads)
            .shared(k.shape.shared_bytes)
            .cooperative();
        let mut args = Args::new().value(&table);
        for a in &self.stage_args {
            args = a.push(args);
        }
        stream.launch(&k.kernel, launch, &args)?;
        for c in &self.after {
            stream.copy(c.dst, c.src, c.bytes)?;
        }
        Ok(())
    }

    fn outputs(&self) -> Vec<Output<'_>> {
        self.views
            .iter()
            .map(|(name, view)| Output::new(name.clone(), view))
            .collect()
    }

    fn floor_bytes(&self) -> Option<u64> {
        self.traffic
            .map(|t| t.total_bytes())
            .filter(|&bytes| bytes > 0)
    }

    fn chosen_floor(&self) -> Result<Option<ChosenFloor>> {
        let (Some(moe), Some(traffic)) = (&self.plan.moe, self.traffic) else {
            return Ok(None);
        };
        let view = ArenaView {
            arena: self.arena,
            slice: moe.slices.row_experts,
        };
        let words: Vec<u32> = view
            .bytes()?
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
            .collect();
        let experts = distinct_experts(&words, moe.shape.experts as u32);
        let fixed = traffic.total_bytes() - traffic.weights.routed_experts;
        Ok(Some(ChosenFloor {
            bytes: fixed + u64::from(experts) * traffic.routed_expert_bytes,
            experts,
            most_experts: traffic.experts_touched as u32,
        }))
    }

    fn take_trace(&self) -> Result<Option<LaunchRecords>> {
        let Some(trace) = &self.trace else {
            return Ok(None);
        };
        let words = trace.download()?;
        // Cleared between runs (not in the launch, which would put a memset between launches):
        // a record the next run's task never writes then reads as missing, not stale.
        trace.write(&vec![0u64; words.len()])?;
        let table = self.plan.launch.placement.placement().table();
        let names = crate::trace::names::TaskNames::new(&self.plan);
        Ok(Some(LaunchRecords {
            task_names: table.tasks.iter().map(|t| names.task(t)).collect(),
            table,
            words,
        }))
    }

    fn check(&self) -> Result<()> {
        let diag = self.diag.download()?;
        let limit = self
            .kernel
            .variant
            .debug
            .map_or(0, |d| u64::from(d.poll_limit));
        if let Some((stall, _)) = Stall::from_diag(&diag, limit) {
            return Err(invalid(format!("the fused launch stalled: {stall}")));
        }
        if let Some(flags) = &self.flags {
            let words = flags.download()?;
            if let Some(i) = words.iter().position(|&f| f != 0) {
                return Err(invalid(format!(
                    "select row {}: {}",
                    i / FLAG_NAMES.len(),
                    FLAG_NAMES[i % FLAG_NAMES.len()]
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::distinct_experts;

    #[test]
    fn distinct_experts_counts_each_choice_once() {
        assert_eq!(distinct_experts(&[3, 1, 3, 7, 1, 0], 8), 4);
        // An entry past the expert count is no choice.
        assert_eq!(distinct_experts(&[3, 8, u32::MAX, 3], 8), 1);
        assert_eq!(distinct_experts(&[], 8), 0);
    }
}
