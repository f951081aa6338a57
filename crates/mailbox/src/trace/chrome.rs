//! The Chrome / Perfetto trace-event JSON of a timeline (opens in ui.perfetto.dev or
//! chrome://tracing): one process per launch (section) in time order, one track per CTA in it,
//! named with its SM, and a complete event per task.

use super::Timeline;
use serde_json::{json, Value};

/// The trace-event document of `t`; times in microseconds after the timeline's first start.
pub fn json(t: &Timeline) -> String {
    let mut events: Vec<Value> = Vec::new();
    for (pid, section) in t.sections.iter().enumerate() {
        events.push(json!({
            "name": "process_name", "ph": "M", "pid": pid, "tid": 0,
            "args": { "name": section.title },
        }));
        events.push(json!({
            "name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
            "args": { "sort_index": pid },
        }));
        let mut sm_of = vec![None; t.ctas as usize];
        for b in t.bars.iter().filter(|b| b.section as usize == pid) {
            if let Some(sm) = sm_of.get_mut(b.span.cta as usize) {
                *sm = Some(b.span.sm);
            }
        }
        for (cta, sm) in sm_of.iter().enumerate() {
            let Some(sm) = sm else { continue };
            events.push(json!({
                "name": "thread_name", "ph": "M", "pid": pid, "tid": cta,
                "args": { "name": format!("CTA {cta} (SM {sm})") },
            }));
            events.push(json!({
                "name": "thread_sort_index", "ph": "M", "pid": pid, "tid": cta,
                "args": { "sort_index": cta },
            }));
        }
    }
    for b in &t.bars {
        let s = &b.span;
        events.push(json!({
            "name": b.name,
            "cat": s.stage().map_or("unknown", |st| st.name()),
            "ph": "X",
            "pid": b.section,
            "tid": s.cta,
            "ts": to_ns(b.start_us),
            "dur": to_ns(b.end_us - b.start_us),
            "args": {
                "kind": b.label,
                "task": s.order,
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
