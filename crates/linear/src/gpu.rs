//! Host side of the standalone linear launch (`kernels/linear.hip`): the source and its build,
//! the kernel arguments (`LinMatrix`, `LinArgs`: twins of `lin_matrix`, `lin_args`), a problem's
//! buffers on the device, and the launch.

use crate::cases::{bf16_value, Problem};
use crate::layout::{lds_bytes, LayoutError};
use device::{Args, Buffer, Device, DeviceError, Kernel, KernelSource, Launch, Module, Stream};
use mailbox::gpu::{LaunchTable, Variant};
use model::weights::packed::{PackedWeight, Pairing};
use model::weights::WeightError;
use model::WeightFormat;

pub const LINEAR_HIP: (&str, &str) = ("linear.hip", include_str!("../kernels/linear.hip"));
pub const LIN_TASK_H: (&str, &str) = ("lin_task.h", include_str!("../kernels/lin_task.h"));
/// A probe of the tile's RMSNorm prologue against the norm task's function (the tests').
pub const NORM_PROBE_HIP: (&str, &str) =
    ("norm_probe.hip", include_str!("../kernels/norm_probe.hip"));

/// `lin_matrix.flags` (`kernels/ops/linear.h`).
/// Words of the tile's clock stamps a task writes in `LIN_STAMPS` builds (`LIN_STAMP_WORDS`,
/// `kernels/ops/linear.h`), at `LIN_STAMP_BUF` + its first box's record (a pair task: its gate/up's
/// there, its down's at the next box's).
pub const STAMP_WORDS: usize = 8;
/// The milestone each stamp word `LIN_STAMP_TILE..=LIN_STAMP_SLOWEST` records, in word order:
/// the matrix descriptor read and first loads issued, the input wait over, x in LDS, the first
/// and the last batch multiplied (or slot landed) by the leader's group, the last epilogue stored,
/// the boxes published, and the last batch multiplied by the slowest group (what the epilogue
/// waits on: "stored" less this is the epilogue's own time, this less "last" the groups' spread).
pub const STAMP_MILESTONES: [&str; 8] = [
    "desc",
    "ready",
    "x",
    "first",
    "last",
    "stored",
    "published",
    "slowest",
];

/// The record at box `record` of `words` (`STAMP_WORDS` a box): each milestone after the first,
/// in clock ticks after the tile's start (None where the tile did not reach it); None when no tile
/// wrote the record (its start is 0: a pair of an unused slot, or past the words).
pub fn stamp_milestones(words: &[u64], record: usize) -> Option<Vec<Option<u64>>> {
    let w = words.get(record * STAMP_WORDS..(record + 1) * STAMP_WORDS)?;
    (w[0] != 0).then(|| {
        w[1..STAMP_MILESTONES.len()]
            .iter()
            .map(|&t| (t != 0).then(|| t.wrapping_sub(w[0])))
            .collect()
    })
}

pub const FLAG_FP8: u32 = 1;
pub const FLAG_OUT_F32: u32 = 2;
pub const FLAG_SWIGLU: u32 = 4;
pub const FLAG_RESIDUAL: u32 = 8;
pub const FLAG_ROW_SCALE: u32 = 16;
/// x is RMSNorm(source rows), normed while the tile stages it ([`LinMatrix::with_rmsnorm`]).
pub const FLAG_RMSNORM: u32 = 32;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Mailbox(#[from] mailbox::gpu::GpuError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(transparent)]
    Weights(#[from] WeightError),
}

pub type Result<T, E = GpuError> = std::result::Result<T, E>;

/// One matrix of a launch, in the byte layout of `struct lin_matrix`. Pointers are device
/// addresses (0 where unused).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LinMatrix {
    pub w: u64,
    pub scales: u64,
    pub x: u64,
    pub y: u64,
    pub residual: u64,
    pub row_scale: u64,
    /// [`FLAG_RMSNORM`]: the norm's weight (bf16) of the whole source row.
    pub norm_w: u64,
    pub k: u32,
    pub n: u32,
    pub tiles: u32,
    pub rows: u32,
    pub x_stride: u32,
    pub y_stride: u32,
    pub flags: u32,
    /// Elements of x's source rows, of which `x` points at element `row_at` (0: the rows are the
    /// k-range itself). The tile stages zeros for the columns past a row's end; [`FLAG_RMSNORM`]
    /// takes each row's RMS over all of its elements.
    pub row_len: u32,
    /// The element of the source row that `x` points at (a multiple of 8).
    pub row_at: u32,
    pub norm_eps: f32,
}

