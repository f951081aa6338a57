//! A picture of a timeline: one row per CTA, one bar per task coloured by its stage (shades of the
//! stage's colour for its own kinds), a time axis in microseconds and a legend; over several
//! launches, each launch's stretch marked and titled. Plain SVG text.

use super::Timeline;
use crate::task::{Stage, STAGE_SHIFT};

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 96.0;
const RIGHT: f64 = 24.0;
/// The height the CTA rows aim at; each row is kept between 3 and 18 pixels.
const ROWS_HEIGHT: f64 = 720.0;
/// Bars narrower than this are widened to it, so zero-length spans (shorter than the clock's tick)
/// stay visible.
const MIN_BAR: f64 = 0.6;
/// Past this many bars (a whole step's launches) the picture would run to megabytes: bars of one
/// kind on one CTA closer than [`MERGE_GAP`] pixels are drawn as one.
const MERGE_ABOVE: usize = 4000;
const MERGE_GAP: f64 = 0.5;

/// The SVG document of `t`.
pub fn svg(t: &Timeline) -> String {
    let kinds = t.kinds();
    let colours: Vec<(u32, String)> = kinds
        .iter()
        .map(|(k, _)| (*k, colour(*k, &kinds)))
        .collect();
    let fill = |kind: u32| {
        colours
            .iter()
            .find(|c| c.0 == kind)
            .map_or("#888888", |c| c.1.as_str())
    };
    let mut body = String::new();
    let mut w = |s: String| body.push_str(&s);
    w(format!(
        r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{}</text>"#,
        escape(&t.title)
    ));
    w(format!(
        r##"<text x="{LEFT}" y="40" font-size="11" fill="#444">{} CTAs, {} tasks, {:.2} us; time: {}</text>"##,
        t.ctas,
        t.bars.len(),
        t.end_us(),
        escape(&t.base.describe())
    ));
    // The legend, wrapped to the width.
    let (mut x, mut y) = (LEFT, 52.0);
    for (kind, label) in &kinds {
        let wide = 30.0 + 7.0 * label.chars().count() as f64;
        if x + wide > WIDTH - RIGHT && x > LEFT {
            x = LEFT;
            y += 18.0;
        }
        w(format!(
            r#"<rect class="key" x="{x}" y="{y}" width="12" height="12" fill="{}"/><text x="{}" y="{}" font-size="11">{}</text>"#,
            fill(*kind),
            x + 16.0,
            y + 10.0,
            escape(label)
        ));
        x += wide;
    }
    // Launch titles sit above the rows when there are several launches.
    let titled = t.sections.len() > 1;
    let top = y + if titled { 40.0 } else { 24.0 };
    let rows = t.ctas.max(1) as f64;
    let row = (ROWS_HEIGHT / rows).clamp(3.0, 18.0);
    let gap = if row >= 6.0 { 1.5 } else { 0.5 };
    let plot_w = WIDTH - LEFT - RIGHT;
    let span_us = t.end_us().max(1e-3);
    let x_of = |us: f64| LEFT + us / span_us * plot_w;
    // A row per CTA, alternate rows shaded, labels on every row when they fit, else every k-th.
    let label_every = (11.0 / row).ceil() as u32;
    for cta in 0..t.ctas {
        let y = top + cta as f64 * row;
        let shade = if cta % 2 == 1 { "#f2f2f2" } else { "#ffffff" };
        w(format!(
            r#"<rect class="row" x="{LEFT}" y="{y}" width="{plot_w}" height="{row}" fill="{shade}"/>"#
        ));
        if cta % label_every == 0 {
            w(format!(
                r#"<text x="{}" y="{:.1}" font-size="10" text-anchor="end">CTA {cta}</text>"#,
                LEFT - 6.0,
                y + row / 2.0 + 3.5
            ));
        }
    }
    let bottom = top + rows * row;
    if titled {
        draw_sections(t, &mut w, &x_of, top, bottom);
    }
    // Axis, ticks and faint grid lines.
    let step = nice_step(span_us / 8.0);
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    w(format!(
        r##"<line x1="{LEFT}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="#000"/>"##,
        WIDTH - RIGHT
    ));
    let mut tick = 0.0;
    while tick <= span_us * (1.0 + 1e-9) {
        let tx = x_of(tick);
        w(format!(
            r##"<line x1="{tx:.1}" y1="{top}" x2="{tx:.1}" y2="{bottom}" stroke="#ccc" stroke-width="0.5"/><line x1="{tx:.1}" y1="{bottom}" x2="{tx:.1}" y2="{}" stroke="#000"/><text x="{tx:.1}" y="{}" font-size="10" text-anchor="middle">{tick:.decimals$}</text>"##,
            bottom + 4.0,
            bottom + 16.0
        ));
        tick += step;
    }
    w(format!(
        r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">time after the {} first task start (us)</text>"#,
        LEFT + plot_w / 2.0,
        bottom + 32.0,
        if titled { "first launch's" } else { "launch's" }
    ));
    let merge = t.bars.len() > MERGE_ABOVE;
    for run in runs(t, merge, &x_of) {
        let first = &t.bars[run[0]];
        let last = &t.bars[run[run.len() - 1]];
        let s = &first.span;
        let x0 = x_of(first.start_us);
        let width = (x_of(last.end_us) - x0).max(MIN_BAR);
        let y = top + s.cta as f64 * row + gap / 2.0;
        let fill = fill(s.kind);
        if run.len() == 1 {
            // A thin white edge tells apart back-to-back tasks of one colour, on bars wide enough.
            let stroke = if width > 3.0 { 0.6 } else { 0.0 };
            w(format!(
                r#"<rect class="span" x="{x0:.2}" y="{y:.2}" width="{width:.2}" height="{:.2}" fill="{fill}" stroke="white" stroke-width="{stroke}"><title>{} (task {}) CTA {} SM {}: {:.3} .. {:.3} us</title></rect>"#,
                row - gap,
                escape(&first.name),
                s.order,
                s.cta,
                s.sm,
                first.start_us,
                first.end_us
            ));
        } else {
            w(format!(
                r#"<rect class="spans" x="{x0:.2}" y="{y:.2}" width="{width:.2}" height="{:.2}" fill="{fill}"><title>{} tasks of {} CTA {}: {:.3} .. {:.3} us</title></rect>"#,
                row - gap,
                run.len(),
                escape(&first.label),
                s.cta,
                first.start_us,
                last.end_us
            ));
        }
    }
    let height = bottom + 44.0;
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>{body}</svg>
"#
    )
}

