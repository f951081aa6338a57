//! Every kernel source of the workspace, and the build table CI prints: each kernel built for each
//! target (NVRTC for sm_90a, clang for gfx950) with its registers, spills, scratch and shared memory.

use device::{compiler_for, KernelResources, KernelSource};
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// A kernel source and the workspace path of its `.hip` file.
pub struct RegisteredSource {
    pub path: String,
    pub source: KernelSource,
}

fn register(
    crate_dir: &str,
    sources: Vec<KernelSource>,
) -> impl Iterator<Item = RegisteredSource> + '_ {
    sources.into_iter().map(move |source| RegisteredSource {
        path: format!("{crate_dir}/kernels/{}", source.name()),
        source,
    })
}

/// All `.hip` files the workspace builds.
pub fn registry() -> Vec<RegisteredSource> {
    let mailbox = mailbox::gpu::KERNEL_FILES
        .map(mailbox::gpu::source)
        .to_vec();
    register("crates/device", device::probes::sources())
        .chain(register("crates/mailbox", mailbox))
        .chain(register("crates/select", select::gpu::sources()))
        .chain(register("crates/indexer", indexer::gpu::sources()))
        .chain(register("crates/mla", mla::gpu::sources()))
        .chain(register("crates/linear", linear::gpu::sources()))
        .chain(register("crates/head", head::gpu::sources()))
        .chain(register("crates/moe", moe::gpu::sources()))
        .chain(register("crates/executor", fused_sources()))
        .chain(register(
            "crates/executor",
            vec![
                crate::step::weights::generate::source(),
                crate::step::inputs::source(),
            ],
        ))
        .collect()
}

/// The fused launches in their production builds: GLM-5's front half (indexer and select), its
/// attention half (linear and MLA, 8 heads at TP8, FP8 records), its MoE half (linear and MoE
/// stages), the head's parts (linear and head) and each layer kind's one launch, in the sm_90a
/// CTA shape (gfx950's shape differs only in its LDS, which the host passes at launch).
fn fused_sources() -> Vec<KernelSource> {
    let cfg = model::ModelConfig::preset("glm-5").expect("the GLM-5 preset exists");
    let top = select::layout::TopK::of(&cfg).expect("GLM-5's k is valid");
    let shape = crate::fused::CtaShape::for_target("sm_90a").expect("an sm_90a shape");
    let dims = crate::fused::attention::HalfDims::new(&cfg, 8, model::CacheFormat::Fp8)
        .expect("GLM-5 shards at TP8");
    let attend = dims.attend_shape(128).expect("GLM-5's attention shape");
    vec![
        crate::fused::front::front_source(
            shape,
            indexer::gpu::stage_kernel(),
            top,
            mailbox::gpu::Variant::default(),
        )
        .expect("the front half's stages fit one CTA shape"),
        crate::fused::attention::half_source(
            shape,
            &attend,
            dims.rope_style,
            mailbox::gpu::Variant::default(),
        )
        .expect("the attention half's stages fit one CTA shape"),
        crate::fused::head::head_source(shape, mailbox::gpu::Variant::default())
            .expect("the head's stages fit one CTA shape"),
        crate::fused::moe::moe_source(shape, mailbox::gpu::Variant::default())
            .expect("the MoE half's stages fit one CTA shape"),
    ]
    .into_iter()
    .chain(layer_sources(shape))
    .collect()
}

/// One launch a layer at glm-5.2 TP8 (FP8 weights and records): each layer kind's kernel. The
/// tail's is the head's (`fused_head`: the same stages in the same order).
fn layer_sources(shape: crate::fused::CtaShape) -> Vec<KernelSource> {
    use crate::fused::layer::{layer_source, LayerBuild, StepDims};
    use model::traffic::LaunchKind;
    let cfg = model::ModelConfig::preset("glm-5.2").expect("the glm-5.2 preset exists");
    let build = LayerBuild {
        ctas: 132,
        tp: 8,
        rank: 0,
        weights: model::WeightFormat::Fp8,
        cache: model::CacheFormat::Fp8,
        cache_pages: 4096,
        step: StepDims::new(&cfg, 16, 4, 4096),
        union: crate::step::layer::step::SPLIT_UNION,
        choice: mla::layout::SplitChoice::MEASURED_FASTEST,
    };
    [
        LaunchKind::DenseFull,
        LaunchKind::DenseShared,
        LaunchKind::MoeFull,
        LaunchKind::MoeShared,
    ]
    .into_iter()
    .map(|kind| {
        layer_source(&cfg, &build, shape, kind, mailbox::gpu::Variant::default())
            .expect("every layer kind's stages fit one CTA shape")
    })
    .collect()
}

/// The targets CI builds for.
pub const TARGETS: [&str; 2] = ["sm_90a", "gfx950"];

/// One row of the table.
pub struct BuiltKernel {
    pub path: String,
    pub target: String,
    pub resources: KernelResources,
}

/// What building everything gave: the rows, and each failure (a missing compiler or a compile error).
#[derive(Default)]
pub struct BuildTable {
    pub rows: Vec<BuiltKernel>,
    pub failures: Vec<String>,
    pub skipped: Vec<String>,
}

/// Which kernels to build and what to keep of them.
#[derive(Default)]
pub struct BuildChoice {
    /// Build only the sources whose workspace path contains one of these (all when empty).
    pub only: Vec<String>,
    /// Write each image here, as `DIR/<target>/<path, '/' as '-', without .hip>.<cubin|hsaco>`,
    /// with line tables for a disassembler (`nvdisasm -gi`, `llvm-objdump -d -l`).
    pub images: Option<PathBuf>,
}

