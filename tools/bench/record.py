"""Benchmark records from the Python baselines, in the format of the Rust benches' `device::report`:
one JSON object a line, appended to the file named by MONO_BENCH_JSON (nothing is written when it is
unset). MONO_BENCH_COMMIT and MONO_BENCH_COMMAND name the run as they do for the Rust benches.
`tools/bench/benchmarks.py` turns the records into BENCHMARKS.md."""
import datetime
import json
import os
import sys


def keys_label(n: int) -> str:
    """A key count as cases name it: 8192 is "8K", 1048576 "1M", 300000 "300K"."""
    if n == 0:
        return "0"
    if n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n % (1 << 10) == 0:
        return f"{n >> 10}K"
    if n % 1000 == 0:
        return f"{n // 1000}K"
    return str(n)


def rows_label(rows: int) -> str:
    return "1 row" if rows == 1 else f"{rows} rows"


def append(table, case, what, figure, unit, device, floor=None, floor_how=None, baseline=None,
           baseline_name=None, note=None):
    """Appends one figure's record when MONO_BENCH_JSON is set; the ratio is over the floor when
    there is one, else over the baseline."""
    path = os.environ.get("MONO_BENCH_JSON")
    if not path:
        return
    over = [(floor, "floor"), (baseline, "baseline")]
    ratio, ratio_of = next(((figure / v, of) for v, of in over if v), (None, None))
    record = {
        "table": table, "case": case, "what": what, "figure": figure, "unit": unit,
        "floor": floor, "floor_how": floor_how, "baseline": baseline, "baseline_name": baseline_name,
        "ratio": ratio, "ratio_of": ratio_of,
        "command": os.environ.get("MONO_BENCH_COMMAND") or "python3 " + " ".join(sys.argv),
        "commit": os.environ.get("MONO_BENCH_COMMIT") or "unknown",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "device": device, "note": note,
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