/// Launch boundaries: a faint band under every other launch, a line at each launch's start, and
/// its title above the rows where it fits.
fn draw_sections(
    t: &Timeline,
    w: &mut impl FnMut(String),
    x_of: &dyn Fn(f64) -> f64,
    top: f64,
    bottom: f64,
) {
    for (i, s) in t.sections.iter().enumerate() {
        let (x0, x1) = (x_of(s.start_us), x_of(s.end_us));
        if i % 2 == 1 {
            w(format!(
                r##"<rect class="section" x="{x0:.2}" y="{}" width="{:.2}" height="{}" fill="#dde6f3" opacity="0.5"><title>{}</title></rect>"##,
                top - 14.0,
                (x1 - x0).max(MIN_BAR),
                bottom - top + 14.0,
                escape(&s.title)
            ));
        }
        w(format!(
            r##"<line x1="{x0:.2}" y1="{}" x2="{x0:.2}" y2="{bottom}" stroke="#446" stroke-width="0.5"/>"##,
            top - 14.0
        ));
        if x1 - x0 > 6.0 * s.title.chars().count() as f64 {
            w(format!(
                r#"<text x="{:.2}" y="{}" font-size="10">{}</text>"#,
                x0 + 2.0,
                top - 4.0,
                escape(&s.title)
            ));
        }
    }
}

/// The bars drawn as runs of indices into `t.bars`: one bar each, or with `merge`, consecutive
/// bars of one CTA and kind less than [`MERGE_GAP`] pixels apart as one run.
fn runs(t: &Timeline, merge: bool, x_of: &dyn Fn(f64) -> f64) -> Vec<Vec<usize>> {
    if !merge {
        return (0..t.bars.len()).map(|i| vec![i]).collect();
    }
    let mut order: Vec<usize> = (0..t.bars.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&t.bars[a], &t.bars[b]);
        (a.span.cta, a.start_us)
            .partial_cmp(&(b.span.cta, b.start_us))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let mut runs: Vec<Vec<usize>> = Vec::new();
    for i in order {
        let b = &t.bars[i];
        let joins = runs.last().is_some_and(|run| {
            let last = &t.bars[run[run.len() - 1]];
            last.span.cta == b.span.cta
                && last.span.kind == b.span.kind
                && x_of(b.start_us) - x_of(last.end_us) < MERGE_GAP
        });
        match runs.last_mut() {
            Some(run) if joins => run.push(i),
            _ => runs.push(vec![i]),
        }
    }
    runs
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

/// A hue per stage; a stage's own kinds get lighter shades of it, in kind order.
fn colour(kind: u32, kinds: &[(u32, String)]) -> String {
    let stage_bits = kind >> STAGE_SHIFT;
    let hue = match Stage::from_bits(stage_bits) {
        Some(Stage::Synthetic) => 210.0,
        Some(Stage::Indexer) => 28.0,
        Some(Stage::Select) => 125.0,
        Some(Stage::Linear) => 275.0,
        Some(Stage::Moe) => 355.0,
        Some(Stage::Mla) => 180.0,
        Some(Stage::Head) => 50.0,
        None => return "#888888".to_string(),
    };
    let same: Vec<u32> = kinds
        .iter()
        .map(|k| k.0)
        .filter(|k| k >> STAGE_SHIFT == stage_bits)
        .collect();
    let i = same.iter().position(|k| *k == kind).unwrap_or(0) as f64;
    let n = same.len().max(2) as f64 - 1.0;
    hsl(hue, 0.65, 0.38 + 0.32 * i / n)
}

fn hsl(h: f64, s: f64, l: f64) -> String {
    let c = (1.0 - (2.0 * l - 1.0).abs()) * s;
    let hp = h / 60.0;
    let x = c * (1.0 - (hp % 2.0 - 1.0).abs());
    let (r, g, b) = match hp as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    let byte = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    format!("#{:02x}{:02x}{:02x}", byte(r), byte(g), byte(b))
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}
