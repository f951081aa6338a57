//! The synthetic weights of one rank made on the device (`kernels/synthetic_weights.hip`): one
//! arena allocated whole, then every tensor of the [`WeightPlan`] written in its form, with
//! progress reported as the bytes go.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use device::{Args, Buffer, Device, Kernel, KernelSource, Launch, Module};
use model::weights::packed::Pairing;
use model::weights::{Fp8Weight, SyntheticKind, SyntheticRule, WeightSource};

use super::plan::{DeviceTensor, Element, Form, Shard, WeightPlan};
use crate::step::{Result, StepError};

pub const SOURCE: (&str, &str) = (
    "synthetic_weights.hip",
    include_str!("../../../kernels/synthetic_weights.hip"),
);

/// A tensor's bytes and fp32 scales as the device holds them.
type Stored = (Vec<u8>, Vec<f32>);

/// Device memory left beside the weights for the context, caches and activations: a plan that
/// leaves less is refused before anything is allocated.
pub const RESERVE_BYTES: usize = 2 << 30;
const THREADS: u32 = 256;
/// Bytes generated between progress reports (each waits for the device).
const REPORT_EVERY: usize = 4 << 30;
/// Bytes loaded from a checkpoint between progress reports.
const LOAD_REPORT_EVERY: usize = 1 << 30;

/// `struct syn_source`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
struct SynSource {
    key: u64,
    full_cols: u64,
    row0: u32,
    col0: u32,
    kind: u32,
    factor: f32,
}

/// `struct syn_packed_args`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
struct SynPackedArgs {
    src: [SynSource; 2],
    block_scales: [u64; 2],
    out: u64,
    packed_scales: u64,
    n: u32,
    k: u32,
    gate_up: u32,
    fp8: u32,
}

const _: () = assert!(std::mem::size_of::<SynPackedArgs>() == 112);

impl SynSource {
    fn new(seed: u64, shard: &Shard) -> Self {
        let rule = SyntheticRule::new(seed, &shard.name, &shard.full_shape);
        SynSource {
            key: rule.key,
            full_cols: shard.full_cols() as u64,
            row0: shard.row0 as u32,
            col0: shard.col0 as u32,
            kind: match rule.kind {
                SyntheticKind::NormWeight => 1,
                SyntheticKind::Matrix => 0,
                SyntheticKind::NormBias | SyntheticKind::RouterBias => 2,
            },
            factor: rule.factor,
        }
    }
}

/// How far generation has come.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub tensors_done: usize,
    pub tensors: usize,
    pub bytes_done: usize,
    pub bytes: usize,
    pub elapsed: Duration,
}

/// The generator's kernels.
pub struct WeightKernels {
    // Declared before the module: a kernel must not outlive its module.
    block_scales: Kernel,
    row_major: Kernel,
    packed: Kernel,
    _module: Module,
}

/// The kernel source (for the build table).
pub fn source() -> KernelSource {
    KernelSource::new(SOURCE.0, SOURCE.1)
}

impl WeightKernels {
    pub fn build(dev: &Device) -> Result<Self> {
        let module = dev.build(&source())?;
        Ok(WeightKernels {
            block_scales: module.kernel("syn_block_scales")?,
            row_major: module.kernel("syn_row_major")?,
            packed: module.kernel("syn_packed")?,
            _module: module,
        })
    }
}

/// One rank's weights on the device.
pub struct DeviceWeights {
    pub plan: WeightPlan,
    pub seed: u64,
    pub arena: Buffer<u8>,
    origin: Origin,
}

/// Where a rank's values came from, for what the host makes from them after the upload (the
/// derived forms of `ModelWeights::bind`).
enum Origin {
    /// The synthetic rule of the weights' seed: any tensor's values are made again from it.
    Synthetic,
    /// A checkpoint: the stored values of the tensors [`Self::kept`] names, kept as loaded.
    Loaded(HashMap<String, Vec<Vec<f32>>>),
}

impl Origin {
    /// Whether a checkpoint's tensor `name` is kept on the host: those the derived forms read.
    fn kept(name: &str) -> bool {
        crate::step::layer::weights::FORM_SOURCES
            .iter()
            .any(|suffix| name.ends_with(suffix))
    }
}

impl DeviceWeights {
    /// Device address of `tensor`'s elements.
    pub fn ptr(&self, tensor: &DeviceTensor) -> u64 {
        self.arena.device_ptr() + tensor.offset as u64
    }

