//! Host side of the MLA kernels: sources and build defines, the stage's arguments (`mla_args`),
//! the standalone task-list launch and the stand-in that publishes selected slots for it.

use device::{Args, Buffer, Device, Kernel, KernelSource, Launch, Module, Stream};
use mailbox::gpu::{LaunchTable, Variant};
use mailbox::layout::Tags;
use mailbox::placement::{Limits, Placement, PlacementError};
use mailbox::task::Task;
use model::CacheFormat;

use crate::error::{invalid, Result};
use crate::layout::{AttendPlan, AttendShape, MlaBoxes};

/// `#include "mla_attn.h"` and the headers it includes: every fused kernel that runs MLA tasks
/// registers these.
pub const HEADERS: [(&str, &str); 4] = [
    ("mla_tasks.h", include_str!("../kernels/mla_tasks.h")),
    ("mla_attn.h", include_str!("../kernels/mla_attn.h")),
    ("mla_rows.h", include_str!("../kernels/mla_rows.h")),
    ("mla_tile.h", include_str!("../kernels/mla_tile.h")),
];
/// The standalone entry points: `mla_tasks` and `mla_publish_slots`.
pub const MLA_HIP: (&str, &str) = ("mla.hip", include_str!("../kernels/mla.hip"));

/// The fused launch's CTA on sm_90a: 512 threads (four warpgroups).
pub const CTA_THREADS: u32 = 512;
/// Threads of a block of the slot stand-in.
const PUBLISH_BLOCK: u32 = 256;

/// The kernel source at `shape` for CTAs of `threads`, with `variant`'s mailbox choices.
pub fn source(shape: &AttendShape, threads: u32, variant: Variant) -> KernelSource {
    traced_source(shape, threads, variant, false)
}

/// [`source`], and with `trace` a build whose tasks stamp their phases into [`MlaArgs::trace`]
/// (`MLA_TRACE`; [`crate::trace`] reads them).
pub fn traced_source(
    shape: &AttendShape,
    threads: u32,
    variant: Variant,
    trace: bool,
) -> KernelSource {
    let mut src = mailbox::gpu::source(MLA_HIP);
    for (name, text) in HEADERS {
        src = src.header(name, text);
    }
    variant
        .apply(src)
        .define("MONO_CTA_THREADS", threads)
        .define("MLA_HEADS", shape.heads)
        .define("MLA_LATENT", shape.cache.latent)
        .define("MLA_ROPE", shape.cache.rope)
        .define("MLA_FP8", (shape.cache.format == CacheFormat::Fp8) as u32)
        .define("MLA_UNION", shape.union)
        .define("MLA_SMEM_BYTES", shape.lds_bytes())
        .define("MLA_TRACE", trace as u32)
        .define("MLA_ROPE_INTERLEAVED", 1)
}

/// What the fused kernel's generator takes from this stage for a build of `shape`: the headers,
/// `mla_args`, `mla_decode` and the shape defines of [`source`] with the rope style
/// `interleaved` (the config's `rope_interleave`); the launch sets the CTA's threads, its shared
/// memory (`MLA_SMEM_BYTES`, at least [`AttendShape::lds_bytes`]) and the mailbox's variant.
pub fn stage_kernel(
    shape: &AttendShape,
    interleaved: bool,
    smem_bytes: u32,
) -> mailbox::StageKernel {
    let mut defines: std::collections::BTreeMap<String, String> =
        source(shape, CTA_THREADS, Variant::default())
            .defines()
            .iter()
            .filter(|(name, _)| name.as_str() != "MONO_CTA_THREADS" && !name.starts_with("MBX_"))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
    defines.insert(
        "MLA_ROPE_INTERLEAVED".into(),
        u32::from(interleaved).to_string(),
    );
    defines.insert("MLA_SMEM_BYTES".into(), smem_bytes.to_string());
    mailbox::StageKernel {
        stage: mailbox::Stage::Mla,
        include: "mla_tasks.h",
        headers: HEADERS.to_vec(),
        args_type: "mla_args",
        decoder: "mla_decode",
        defines,
    }
}

/// The production build for the kernel table: GLM-5 at a TP8 rank (8 heads), FP8 records.
pub fn sources() -> Vec<KernelSource> {
    let cfg = match model::ModelConfig::preset("glm-5") {
        Ok(cfg) => cfg,
        Err(_) => return Vec::new(),
    };
    let shape = crate::layout::CacheLayout::new(&cfg, CacheFormat::Fp8)
        .and_then(|cache| AttendShape::new(cache, 8, 128));
    match shape {
        Ok(shape) => vec![source(&shape, CTA_THREADS, Variant::default())],
        Err(_) => Vec::new(),
    }
}