const _: () = assert!(std::mem::size_of::<LinMatrix>() == 96);

/// Bad [`LinMatrix::with_rmsnorm`] or [`LinMatrix::with_short_rows`] arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("x rows: {0}")]
pub struct RowsError(String);

impl LinMatrix {
    /// The same matrix with x = RMSNorm(the source rows): `x` (already set, with its `x_stride`)
    /// points at element `k0` of rows of `n` elements, which the tile normalises with the bf16
    /// weight at `weight` (`[n]`, 16-byte aligned) and `eps` while it stages its k-range, each
    /// row's RMS taken over all `n` elements: the bits a norm task of the same team writes.
    pub fn with_rmsnorm(
        mut self,
        weight: u64,
        n: u32,
        k0: u32,
        eps: f32,
    ) -> Result<Self, RowsError> {
        let why = if k0 % 8 != 0 || weight % 16 != 0 {
            Some(format!(
                "element {k0} and weight address {weight:#x}: the tile reads 16-byte pieces"
            ))
        } else if u64::from(k0) + u64::from(self.k) > u64::from(n) {
            Some(format!("k-range {k0}..{} past a row of {n}", k0 + self.k))
        } else if !(eps.is_finite() && eps > 0.0) {
            Some(format!("eps {eps}: positive and finite"))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(RowsError(format!("RMSNorm prologue: {why}")));
        }
        self.flags |= FLAG_RMSNORM;
        self.norm_w = weight;
        self.row_len = n;
        self.row_at = k0;
        self.norm_eps = eps;
        Ok(self)
    }

    /// The same matrix over x rows that hold only their first `len` elements (`len < k`, a
    /// multiple of 8; the rest of the k-range belongs to other data or to nothing): the tile
    /// stages zeros past them. For a matrix padded with zero weight columns to whole k-blocks,
    /// whose padding must meet zeros whatever follows x's rows in memory.
    pub fn with_short_rows(mut self, len: u32) -> Result<Self, RowsError> {
        if len % 8 != 0 || len == 0 || len >= self.k {
            return Err(RowsError(format!(
                "{len} elements of a k-range of {}: a multiple of 8 from 8 to k - 8",
                self.k
            )));
        }
        if self.flags & FLAG_RMSNORM != 0 {
            return Err(RowsError("short rows of a normed x".into()));
        }
        self.row_len = len;
        self.row_at = 0;
        Ok(self)
    }
}

/// A bank of same-shaped experts, `struct lin_expert`: `m` is expert 0 of slot 0; expert e's
/// weight lies `e * w_stride` bytes further (scales `e * scales_stride` floats), slot j's x, y and
/// row scales `j *` their strides (elements) further.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LinExpert {
    pub m: LinMatrix,
    pub w_stride: u64,
    pub scales_stride: u64,
    pub x_slot: u64,
    pub y_slot: u64,
    pub row_scale_slot: u64,
    pub n_experts: u32,
    pub pad: u32,
}

const _: () = assert!(std::mem::size_of::<LinExpert>() == 144);

/// The stage's kernel argument, `struct lin_args`: the matrices and the expert banks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LinArgs {
    pub mats: u64,
    pub experts: u64,
    pub n_mats: u32,
    pub n_experts: u32,
}

