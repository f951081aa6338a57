//! Every kernel source of the workspace, and the build table CI prints: each kernel built for each
//! target (NVRTC for sm_90a, clang for gfx950) with its registers, spills, scratch and shared memory.

use device::{compiler_for, KernelResources, KernelSource};
use std::fmt::Write;
use std::path::{Path, PathBuf};

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
/// choice that matches no source is a failure, not an empty table.
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
    for target in targets {
        let compiler = match compiler_for(target) {
            Ok(c) => c,
            Err(e) if require_compilers => {
                table.failures.push(format!("{target}: {e}"));
                continue;
            }
            Err(e) => {
                device::record_skipped_check(target, &e);
                table.skipped.push(format!("{target}: {e}"));
                continue;
            }
        };
        for entry in &entries {
            match compiler.compile(&entry.source) {
                Ok(compiled) => {
                    if let Some(dir) = &choice.images {
                        let path = BuildChoice::image_path(dir, target, &entry.path);
                        let written = path
                            .parent()
                            .map_or(Ok(()), std::fs::create_dir_all)
                            .and_then(|()| std::fs::write(&path, &compiled.image));
                        if let Err(e) = written {
                            table
                                .failures
                                .push(format!("writing {}: {e}", path.display()));
                        }
                    }
                    table
                        .rows
                        .extend(compiled.resources.into_iter().map(|resources| BuiltKernel {
                            path: entry.path.clone(),
                            target: target.to_string(),
                            resources,
                        }))
                }
                Err(e) => table
                    .failures
                    .push(format!("{} for {target}: {e}", entry.path)),
            }
        }
    }
    table
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
