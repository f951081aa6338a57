//! The Chrome / Perfetto trace-event JSON of a timeline (opens in ui.perfetto.dev or
//! chrome://tracing): one track per CTA, named with its SM, and a complete event per task.

use super::Timeline;
use serde_json::{json, Value};

/// The trace-event document of `t`; times in microseconds after the launch's first start.
pub fn json(t: &Timeline) -> String {
    let mut sm_of = vec![None; t.ctas as usize];
    for b in &t.bars {
        if let Some(sm) = sm_of.get_mut(b.span.cta as usize) {
            *sm = Some(b.span.sm);
        }
    }
    let mut events: Vec<Value> = vec![json!({
        "name": "process_name", "ph": "M", "pid": 0, "tid": 0,
        "args": { "name": t.title },
    })];
    for (cta, sm) in sm_of.iter().enumerate() {
        let name = match sm {
            Some(sm) => format!("CTA {cta} (SM {sm})"),
            None => format!("CTA {cta}"),
        };
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": 0, "tid": cta,
            "args": { "name": name },
        }));
        events.push(json!({
            "name": "thread_sort_index", "ph": "M", "pid": 0, "tid": cta,
            "args": { "sort_index": cta },
        }));
    }
    for b in &t.bars {
        let s = &b.span;
        events.push(json!({
            "name": b.label,
            "cat": s.stage().map_or("unknown", |st| st.name()),
            "ph": "X",
            "pid": 0,
            "tid": s.cta,
            "ts": to_ns(b.start_us),
            "dur": to_ns(b.end_us - b.start_us),
            "args": {
                "task": s.order,
                "kind": s.kind,
                "position": s.position,
                "sm": s.sm,
                "ns": s.end_ns - s.start_ns,
                "cycles": s.end_cycles - s.start_cycles,
            },
        }));
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": { "title": t.title, "time base": t.base.describe() },
    })
    .to_string()
}

/// Microseconds kept to the nanosecond, so the file carries no float noise past the stamps.
fn to_ns(us: f64) -> f64 {
    (us * 1e3).round() / 1e3
}