/// The flags of a problem's matrix.
pub fn flags(p: &Problem) -> u32 {
    let mut f = 0;
    if p.format == WeightFormat::Fp8 {
        f |= FLAG_FP8;
    }
    if p.out_f32() {
        f |= FLAG_OUT_F32;
    }
    if p.pairing == Pairing::GateUp {
        f |= FLAG_SWIGLU;
    }
    if p.has_residual() {
        f |= FLAG_RESIDUAL;
    }
    if p.has_row_scale() {
        f |= FLAG_ROW_SCALE;
    }
    f
}

/// `linear.hip` for CTAs of `threads`.
pub fn source(threads: u32, variant: Variant) -> KernelSource {
    variant
        .apply(mailbox::gpu::source(LINEAR_HIP).header(LIN_TASK_H.0, LIN_TASK_H.1))
        .define("MONO_CTA_THREADS", threads)
}

/// `norm_probe.hip` (entry `lin_norm_probe`) for CTAs of `threads`.
pub fn norm_probe_source(threads: u32) -> KernelSource {
    mailbox::gpu::source(NORM_PROBE_HIP)
        .define("MONO_CTA_THREADS", threads)
        .define("PROBE_SCRATCH_BYTES", NORM_PROBE_SCRATCH)
}

/// Bytes of the probe's LDS before its staged rows: the prologue's scratch (every row's wave
/// sums and inverse RMS) for teams of up to 1024 threads.
pub const NORM_PROBE_SCRATCH: u32 = 4096;

/// The kernel table's builds: the fused shape's 512 threads, and the prologue's probe.
pub fn sources() -> Vec<KernelSource> {
    vec![source(512, Variant::default()), norm_probe_source(512)]
}

/// The linear stage as the fused kernel's generator takes it (`lin_task.h`, `lin_args`,
/// `lin_decode`; the tile `ops/linear.h` comes with the workspace's ops layer).
pub fn stage_kernel() -> mailbox::StageKernel {
    mailbox::StageKernel {
        stage: mailbox::Stage::Linear,
        include: LIN_TASK_H.0,
        headers: vec![LIN_TASK_H],
        args_type: "lin_args",
        decoder: "lin_decode",
        defines: Default::default(),
    }
}

/// The built standalone entry `linear_tasks`.
pub struct LinearKernel {
    kernel: Kernel,
    threads: u32,
    _module: Module,
}

impl LinearKernel {
    pub fn build(dev: &Device, threads: u32, variant: Variant) -> Result<Self> {
        Self::build_source(dev, threads, source(threads, variant))
    }

    /// The same kernel writing every task's start and end to the launch's trace
    /// ([`DevicePlan::launch_traced`], `mailbox::trace`).
    pub fn build_traced(dev: &Device, threads: u32, variant: Variant) -> Result<Self> {
        Self::build_source(
            dev,
            threads,
            mailbox::trace::traced(source(threads, variant)),
        )
    }

    /// `source` (one of [`source`], with what a measurement adds) built for CTAs of `threads`.
    pub fn build_source(dev: &Device, threads: u32, source: KernelSource) -> Result<Self> {
        lds_bytes(threads, 128, 1)?;
        let module = dev.build(&source)?;
        Ok(LinearKernel {
            kernel: module.kernel("linear_tasks")?,
            threads,
            _module: module,
        })
    }

    pub fn threads(&self) -> u32 {
        self.threads
    }

    /// The dynamic shared memory a launch should give each CTA: all that the device lets one
    /// CTA have beside the kernel's static words. On NVIDIA the tile streams a task's weights
    /// through what lies beyond its partial sums and x rows (the ring of `kernels/ops/linear.h`),
    /// so more shared memory keeps more bytes in flight; [`lds_bytes`] is only the least a launch
    /// of given matrices takes.
    pub fn lds_budget(&self, dev: &Device) -> Result<u32> {
        let fixed = self.kernel.resources()?.shared_bytes;
        Ok(dev.info().max_shared_per_block.saturating_sub(fixed))
    }