    /// Device address of `tensor`'s fp32 scales (0 when it has none).
    pub fn scales_ptr(&self, tensor: &DeviceTensor) -> u64 {
        tensor
            .scales
            .map_or(0, |(at, _)| self.arena.device_ptr() + at as u64)
    }

    /// The tensor named `name`, or an error naming it.
    pub fn tensor(&self, name: &str) -> Result<&DeviceTensor> {
        self.plan
            .get(name)
            .ok_or_else(|| StepError::Invalid(format!("no weight named {name} on this rank")))
    }

    /// The values a launch computes with for each source shard of `tensor` (FP8 ones as their
    /// codes times their block scales): made again by the synthetic rule of the weights' seed, or
    /// as kept when a checkpoint was loaded (the tensors the derived forms read; another is an
    /// error naming it).
    pub fn stored_values(&self, tensor: &DeviceTensor) -> Result<Vec<Vec<f32>>> {
        match &self.origin {
            Origin::Synthetic => super::check::stored_values(self.seed, tensor),
            Origin::Loaded(kept) => kept.get(&tensor.name).cloned().ok_or_else(|| {
                StepError::Invalid(format!(
                    "{}: its values were not kept when the checkpoint was loaded (only those \
                     of the tensors the derived forms read are)",
                    tensor.name
                ))
            }),
        }
    }

    /// The stored bytes and scales of `tensor`, read back.
    pub fn read(&self, tensor: &DeviceTensor) -> Result<(Vec<u8>, Vec<f32>)> {
        let bytes = self
            .arena
            .download_range(tensor.offset..tensor.offset + tensor.bytes)?;
        let scales = match tensor.scales {
            Some((at, len)) => self
                .arena
                .download_range(at..at + len * 4)?
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            None => Vec::new(),
        };
        Ok((bytes, scales))
    }

    /// `plan`'s weights for `seed` made on the host by the CPU's rule (`check::expected`) and
    /// uploaded: the same bytes [`Self::generate`] makes on the device, for a device whose
    /// kernels are slow to launch (the host backend) at a small preset.
    pub fn from_host(dev: &Device, plan: WeightPlan, seed: u64) -> Result<Self> {
        Self::upload_with(dev, plan, seed, &mut |tensor| {
            super::check::expected(seed, tensor)
        })
    }

