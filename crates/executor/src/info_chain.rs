//! `mono info`'s second floor: each launch kind's longest chain of hand-offs, counted on the launch
//! as the executor plans it (`mailbox::ValidPlacement::hand_offs`), beside its bytes floor. A
//! launch can be no faster than its bytes over the bandwidth, nor than its chain at the cost of a
//! hand-off. The two in series is what a launch takes whose links each stream at the copy's rate
//! once their inputs are there: weights put in flight across a hand-off would overlap them, but
//! every form of that tried here was slower (`crates/executor/PERF.md`).

use crate::fused::front::FrontRequest;
use crate::fused::layer::source::launch_kind;
use crate::fused::layer::{LaunchAt, LayerBuild, LayerPlan, StepDims};
use crate::step::layer::step::{split_choice, SPLIT_UNION};
use mailbox::ValidPlacement;
use model::paging::pages_through;
use model::traffic::{floor_us, LaunchKind, Load};
use model::{CacheFormat, ModelConfig, WeightFormat};

/// What the chains are planned for.
pub struct ChainRequest<'a> {
    pub config: &'a ModelConfig,
    pub tp: usize,
    pub load: Load,
    pub weights: WeightFormat,
    pub cache: CacheFormat,
    /// CTAs of the grid (one a SM).
    pub ctas: u32,
    /// Microseconds a hand-off costs.
    pub hand_off_us: f64,
}

/// One launch kind's chain.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KindChain {
    pub kind: LaunchKind,
    /// The first launch of the kind, which was planned.
    pub at: LaunchAt,
    pub hand_offs: u32,
}

/// The requests and build of `req`'s load: one page table a request, the rows at the context's
/// last positions.
fn batch(req: &ChainRequest) -> Result<(Vec<FrontRequest>, LayerBuild), String> {
    let cfg = req.config;
    let small =
        |v: u64, what: &str| u32::try_from(v).map_err(|_| format!("{what} {v} is past u32"));
    let n_requests = small(req.load.requests, "requests")?;
    let per_request = small(req.load.rows_per_request, "rows per request")?;
    let context = small(req.load.context, "context")?;
    let rows = n_requests
        .checked_mul(per_request)
        .ok_or("the step's rows pass u32")?;
    // `mono info`'s context counts the step's rows: they take its last positions.
    let cached = context.checked_sub(per_request).ok_or(format!(
        "a context of {context} tokens cannot hold {per_request} rows a request"
    ))?;
    let pages = pages_through(context.saturating_sub(1));
    let requests = (0..n_requests)
        .map(|r| FrontRequest {
            context: cached,
            rows: per_request,
            pages: (r * pages..(r + 1) * pages).collect(),
        })
        .collect();
    let build = LayerBuild {
        ctas: req.ctas,
        tp: req.tp,
        rank: 0,
        weights: req.weights,
        cache: req.cache,
        cache_pages: pages
            .checked_mul(n_requests)
            .ok_or("the requests' pages pass u32")?,
        step: StepDims::new(cfg, rows, n_requests, pages),
        union: SPLIT_UNION,
        choice: split_choice(cfg),
    };
    Ok((requests, build))
}

fn plan(
    req: &ChainRequest,
    requests: &[FrontRequest],
    build: &LayerBuild,
    at: LaunchAt,
) -> Result<ValidPlacement, String> {
    LayerPlan::plan(req.config, at, requests, build)
        .map(|p| p.launch.placement)
        .map_err(|e| format!("planning {at:?} for {} CTAs: {e}", req.ctas))
}

/// The placement of launch `at` for `req`'s load.
pub fn planned(req: &ChainRequest, at: LaunchAt) -> Result<ValidPlacement, String> {
    let (requests, build) = batch(req)?;
    plan(req, &requests, &build, at)
}

/// The chain of the first launch of each kind the config has, in step order.
pub fn kind_chains(req: &ChainRequest) -> Result<Vec<KindChain>, String> {
    let (requests, build) = batch(req)?;
    let mut out: Vec<KindChain> = Vec::new();
    let layers = req.config.num_hidden_layers;
    for at in (0..layers).map(LaunchAt::Layer).chain([LaunchAt::Tail]) {
        let kind = launch_kind(req.config, at).map_err(|e| e.to_string())?;
        if out.iter().any(|c| c.kind == kind) {
            continue;
        }
        out.push(KindChain {
            kind,
            at,
            hand_offs: plan(req, &requests, &build, at)?.hand_offs(),
        });
    }
    Ok(out)
}

/// The section's text: a line a kind, then the step's sum, given each kind's bytes floor (us) and
/// its count of launches in the step.
pub fn render_chains(
    req: &ChainRequest,
    chains: &[KindChain],
    floors: &[(LaunchKind, u64, f64)],
) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nhand-offs on each launch kind's longest chain (its first launch as planned for {} CTAs; {:.2} us a hand-off)",
        req.ctas, req.hand_off_us
    );
    let _ = writeln!(
        out,
        "  {:<26} {:>5} {:>9} {:>9} {:>9} {:>13}",
        "launch", "count", "hand-offs", "bytes us", "chain us", "in series us"
    );
    let (mut bytes_total, mut chain_total, mut both_total) = (0.0, 0.0, 0.0);
    for c in chains {
        let Some(&(_, count, floor)) = floors.iter().find(|f| f.0 == c.kind) else {
            continue;
        };
        let chain = c.hand_offs as f64 * req.hand_off_us;
        bytes_total += count as f64 * floor;
        chain_total += count as f64 * chain;
        both_total += count as f64 * (floor + chain);
        let _ = writeln!(
            out,
            "  {:<26} {:>5} {:>9} {:>9.1} {:>9.1} {:>13.1}",
            c.kind.name(),
            count,
            c.hand_offs,
            floor,
            chain,
            floor + chain
        );
    }
    let _ = writeln!(
        out,
        "step: bytes {:.1} us, chains {:.1} us; in series {:.1} us, {:.2} x the bytes floor",
        bytes_total,
        chain_total,
        both_total,
        if bytes_total > 0.0 {
            both_total / bytes_total
        } else {
            0.0
        }
    );
    out
}

/// Each kind's (kind, launches in the step, bytes floor in us) at `bandwidth` bytes a second.
pub fn kind_floors(
    launches: &[(model::traffic::LaunchTraffic, u64)],
    bandwidth: f64,
) -> Vec<(LaunchKind, u64, f64)> {
    launches
        .iter()
        .map(|(t, count)| (t.kind, *count, floor_us(t.total_bytes(), bandwidth)))
        .collect()
}
