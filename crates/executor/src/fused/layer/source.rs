//! A layer launch's fused kernel: exactly the stages its kind runs, in one fixed order (the order
//! of the kernel's arguments after `mbx_launch`): indexer, select, MLA, linear, MoE, head.

use super::super::attention::half_stages;
use super::super::{fused_source, CtaShape};
use super::{LaunchAt, LayerBuild, LayerError};
use device::KernelSource;
use mailbox::gpu::Variant;
use mailbox::{Stage, StageKernel};
use model::numerics::RopeStyle;
use model::traffic::LaunchKind;
use model::ModelConfig;
use select::gpu::Shape as SelectShape;
use select::layout::TopK;

/// The name of a layer launch's fused kernel source (the kind follows it).
pub const SOURCE_NAME: &str = "fused_layer";

/// The stages of a launch of `kind`. Every layer kind has the head stage: its post-attention
/// norm (and layer 0's embedding) are head tasks.
pub fn layer_stages(kind: LaunchKind) -> Vec<Stage> {
    let full = matches!(kind, LaunchKind::DenseFull | LaunchKind::MoeFull);
    let moe = matches!(kind, LaunchKind::MoeFull | LaunchKind::MoeShared);
    if kind == LaunchKind::Tail {
        return vec![Stage::Linear, Stage::Head];
    }
    let mut stages = Vec::new();
    if full {
        stages.extend([Stage::Indexer, Stage::Select]);
    }
    stages.extend([Stage::Mla, Stage::Linear]);
    if moe {
        stages.push(Stage::Moe);
    }
    stages.push(Stage::Head);
    stages
}

/// The file name of a kind's source.
fn kind_name(kind: LaunchKind) -> &'static str {
    match kind {
        LaunchKind::DenseFull => "dense_full",
        LaunchKind::DenseShared => "dense_shared",
        LaunchKind::MoeFull => "moe_full",
        LaunchKind::MoeShared => "moe_shared",
        LaunchKind::Tail => "tail",
    }
}

/// The kind of the launch at `at` of `cfg`.
pub fn launch_kind(cfg: &ModelConfig, at: LaunchAt) -> Result<LaunchKind, LayerError> {
    match at {
        LaunchAt::Tail => Ok(LaunchKind::Tail),
        LaunchAt::Layer(i) => {
            let layers = cfg.layer_plan()?;
            let layer = layers.get(i).ok_or(LayerError::NoSuchLayer {
                layer: i,
                layers: layers.len(),
            })?;
            Ok(LaunchKind::of(layer))
        }
    }
}

/// The stage kernels of a launch of `kind` for `cfg` on CTAs of `shape`: the indexer's production
/// stage at the config's shape (`indexer::gpu::stage_kernel_for`), select's production build
/// for the config's k, MLA for the build's attention shape and the config's rope.
pub fn stage_kernels(
    cfg: &ModelConfig,
    build: &LayerBuild,
    shape: CtaShape,
    kind: LaunchKind,
) -> Result<Vec<StageKernel>, LayerError> {
    let source = |e: &dyn std::fmt::Display| LayerError::Source(e.to_string());
    let mut out = Vec::new();
    for stage in layer_stages(kind) {
        match stage {
            Stage::Indexer => {
                out.push(indexer::gpu::stage_kernel_for(cfg).map_err(|e| source(&e))?);
            }
            Stage::Select => {
                let top = TopK::of(cfg)
                    .and_then(TopK::for_kernels)
                    .map_err(|e| source(&e))?;
                let select = SelectShape::production(top).map_err(|e| source(&e))?;
                if select.threads != shape.threads {
                    return Err(LayerError::Source(format!(
                        "select's tasks take {} threads; the fused CTA has {}",
                        select.threads, shape.threads
                    )));
                }
                out.push(select::gpu::stage_kernel(select));
            }
            Stage::Mla => {
                let dims = super::super::attention::HalfDims::new(cfg, build.tp, build.cache)?;
                let attend = dims.attend_shape(build.union)?;
                let style = RopeStyle::from_interleave(cfg.rope_interleave);
                let mla = half_stages(shape, &attend, style)?
                    .into_iter()
                    .find(|s| s.stage == Stage::Mla)
                    .ok_or_else(|| LayerError::Source("the half's stages lack MLA".into()))?;
                out.push(mla);
            }
            Stage::Linear => out.push(linear::gpu::stage_kernel()),
            Stage::Moe => out.push(moe::gpu::stage_kernel()),
            Stage::Head => out.push(head::gpu::stage_kernel()),
            Stage::Synthetic => {
                return Err(LayerError::Source("no layer runs synthetic tasks".into()))
            }
        }
    }
    Ok(out)
}

/// The fused kernel of a launch of `kind` ([`layer_stages`] in that order, one switch over their
/// decoders), with the mailbox's `variant`: `mono_layer(mbx_launch, <each stage's args>)`.
pub fn layer_source(
    cfg: &ModelConfig,
    build: &LayerBuild,
    shape: CtaShape,
    kind: LaunchKind,
    variant: Variant,
) -> Result<KernelSource, LayerError> {
    let stages = stage_kernels(cfg, build, shape, kind)?;
    let name = format!("{SOURCE_NAME}_{}", kind_name(kind));
    let source =
        fused_source(&name, &stages, shape).map_err(|e| LayerError::Source(e.to_string()))?;
    Ok(variant.apply(source))
}