    /// `plan`'s weights from `source` (a checkpoint), each tensor's shards cut from the whole
    /// tensor, quantised or packed on the host and uploaded. An FP8 tensor the checkpoint stores
    /// in FP8 keeps its codes and block scales as they are (a published checkpoint's scales are
    /// not powers of two: quantised again, its values would change). A bf16 tensor must hold
    /// bf16 values (the device keeps bf16); one that does not is refused by name. `seed` is
    /// recorded only: the values the derived forms are made from are kept from `source`.
    /// `progress` hears every GB and after the last tensor.
    pub fn from_source(
        dev: &Device,
        plan: WeightPlan,
        source: &dyn WeightSource,
        seed: u64,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<Self> {
        let mut kept = HashMap::new();
        let started = Instant::now();
        let mut state = Progress {
            tensors_done: 0,
            tensors: plan.tensors.len(),
            bytes_done: 0,
            bytes: plan.bytes,
            elapsed: Duration::ZERO,
        };
        let mut weights = Self::upload_with(dev, plan, seed, &mut |tensor| {
            let (values, quantised) = shards_of(source, tensor)?;
            let stored = super::check::stored_form_of(tensor, &values, &quantised)?;
            if Origin::kept(&tensor.name) {
                let computed_with = if quantised.is_empty() {
                    values
                } else {
                    quantised.iter().map(Fp8Weight::dequantise).collect()
                };
                kept.insert(tensor.name.clone(), computed_with);
            }
            let before = state.bytes_done;
            state.tensors_done += 1;
            state.bytes_done += tensor.bytes + tensor.scales.map_or(0, |(_, n)| 4 * n);
            state.elapsed = started.elapsed();
            if state.tensors_done == state.tensors
                || state.bytes_done / LOAD_REPORT_EVERY > before / LOAD_REPORT_EVERY
            {
                progress(&state);
            }
            Ok(stored)
        })?;
        weights.origin = Origin::Loaded(kept);
        Ok(weights)
    }

    /// Each tensor's stored form copied into the arena as it is made, so that the host holds one
    /// tensor at a time (a glm-5.2 TP8 rank is about 93 GB). An error drops the arena: nothing
    /// half-loaded is returned.
    fn upload_with(
        dev: &Device,
        plan: WeightPlan,
        seed: u64,
        stored: &mut dyn FnMut(&DeviceTensor) -> Result<Stored>,
    ) -> Result<Self> {
        let arena = alloc_arena(dev, &plan, 0)?;
        for tensor in &plan.tensors {
            let (data, scales) = stored(tensor)?;
            arena.write_range(tensor.offset, &data)?;
            if let Some((at, _)) = tensor.scales {
                arena.write_range(at, bytemuck::cast_slice(&scales))?;
            }
        }
        Ok(DeviceWeights {
            plan,
            seed,
            arena,
            origin: Origin::Synthetic,
        })
    }

    /// Generates `plan`'s weights for `seed`. Refuses a plan the device cannot hold (with
    /// [`RESERVE_BYTES`] to spare) before allocating anything; `progress` hears every few GB.
    pub fn generate(
        dev: &Device,
        kernels: &WeightKernels,
        plan: WeightPlan,
        seed: u64,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<Self> {
        let grid = plan.largest_scale_grid().max(1);
        let arena = alloc_arena(dev, &plan, 2 * grid * 4)?;
        let scratch = dev.alloc_zeroed::<f32>(2 * grid)?;
        let weights = DeviceWeights {
            plan,
            seed,
            arena,
            origin: Origin::Synthetic,
        };
        let started = Instant::now();
        let mut state = Progress {
            tensors_done: 0,
            tensors: weights.plan.tensors.len(),
            bytes_done: 0,
            bytes: weights.plan.bytes,
            elapsed: Duration::ZERO,
        };
        let mut since_report = 0;
        progress(&state);
        for tensor in &weights.plan.tensors {
            weights.write(dev, kernels, tensor, &scratch, grid)?;
            state.tensors_done += 1;
            state.bytes_done += tensor.bytes;
            since_report += tensor.bytes;
            if since_report >= REPORT_EVERY || state.tensors_done == state.tensors {
                dev.stream().sync()?;
                state.elapsed = started.elapsed();
                progress(&state);
                since_report = 0;
            }
        }
        dev.stream().sync()?;
        Ok(weights)
    }

    fn write(
        &self,
        dev: &Device,
        kernels: &WeightKernels,
        tensor: &DeviceTensor,
        scratch: &Buffer<f32>,
        grid: usize,
    ) -> Result<()> {
        let stream = dev.stream();
        let (rows, cols) = tensor.shape();
        let sources: Vec<SynSource> = tensor
            .sources
            .iter()
            .map(|s| SynSource::new(self.seed, s))
            .collect();
        let fp8 = tensor.element == Element::Fp8;
        let block_grid = rows.div_ceil(model::WEIGHT_BLOCK) * cols.div_ceil(model::WEIGHT_BLOCK);
        let spread = |items: u64| -> u32 {
            let most = dev.info().multiprocessors.max(1) * 16;
            (items.div_ceil(THREADS as u64).min(most as u64) as u32).max(1)
        };
        // FP8: each source's block scales first, into the arena (row-major) or the scratch.
        let mut scale_ptrs = [0u64; 2];
        if fp8 {
            for (s, src) in sources.iter().enumerate() {
                let at = match tensor.form {
                    Form::RowMajor => self.scales_ptr(tensor) + (s * block_grid * 4) as u64,
                    Form::Packed(_) => scratch.device_ptr() + (s * grid * 4) as u64,
                };
                scale_ptrs[s] = at;
                let args = Args::new()
                    .value(src)
                    .u32(rows as u32)
                    .u32(cols as u32)
                    .u64(at);
                stream.launch(
                    &kernels.block_scales,
                    Launch::new(block_grid as u32, THREADS),
                    &args,
                )?;
            }
        }
        match tensor.form {
            Form::RowMajor => {
                let format = match tensor.element {
                    Element::Bf16 => 0u32,
                    Element::F32 => 1,
                    Element::Fp8 => 2,
                };
                let per_source = (rows * cols * tensor.element.bytes()) as u64;
                for (s, src) in sources.iter().enumerate() {
                    let args = Args::new()
                        .value(src)
                        .u32(rows as u32)
                        .u32(cols as u32)
                        .u32(format)
                        .u64(scale_ptrs[s])
                        .u64(self.ptr(tensor) + s as u64 * per_source);
                    let launch = Launch::new(spread((rows * cols) as u64), THREADS);
                    stream.launch(&kernels.row_major, launch, &args)?;
                }
            }
            Form::Packed(layout) => {
                let mut src = [SynSource::default(); 2];
                src[..sources.len()].copy_from_slice(&sources);
                let args = SynPackedArgs {
                    src,
                    block_scales: scale_ptrs,
                    out: self.ptr(tensor),
                    packed_scales: self.scales_ptr(tensor),
                    n: layout.n as u32,
                    k: layout.k as u32,
                    gate_up: u32::from(layout.pairing == Pairing::GateUp),
                    fp8: u32::from(fp8),
                };
                let loads = (layout.bytes() / 16) as u64;
                let launch = Launch::new(spread(loads), THREADS);
                stream.launch(&kernels.packed, launch, &Args::new().value(&args))?;
            }
        }
        Ok(())
    }
}

/// `plan`'s arena, zeroed, refused before anything is allocated when the device cannot hold it
/// and `extra` bytes more with [`RESERVE_BYTES`] to spare.
fn alloc_arena(dev: &Device, plan: &WeightPlan, extra: usize) -> Result<Buffer<u8>> {
    let need = plan.bytes + extra;
    let total = dev.info().total_memory;
    let refused = |what: String| StepError::Memory {
        what,
        need,
        device: total,
        reserve: RESERVE_BYTES,
    };
    let what = format!("rank {} of TP {} weights", plan.rank, plan.tp);
    if need + RESERVE_BYTES > total {
        return Err(refused(what));
    }
    dev.alloc_zeroed::<u8>(plan.bytes.max(1))
        .map_err(|e| refused(format!("{what} ({e})")))
}

/// Shard `shard` of its tensor in `source`, row-major.
fn shard_of(source: &dyn WeightSource, shard: &Shard) -> Result<Vec<f32>> {
    let whole = source.tensor(&shard.name, &shard.full_shape)?;
    let full_cols = shard.full_cols();
    Ok((shard.row0..shard.row0 + shard.rows)
        .flat_map(|r| {
            let start = r * full_cols + shard.col0;
            whole[start..start + shard.cols].iter().copied()
        })
        .collect())
}

/// Shard `shard` as the FP8 codes and block scales `source` stores, where it stores FP8.
fn stored_fp8_shard(source: &dyn WeightSource, shard: &Shard) -> Result<Option<Fp8Weight>> {
    let &[rows, cols] = shard.full_shape.as_slice() else {
        return Ok(None);
    };
    let Some(whole) = source.fp8(&shard.name, rows, cols)? else {
        return Ok(None);
    };
    // The plan keeps FP8 shards on whole scale blocks (`WeightPlan::push`).
    whole
        .window(shard.row0, shard.rows, shard.col0, shard.cols)
        .map(Some)
        .ok_or_else(|| {
            StepError::Invalid(format!(
                "{}: this rank's shard (rows {}.., columns {}.., {} x {}) cuts the checkpoint's \
                 128 x 128 scale blocks",
                shard.name, shard.row0, shard.col0, shard.rows, shard.cols
            ))
        })
}

/// `tensor`'s source shards from `source`: for an FP8 tensor each shard's codes and scales (no
/// values: a shard the checkpoint stores in FP8 keeps its codes and scales as they are, any other
/// is quantised here), else each shard's values, row-major. A bf16 tensor must hold bf16 values;
/// one that does not is refused by name.
fn shards_of(
    source: &dyn WeightSource,
    tensor: &DeviceTensor,
) -> Result<(Vec<Vec<f32>>, Vec<Fp8Weight>)> {
    let (rows, cols) = tensor.shape();
    let (mut values, mut quantised) = (Vec::new(), Vec::new());
    for shard in &tensor.sources {
        if tensor.element == Element::Fp8 {
            quantised.push(match stored_fp8_shard(source, shard)? {
                Some(stored) => stored,
                None => Fp8Weight::quantise(&shard_of(source, shard)?, rows, cols)?,
            });
            continue;
        }
        let v = shard_of(source, shard)?;
        let exact = |x: &f32| x.to_bits() & 0xffff == 0;
        if tensor.element == Element::Bf16 && !v.iter().all(exact) {
            let bad = v.iter().find(|x| !exact(x)).copied().unwrap_or_default();
            let why = if stored_fp8_shard(source, shard)?.is_some() {
                "it is FP8 in the checkpoint, and this weight format keeps it as bf16 (the FP8 \
                 weight format, `--fp8-weights`, keeps a checkpoint's FP8 matrices as they are)"
            } else {
                "the device keeps this tensor as bf16"
            };
            return Err(StepError::Invalid(format!(
                "{} holds {bad}, which is not a bf16 value; {why}",
                shard.name
            )));
        }
        values.push(v);
    }
    Ok((values, quantised))
}