    /// The largest grid whose CTAs are all resident with `lds` bytes of shared memory each.
    pub fn max_resident(&self, lds: u32) -> Result<u32> {
        Ok(self.kernel.max_coresident_grid(self.threads, lds)?)
    }

    pub fn launch(
        &self,
        stream: &Stream,
        table: &LaunchTable,
        args: &LinArgs,
        lds: u32,
    ) -> Result<()> {
        let launch = Launch::new(table.n_ctas, self.threads).shared(lds);
        Ok(stream.launch(&self.kernel, launch, &Args::new().value(table).value(args))?)
    }
}

/// One problem's buffers on the device.
pub struct DeviceProblem {
    pub weight: Buffer<u8>,
    pub scales: Buffer<f32>,
    pub x: Buffer<u16>,
    /// `[rows, n]` bf16 or fp32 bytes.
    pub y: Buffer<u8>,
    pub residual: Buffer<u16>,
    pub row_scale: Buffer<f32>,
    pub matrix: LinMatrix,
    out_f32: bool,
}

fn at_least_one<T: Copy>(v: &[T], zero: T) -> Vec<T> {
    if v.is_empty() {
        vec![zero]
    } else {
        v.to_vec()
    }
}

impl DeviceProblem {
    /// Uploads `p` with its packed weight `w` (usually `p.packed()`; tests pass altered ones).
    pub fn upload(dev: &Device, p: &Problem, w: &PackedWeight) -> Result<Self> {
        let out_bytes = if p.out_f32() { 4 } else { 2 };
        let weight = dev.upload(&w.bytes)?;
        let scales = dev.upload(&at_least_one(&w.scales, 0.0))?;
        let x = dev.upload(&p.x)?;
        let y = dev.alloc_zeroed::<u8>(p.rows * p.n * out_bytes)?;
        let residual = dev.upload(&at_least_one(&p.residual, 0))?;
        let row_scale = dev.upload(&at_least_one(&p.row_scale, 0.0))?;
        let matrix = LinMatrix {
            w: weight.device_ptr(),
            scales: scales.device_ptr(),
            x: x.device_ptr(),
            y: y.device_ptr(),
            residual: residual.device_ptr(),
            row_scale: row_scale.device_ptr(),
            k: p.k as u32,
            n: p.n as u32,
            tiles: w.layout.tiles() as u32,
            rows: p.rows as u32,
            x_stride: p.k as u32,
            y_stride: p.n as u32,
            flags: flags(p),
            ..LinMatrix::default()
        };
        Ok(DeviceProblem {
            weight,
            scales,
            x,
            y,
            residual,
            row_scale,
            matrix,
            out_f32: p.out_f32(),
        })
    }

    /// Fills y with all-ones bits (NaN in bf16 and fp32), so that unwritten outputs fail a check.
    pub fn poison(&self, stream: &Stream) -> Result<()> {
        stream.memset(self.y.device_ptr(), 0xff, self.y.bytes())?;
        Ok(())
    }

    /// y as f32 values.
    pub fn read_y(&self) -> Result<Vec<f32>> {
        Ok(decode_y(&self.y.download()?, self.out_f32))
    }
}

