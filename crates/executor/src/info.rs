//! `mono info`: per-rank shapes, the bytes each launch kind must read, and the HBM floors.

use crate::info_chain::{kind_chains, kind_floors, render_chains, ChainRequest};
use crate::step::weights::WeightPlan;
use model::traffic::{launch_traffic, step_traffic, Formats, LaunchTraffic, Load};
use model::{LayerPlan, ModelConfig, RankShapes};
use std::fmt::Write;

pub struct InfoRequest {
    pub config: ModelConfig,
    pub preset_name: String,
    pub tp: usize,
    pub load: Load,
    pub formats: Formats,
    /// Bytes per second the floors are computed against.
    pub bandwidth: f64,
    /// CTAs the launches' chains are planned for.
    pub ctas: u32,
    /// Microseconds a hand-off costs.
    pub hand_off_us: f64,
}

fn gb(bytes: u64) -> String {
    format!("{:.3} GB", bytes as f64 / 1e9)
}

fn mb(bytes: u64) -> String {
    format!("{:.2} MB", bytes as f64 / 1e6)
}

pub fn render(req: &InfoRequest) -> model::Result<String> {
    let cfg = &req.config;
    let shapes = RankShapes::new(cfg, req.tp)?;
    let plan: Vec<LayerPlan> = cfg.layer_plan()?;
    let mut out = String::new();
    let full = plan
        .iter()
        .filter(|l| matches!(l.indexer, model::IndexerKind::Full))
        .count();
    let dense = plan
        .iter()
        .filter(|l| matches!(l.mlp, model::MlpKind::Dense))
        .count();
    let _ = writeln!(
        out,
        "{}: {} layers ({} dense, {} MoE), indexer on {} of them; TP {} (this is one rank)",
        req.preset_name,
        plan.len(),
        dense,
        plan.len() - dense,
        full,
        req.tp
    );
    let _ = writeln!(
        out,
        "load: {} request(s) x {} row(s), context {} tokens; weights {:?}, MLA cache {:?}",
        req.load.requests,
        req.load.rows_per_request,
        req.load.context,
        req.formats.weights,
        req.formats.cache
    );
    let _ = writeln!(out, "\nper-rank shapes");
    let _ = writeln!(
        out,
        "  heads {} of {}, q_b rows {}, kv_b rows {}, o_proj in {}, dense MLP inter {}, expert inter {} (shared {}), lm_head rows {}",
        shapes.heads,
        cfg.num_attention_heads,
        shapes.q_b_rows,
        shapes.kv_b_rows,
        shapes.o_proj_cols,
        shapes.dense_intermediate,
        shapes.expert_intermediate,
        shapes.shared_intermediate,
        shapes.vocab_rows
    );
    let mut shown = Vec::new();
    for layer in &plan {
        let kind = model::traffic::LaunchKind::of(layer);
        if shown.contains(&kind) {
            continue;
        }
        shown.push(kind);
        let _ = writeln!(out, "  {} (layer {}):", kind.name(), layer.index);
        for w in shapes.layer_weights(layer) {
            let _ = writeln!(
                out,
                "    {:<46} [{:>6}, {:>6}] x{:<3} {:<12} {:>10}",
                w.name,
                w.shape[0],
                w.shape[1],
                w.count,
                format!("{:?}", w.class),
                mb(w.total_bytes(req.formats.weights))
            );
        }
    }

    let _ = writeln!(
        out,
        "\nbytes each launch kind must read (floor at {:.2} TB/s)",
        req.bandwidth / 1e12
    );
    let _ = writeln!(
        out,
        "  {:<26} {:>5} {:>12} {:>12} {:>12} {:>10} {:>12} {:>12} {:>12} {:>10}",
        "launch",
        "count",
        "replicated",
        "sharded",
        "experts",
        "touched",
        "expert@1row",
        "caches",
        "total",
        "floor us"
    );
    let step = step_traffic(&shapes, &plan, req.formats, req.load);
    let one_row = Load {
        requests: 1,
        rows_per_request: 1,
        context: req.load.context,
    };
    let row = |t: &LaunchTraffic, count: u64| {
        let at_one = launch_traffic(&shapes, t.kind, req.formats, one_row);
        format!(
            "  {:<26} {:>5} {:>12} {:>12} {:>12} {:>10} {:>12} {:>12} {:>12} {:>10.1}",
            t.kind.name(),
            count,
            mb(t.weights.replicated),
            mb(t.weights.sharded),
            mb(t.weights.experts()),
            t.experts_touched,
            mb(at_one.weights.experts()),
            mb(t.cache_bytes()),
            mb(t.total_bytes()),
            model::traffic::floor_us(t.total_bytes(), req.bandwidth)
        )
    };
    for (t, count) in &step.launches {
        let _ = writeln!(out, "{}", row(t, *count));
    }
    let _ = writeln!(
        out,
        "\nstep: weights {}, caches {}, embedding rows {}; total {} -> HBM floor {:.1} us",
        gb(step.weight_bytes()),
        gb(step.cache_bytes()),
        mb(step.embedding_read),
        gb(step.total_bytes()),
        model::traffic::floor_us(step.total_bytes(), req.bandwidth)
    );
    let _ = writeln!(out, "{}", pages_line(req, &shapes));
    let chain = ChainRequest {
        config: cfg,
        tp: req.tp,
        load: req.load,
        weights: req.formats.weights,
        cache: req.formats.cache,
        ctas: req.ctas,
        hand_off_us: req.hand_off_us,
    };
    match kind_chains(&chain) {
        Ok(chains) => out.push_str(&render_chains(
            &chain,
            &chains,
            &kind_floors(&step.launches, req.bandwidth),
        )),
        Err(e) => {
            let _ = writeln!(out, "\nhand-offs: the launches could not be planned: {e}");
        }
    }
    Ok(out)
}

/// The 2 MB pages the step's weights lie in: what its links need translations for.
fn pages_line(req: &InfoRequest, shapes: &RankShapes) -> String {
    use crate::step::weights::pages::PAGE_BYTES;
    let plan = match WeightPlan::new(&req.config, req.tp, 0, req.formats.weights) {
        Ok(p) => p,
        Err(e) => return format!("pages: not counted ({e})"),
    };
    let pages = plan.step_pages();
    let experts = model::traffic::experts_touched(shapes, req.load.rows());
    let total = pages.total(experts);
    format!(
        "pages of {} MB the step's weights lie in (rank 0's arena of {}): {} read whole, {:.1} a \
         routed expert x {experts} experts x {} MoE layers at most; about {total:.0} pages, {:.1} GB \
         of address space",
        PAGE_BYTES >> 20,
        gb(plan.bytes as u64),
        pages.whole,
        pages.per_expert,
        pages.moe_layers,
        total * PAGE_BYTES as f64 / 1e9
    )
}

/// The `--gpu` part: the device, its SMs and memory, or why there is none.
pub fn render_gpu() -> String {
    match device::Device::open(0) {
        Ok(dev) => {
            let i = dev.info();
            format!(
                "gpu: {} ({} backend, {}), {} SMs/CUs, {:.1} GiB, wave {}, {} KiB shared per block, {} MiB L2, {}; compiler {}\n",
                i.name,
                i.backend,
                i.arch,
                i.multiprocessors,
                i.total_memory as f64 / (1u64 << 30) as f64,
                i.wave_size,
                i.max_shared_per_block / 1024,
                i.l2_bytes >> 20,
                i.driver_version,
                dev.compiler_version()
            )
        }
        Err(e) => format!("gpu: none usable: {e}\n"),
    }
}
