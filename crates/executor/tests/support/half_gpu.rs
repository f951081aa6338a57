//! The attention half alone in a fused launch on a GPU: its kernel built for the device's fused
//! CTA, one case's launch (arena, cache, weights, task table) and its output; shared by the GPU
//! test and the bench.
#![allow(dead_code)]

use super::half::{place, u16s, Case, Placed, Weights};
use device::{Args, Buffer, Device, Kernel, Launch, Module, Stream};
use executor::fused::attention::{half_source, HalfBuild, HalfPlan};
use executor::fused::{CtaShape, FusedKernel, Handoff, LaunchGraph, PlannedLaunch};
use linear::gpu::{LinArgs, LinMatrix};
use mailbox::gpu::{DeviceTable, EpochNode, LaunchTable, Variant};
use mailbox::layout::{BoxRange, Tags};
use mla::layout::AttendShape;
use model::numerics::RopeStyle;

pub type Error = Box<dyn std::error::Error>;

/// The fused kernel of the half on this device.
pub struct GpuKernel {
    // Declared before the module: a kernel must not outlive its module.
    pub kernel: Kernel,
    _module: Module,
    pub shape: CtaShape,
    pub ctas: u32,
    pub epoch: EpochNode,
}

impl GpuKernel {
    pub fn build(
        dev: &Device,
        attend: &AttendShape,
        style: RopeStyle,
        variant: Variant,
        trace: bool,
    ) -> Result<Self, Error> {
        let shape = CtaShape::of_device(dev, "the attention half")?;
        let mut src = half_source(shape, attend, style, variant)?;
        if trace {
            src = mailbox::trace::traced(src);
        }
        let ctas = dev.info().multiprocessors;
        let FusedKernel {
            kernel,
            module,
            shape,
        } = FusedKernel::build(dev, "the attention half", &src, shape, 0, ctas)?;
        Ok(GpuKernel {
            kernel,
            _module: module,
            shape,
            ctas,
            epoch: EpochNode::build(dev, Variant::default())?,
        })
    }
}

/// One case's launch on the device.
pub struct GpuHalf {
    pub plan: HalfPlan,
    pub launch: PlannedLaunch,
    pub table: DeviceTable,
    pub scratch: Buffer<u64>,
    pub epoch: Buffer<u32>,
    pub diag: Buffer<u32>,
    pub placed: Placed,
    pub lin: LinArgs,
    pub mla: mla::gpu::MlaArgs,
    pub lds: u32,
    pub tags: Tags,
    /// Bytes of weights and cache records the launch reads at least.
    pub weight_bytes: u64,
    buffers: Vec<Buffer<u8>>,
    _mats: Buffer<LinMatrix>,
}

impl GpuHalf {
    /// `slots` replaces the case's slot lists, `scale` the model's softmax scale (negative
    /// controls).
    pub fn new(
        dev: &Device,
        k: &GpuKernel,
        case: &Case,
        w: &Weights,
        build: HalfBuild,
        slots: Option<&[i32]>,
        scale: Option<f32>,
    ) -> Result<GpuHalf, Error> {
        let rows: u32 = case.requests.iter().map(|r| r.rows).sum();
        let mut g = LaunchGraph::new(k.ctas)?;
        let x = g.arena("x", u64::from(rows) * case.dims.hidden as u64 * 2)?;
        let input = Handoff {
            data: x,
            ready: BoxRange::default(),
        };
        let plan = HalfPlan::plan(&mut g, case.dims, &case.requests, build, input, "attn")?;
        let launch = g.finish()?;
        // Every CTA gets all the shared memory it may have (the linear's weight ring takes what
        // its task leaves free), at least what the tasks need.
        let need = plan.lds_bytes(k.shape.threads)?;
        if need > k.shape.shared_bytes {
            return Err(format!(
                "the tasks need {need} bytes of shared memory; a CTA has {}",
                k.shape.shared_bytes
            )
            .into());
        }
        let lds = k.shape.shared_bytes;
        let mut buffers = Vec::new();
        let mut put = |bytes: &[u8]| -> u64 {
            let b = dev.upload(bytes).expect("device memory for the case");
            let at = b.device_ptr();
            buffers.push(b);
            at
        };
        let placed = place(
            &plan,
            launch.arena.bytes,
            case,
            slots.unwrap_or(&case.slots),
            w,
            &mut put,
        );
        let weight_bytes = w
            .packed
            .iter()
            .map(|p| (p.bytes.len() + 4 * p.scales.len()) as u64)
            .sum::<u64>();
        let mats = plan.matrices(placed.arena, &placed.weights).unwrap();
        let mats = dev.upload(&mats)?;
        let lin = LinArgs {
            mats: mats.device_ptr(),
            experts: 0,
            n_mats: mats.len() as u32,
            n_experts: 0,
        };
        let mla = plan.mla_args(
            placed.arena,
            placed.cache,
            &placed.weights,
            scale.unwrap_or(plan.model_scale()),
        );
        let table = DeviceTable::upload(dev, &launch.placement)?;
        Ok(GpuHalf {
            table,
            scratch: dev.alloc_zeroed(launch.layout.boxes() as usize)?,
            epoch: dev.alloc_zeroed(1)?,
            diag: dev.alloc_zeroed(mailbox::DIAG_WORDS)?,
            lin,
            mla,
            lds,
            tags: Tags::new(1)?,
            weight_bytes,
            plan,
            launch,
            placed,
            buffers,
            _mats: mats,
        })
    }

    /// Enqueues one step: the epoch's advance, then the launch (`trace`: its task records).
    pub fn enqueue(
        &self,
        stream: &Stream,
        k: &GpuKernel,
        trace: Option<&Buffer<u64>>,
    ) -> Result<(), Error> {
        k.epoch
            .enqueue(stream, &self.epoch, &self.scratch, self.tags)?;
        let mut table = LaunchTable::new(
            &self.table,
            &self.scratch,
            &self.epoch,
            &self.diag,
            self.tags,
            0,
        )?;
        if let Some(t) = trace {
            table = table.with_trace(&self.table, t)?;
        }
        let launch = Launch::new(self.table.ctas, k.shape.threads).shared(self.lds);
        let args = Args::new().value(&table).value(&self.lin).value(&self.mla);
        stream.launch(&k.kernel, launch, &args)?;
        Ok(())
    }

    /// Runs one step and returns the output rows (fails on a wait that gave up).
    pub fn run(&self, dev: &Device, k: &GpuKernel) -> Result<Vec<u16>, Error> {
        let stream = dev.stream();
        self.enqueue(stream, k, None)?;
        stream.sync()?;
        let diag = self.diag.download()?;
        if diag[0] != 0 {
            return Err(format!("a wait gave up: {diag:?}").into());
        }
        self.out()
    }

    /// The output rows as they stand.
    pub fn out(&self) -> Result<Vec<u16>, Error> {
        let arena = &self.buffers[0];
        let bytes = arena.download()?;
        let o = &self.plan.out.data;
        Ok(u16s(
            &bytes[o.offset as usize..(o.offset + o.bytes) as usize],
        ))
    }

    /// Zeroes the output rows (so that a replay that writes nothing fails).
    pub fn clear_out(&self, stream: &Stream) -> Result<(), Error> {
        let o = &self.plan.out.data;
        stream.memset(self.placed.arena + o.offset, 0, o.bytes as usize)?;
        Ok(())
    }
}