/// Output bytes as f32 values (fp32, or bf16 widened).
pub fn decode_y(bytes: &[u8], out_f32: bool) -> Vec<f32> {
    if out_f32 {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    } else {
        bytes
            .chunks_exact(2)
            .map(|c| bf16_value(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    }
}

/// A launch plan in device memory: its task table, scratch, epoch word, diagnostics and matrices.
pub struct DevicePlan {
    pub table: mailbox::gpu::DeviceTable,
    pub scratch: Buffer<u64>,
    pub epoch: Buffer<u32>,
    pub diag: Buffer<u32>,
    pub mats: Buffer<LinMatrix>,
    /// Dynamic shared memory of each CTA.
    pub lds: u32,
}

impl DevicePlan {
    /// Checks `plan` against what `kernel` can keep resident with `lds` bytes and uploads it.
    pub fn new(
        dev: &Device,
        kernel: &LinearKernel,
        plan: &crate::layout::LaunchPlan,
        mats: &[LinMatrix],
        lds: u32,
    ) -> Result<Self> {
        let limits = mailbox::Limits {
            max_resident: kernel.max_resident(lds)?,
            scratch_boxes: plan.boxes,
        };
        let valid = plan
            .placement
            .clone()
            .check(limits)
            .map_err(mailbox::gpu::GpuError::from)?;
        Ok(DevicePlan {
            table: mailbox::gpu::DeviceTable::upload(dev, &valid)?,
            scratch: dev.alloc_zeroed(plan.boxes as usize)?,
            epoch: dev.alloc_zeroed(1)?,
            diag: dev.alloc_zeroed(mailbox::DIAG_WORDS)?,
            mats: dev.upload(mats)?,
            lds,
        })
    }

    /// Enqueues launch `index` of a step of `tags` (the epoch word is advanced by the caller's
    /// epoch node, once a step).
    pub fn launch(
        &self,
        stream: &Stream,
        kernel: &LinearKernel,
        tags: mailbox::Tags,
        index: u32,
    ) -> Result<()> {
        self.launch_with(stream, kernel, tags, index, &self.mats)
    }

    /// The same launch over another set of matrices of the same shapes (another copy of the
    /// weights): the plan's table, scratch and epoch are shared.
    pub fn launch_with(
        &self,
        stream: &Stream,
        kernel: &LinearKernel,
        tags: mailbox::Tags,
        index: u32,
        mats: &Buffer<LinMatrix>,
    ) -> Result<()> {
        let table = LaunchTable::new(
            &self.table,
            &self.scratch,
            &self.epoch,
            &self.diag,
            tags,
            index,
        )?;
        let args = LinArgs {
            mats: mats.device_ptr(),
            experts: 0,
            n_mats: mats.len() as u32,
            n_experts: 0,
        };
        kernel.launch(stream, &table, &args, self.lds)
    }

    /// Launch `index` of a step of `tags` writing its task records to `trace`
    /// ([`mailbox::gpu::DeviceTable::trace_buffer`]; only a kernel from
    /// [`LinearKernel::build_traced`] writes them).
    pub fn launch_traced(
        &self,
        stream: &Stream,
        kernel: &LinearKernel,
        tags: mailbox::Tags,
        index: u32,
        trace: &Buffer<u64>,
    ) -> Result<()> {
        let table = LaunchTable::new(
            &self.table,
            &self.scratch,
            &self.epoch,
            &self.diag,
            tags,
            index,
        )?
        .with_trace(&self.table, trace)?;
        let args = LinArgs {
            mats: self.mats.device_ptr(),
            experts: 0,
            n_mats: self.mats.len() as u32,
            n_experts: 0,
        };
        kernel.launch(stream, &table, &args, self.lds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_record_reads_after_its_tile_start_and_an_unwritten_one_reads_as_none() {
        let mut words = vec![0u64; 3 * STAMP_WORDS];
        let at = STAMP_WORDS;
        words[at..at + STAMP_MILESTONES.len()]
            .copy_from_slice(&[100, 110, 0, 130, 140, 150, 160, 142]);
        let got = stamp_milestones(&words, 1).unwrap();
        assert_eq!(
            got,
            [
                Some(10),
                None,
                Some(30),
                Some(40),
                Some(50),
                Some(60),
                Some(42)
            ]
        );
        assert_eq!(stamp_milestones(&words, 0), None);
        assert_eq!(stamp_milestones(&words, 3), None);
    }
}