impl BuildChoice {
    fn takes(&self, path: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|part| path.contains(part.as_str()))
    }

    fn image_path(dir: &Path, target: &str, source_path: &str) -> PathBuf {
        let stem = source_path.trim_end_matches(".hip").replace('/', "-");
        // The same rule as `device::compiler_for`: gfx targets go to clang, the rest to NVRTC.
        let extension = if target.starts_with("gfx") {
            "hsaco"
        } else {
            "cubin"
        };
        dir.join(target).join(format!("{stem}.{extension}"))
    }
}

/// Builds every registered source for each target. A missing compiler is a failure when
/// `require_compilers` is set, else the target is skipped with the reason.
pub fn build_all(targets: &[&str], require_compilers: bool) -> BuildTable {
    build(targets, require_compilers, &BuildChoice::default())
}

/// Builds the chosen sources for each target, writing their images where `choice` says. A
/// choice that matches no source is a failure, not an empty table. The builds run a thread a
/// core (the fused kernels take minutes each, and NVRTC and clang use one core a build), the
/// longest-expected first; the table keeps the registry's order, a target after another.
pub fn build(targets: &[&str], require_compilers: bool, choice: &BuildChoice) -> BuildTable {
    let mut table = BuildTable::default();
    let entries: Vec<RegisteredSource> = registry()
        .into_iter()
        .filter(|e| choice.takes(&e.path))
        .collect();
    if entries.is_empty() {
        table.failures.push(format!(
            "no kernel source's path contains any of {:?}",
            choice.only
        ));
        return table;
    }
    let mut compilers = Vec::new();
    for target in targets {
        match compiler_for(target) {
            Ok(c) => compilers.push((*target, c)),
            Err(e) if require_compilers => table.failures.push(format!("{target}: {e}")),
            Err(e) => {
                device::record_skipped_check(target, &e);
                table.skipped.push(format!("{target}: {e}"));
            }
        }
    }
    let jobs: Vec<(usize, usize)> = (0..compilers.len())
        .flat_map(|t| (0..entries.len()).map(move |e| (t, e)))
        .collect();
    let results = run_jobs(&jobs, &compilers, &entries, choice);
    for ((t, e), result) in jobs.into_iter().zip(results) {
        let (target, entry) = (compilers[t].0, &entries[e]);
        match result {
            Ok(resources) => {
                table
                    .rows
                    .extend(resources.into_iter().map(|resources| BuiltKernel {
                        path: entry.path.clone(),
                        target: target.to_string(),
                        resources,
                    }))
            }
            Err(e) => table.failures.push(e),
        }
    }
    table
}

type JobResult = Result<Vec<KernelResources>, String>;

/// Runs every (compiler, source) job on a pool of threads, the registry's later sources (the
/// fused kernels, the longest builds) taken first so that no long build starts last, and
/// reports each as it ends on stderr. Results come back in the jobs' order.
fn run_jobs(
    jobs: &[(usize, usize)],
    compilers: &[(&str, Box<dyn device::Compiler>)],
    entries: &[RegisteredSource],
    choice: &BuildChoice,
) -> Vec<JobResult> {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&j| std::cmp::Reverse((jobs[j].1, jobs[j].0)));
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<JobResult>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while let Some(&j) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let (t, e) = jobs[j];
                    let ((target, compiler), entry) = (&compilers[t], &entries[e]);
                    let start = Instant::now();
                    let result = build_one(target, compiler.as_ref(), entry, choice);
                    let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
                    eprintln!(
                        "built {finished} of {}: {} for {target} ({:.1} s{})",
                        jobs.len(),
                        entry.path,
                        start.elapsed().as_secs_f64(),
                        if result.is_err() { ", failed" } else { "" }
                    );
                    if let Ok(mut slots) = results.lock() {
                        slots[j] = Some(result);
                    }
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("a build thread ended without a result".to_string())))
        .collect()
}

/// One source for one target: its kernels' resources, its image written where `choice` says.
fn build_one(
    target: &str,
    compiler: &dyn device::Compiler,
    entry: &RegisteredSource,
    choice: &BuildChoice,
) -> JobResult {
    let compiled = compiler
        .compile(&entry.source)
        .map_err(|e| format!("{} for {target}: {e}", entry.path))?;
    if let Some(dir) = &choice.images {
        let path = BuildChoice::image_path(dir, target, &entry.path);
        path.parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, &compiled.image))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(compiled.resources)
}

impl BuildTable {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<36} {:<22} {:<7} {:>5} {:>5} {:>6} {:>8} {:>8}",
            "file", "kernel", "target", "regs", "sgprs", "spills", "scratch", "shared"
        );
        for row in &self.rows {
            let r = &row.resources;
            let sgprs = r.sgprs.map_or("-".to_string(), |s| s.to_string());
            let _ = writeln!(
                out,
                "{:<36} {:<22} {:<7} {:>5} {:>5} {:>6} {:>8} {:>8}",
                row.path,
                r.kernel,
                row.target,
                r.registers,
                sgprs,
                r.spills,
                r.scratch_bytes,
                r.shared_bytes
            );
        }
        for s in &self.skipped {
            let _ = writeln!(out, "skipped {s}");
        }
        for f in &self.failures {
            let _ = writeln!(out, "FAILED {f}");
        }
        out
    }
}