/// `struct mla_args` of `kernels/mla_attn.h`, passed by value: device addresses and sizes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MlaArgs {
    /// `[rows][heads][latent]` bf16: q_nope through W_UK.
    pub q_abs: u64,
    /// `[rows][heads][rope]` bf16, roped.
    pub q_pe: u64,
    /// `[rows][latent]` bf16: each row's new normed latent.
    pub new_latent: u64,
    /// `[rows][rope]` bf16: each row's new roped key.
    pub new_rope: u64,
    /// `[rows]` u32: the record each row's new token goes to.
    pub new_slots: u64,
    /// Records of `CacheLayout::bytes_per_token` bytes.
    pub cache: u64,
    /// `[rows][max_splits][heads][latent]` f32.
    pub part_o: u64,
    /// `[rows][max_splits][heads][2]` f32.
    pub part_ml: u64,
    /// `[rows][heads][latent]` bf16: the attention output in latent space (before W_UV).
    pub out: u64,
    pub scale: f32,
    /// Boxes from one row's selected slots to the next ([`MlaBoxes::slots`]'s stride).
    pub slot_stride: u32,
    pub max_splits: u32,
    pub pad: u32,
    /// A trace build's marks, [`crate::trace::WORDS_PER_TASK`] words a task by global order (0:
    /// none).
    pub trace: u64,
    /// The attention half's row tasks (zero where a launch runs the attention alone).
    pub half: MlaHalfArgs,
}

/// The attention half's fields of `mla_args` (`kernels/mla_rows.h`'s norm and rope tasks):
/// device addresses of bf16 rows and weights, and the widths and eps they use.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MlaHalfArgs {
    /// `[rows][hidden_dim]`: the layer's input rows.
    pub hidden: u64,
    /// `[rows][hidden_dim]`: RMSNorm_in of them.
    pub hidden_normed: u64,
    /// `[hidden_dim]` bf16.
    pub hidden_norm: u64,
    /// `[rows][q_lora]`: q_a's output.
    pub q_a: u64,
    /// `[rows][q_lora]`: RMSNorm_qa of it.
    pub q_latent: u64,
    /// `[q_lora]` bf16.
    pub q_a_norm: u64,
    /// `[rows][latent + rope]`: kv_a's output.
    pub kv_a: u64,
    /// `[latent]` bf16.
    pub kv_a_norm: u64,
    /// `[rows][heads][nope + rope]`: q_b's output.
    pub q: u64,
    /// `[rows]` u32 positions.
    pub positions: u64,
    /// `[rope / 2]` f64 rope frequencies.
    pub inv_freq: u64,
    /// `[rows][topk]` i32 selected slots in plain memory, for [`crate::layout::MlaKind::Slots`].
    pub slot_lists: u64,
    pub hidden_dim: u32,
    pub q_lora: u32,
    pub nope: u32,
    pub hidden_eps: f32,
    pub latent_eps: f32,
    /// Entries of a row's slot list.
    pub topk: u32,
}

/// The device buffers a launch's [`MlaArgs`] point at.
pub struct MlaBuffers<'a> {
    pub q_abs: &'a Buffer<u16>,
    pub q_pe: &'a Buffer<u16>,
    pub new_latent: &'a Buffer<u16>,
    pub new_rope: &'a Buffer<u16>,
    pub new_slots: &'a Buffer<u32>,
    pub cache: &'a Buffer<u8>,
    pub part_o: &'a Buffer<f32>,
    pub part_ml: &'a Buffer<f32>,
    pub out: &'a Buffer<u16>,
}

impl MlaArgs {
    /// Checks every buffer's size against the plan and shape.
    pub fn new(
        shape: &AttendShape,
        plan: &AttendPlan,
        boxes: &MlaBoxes,
        b: &MlaBuffers,
        scale: f32,
    ) -> Result<Self> {
        let (rows, heads) = (plan.rows as usize, shape.heads);
        let (latent, rope) = (shape.cache.latent, shape.cache.rope);
        let parts = plan.partial_queries();
        for (what, have, need) in [
            ("q_abs", b.q_abs.len(), rows * heads * latent),
            ("q_pe", b.q_pe.len(), rows * heads * rope),
            ("new_latent", b.new_latent.len(), rows * latent),
            ("new_rope", b.new_rope.len(), rows * rope),
            ("new_slots", b.new_slots.len(), rows),
            ("part_o", b.part_o.len(), parts * latent),
            ("part_ml", b.part_ml.len(), parts * 2),
            ("out", b.out.len(), rows * heads * latent),
        ] {
            if have < need {
                return Err(invalid(
                    "MLA arguments",
                    format!("{what} holds {have} values, the plan needs {need}"),
                ));
            }
        }
        if b.cache.len() % shape.cache.bytes_per_token() != 0 {
            return Err(invalid(
                "MLA arguments",
                format!(
                    "a cache of {} bytes is not whole {}-byte records",
                    b.cache.len(),
                    shape.cache.bytes_per_token()
                ),
            ));
        }
        Ok(MlaArgs {
            q_abs: b.q_abs.device_ptr(),
            q_pe: b.q_pe.device_ptr(),
            new_latent: b.new_latent.device_ptr(),
            new_rope: b.new_rope.device_ptr(),
            new_slots: b.new_slots.device_ptr(),
            cache: b.cache.device_ptr(),
            part_o: b.part_o.device_ptr(),
            part_ml: b.part_ml.device_ptr(),
            out: b.out.device_ptr(),
            scale,
            slot_stride: boxes.slots.stride(),
            max_splits: plan.max_splits(),
            pad: 0,
            trace: 0,
            half: MlaHalfArgs::default(),
        })
    }
}

/// The standalone MLA kernels at one shape.
pub struct MlaKernel {
    // Declared before the module: a kernel must not outlive its module.
    tasks: Kernel,
    publish: Kernel,
    _module: Module,
    shape: AttendShape,
    threads: u32,
}

impl MlaKernel {
    /// With `trace`, the tasks stamp their phases ([`traced_source`]).
    pub fn build(
        dev: &Device,
        shape: AttendShape,
        threads: u32,
        variant: Variant,
        trace: bool,
    ) -> Result<Self> {
        let module = dev
            .build(&traced_source(&shape, threads, variant, trace))
            .map_err(|e| invalid("MLA kernel build", e.to_string()))?;
        let kernel = |name: &str| {
            module
                .kernel(name)
                .map_err(|e| invalid("MLA kernel", e.to_string()))
        };
        Ok(MlaKernel {
            tasks: kernel("mla_tasks")?,
            publish: kernel("mla_publish_slots")?,
            shape,
            threads,
            _module: module,
        })
    }

    /// The largest grid of `mla_tasks` whose CTAs are all resident at once.
    pub fn max_resident(&self) -> Result<u32> {
        self.tasks
            .max_coresident_grid(self.threads, self.shape.lds_bytes() as u32)
            .map_err(|e| invalid("MLA occupancy", e.to_string()))
    }

    /// One launch of the task list `table` (every CTA resident: check with [`check_standalone`]).
    pub fn launch(&self, stream: &Stream, table: &LaunchTable, args: &MlaArgs) -> Result<()> {
        let launch = Launch::new(table.n_ctas, self.threads).shared(self.shape.lds_bytes() as u32);
        stream
            .launch(&self.tasks, launch, &Args::new().value(table).value(args))
            .map_err(|e| invalid("MLA launch", e.to_string()))
    }

    /// Publishes `slots` (`[rows][topk]`) as the tagged pairs of `boxes.slots` for launch
    /// `launch_index` of a step of `tags`, as select would (a stand-in for tests and benchmarks).
    #[allow(clippy::too_many_arguments)]
    pub fn publish_slots(
        &self,
        stream: &Stream,
        slots: &Buffer<i32>,
        topk: u32,
        boxes: &MlaBoxes,
        scratch: &Buffer<u64>,
        epoch: &Buffer<u32>,
        tags: Tags,
        launch_index: u32,
    ) -> Result<()> {
        let n = slots.len() as u32;
        let first = boxes.slots.offset();
        let args = Args::new()
            .buf(slots)
            .u32(n)
            .u32(topk)
            .buf(scratch)
            .u32(first)
            .u32(boxes.slots.stride())
            .buf(epoch)
            .u32(tags.launches_per_step())
            .u32(launch_index);
        let grid = n.div_ceil(PUBLISH_BLOCK).max(1);
        stream
            .launch(&self.publish, Launch::new(grid, PUBLISH_BLOCK), &args)
            .map_err(|e| invalid("MLA slot publish", e.to_string()))
    }
}

/// Checks a standalone placement whose MLA tasks start at global order `plan.rows`: the slots
/// come from a launch before it (select, or [`MlaKernel::publish_slots`]), so the check sees
/// them written by stand-in tasks of orders `0..rows` on CTA 0, ahead of every MLA task.
pub fn check_standalone(
    placement: &Placement,
    plan: &AttendPlan,
    boxes: &MlaBoxes,
    limits: Limits,
) -> std::result::Result<(), PlacementError> {
    let mut lists = placement.lists().to_vec();
    let stand_ins: Vec<Task> = (0..plan.rows)
        .map(|row| {
            let out = boxes.slots.slot(row).expect("a slot list a row");
            Task::new(0, row, out, &[], [0; 3]).expect("no inputs")
        })
        .collect();
    if let Some(first) = lists.first_mut() {
        first.splice(0..0, stand_ins);
    }
    Placement::new(lists).validate(limits)
}
