"""Writes BENCHMARKS.md from the benchmark records in tools/bench/results/*.jsonl.

A record is one JSON object a line, one figure each, as `device::report` (Rust benches) and
`tools/bench/record.py` (the PyTorch baselines) write them: table, case, what, figure, unit, floor
and floor_how, baseline and baseline_name (measured in the same run), ratio and ratio_of (the figure
over the floor when there is one, else over the baseline; either may be null), command, commit, date,
device, note.

    python3 tools/bench/benchmarks.py                 # rewrite BENCHMARKS.md from the records
    python3 tools/bench/benchmarks.py --take run.jsonl  # first merge a bench run's records
    python3 tools/bench/benchmarks.py --check          # fail if BENCHMARKS.md is not what the records give

--take puts each record of the run into results/<table>.jsonl in place of the record with the same
table, case and what (new ones go last), so the page always shows the latest figure of each; history
lives in git.
"""
import argparse
import json
import pathlib
import re
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "tools" / "bench" / "results"
PAGE = ROOT / "BENCHMARKS.md"
FIELDS = ["table", "case", "what", "figure", "unit", "floor", "floor_how", "baseline", "baseline_name",
          "ratio", "ratio_of", "command", "commit", "date", "device", "note"]
REQUIRED = ["table", "case", "what", "figure", "unit", "command", "commit", "date", "device"]

# The tables in page order, each with what its figures are; a table the records name that is not
# here goes last, without a description.
TABLES = [
    ("device", "The device layer's probes: our copy kernel's bandwidth (every floor on this page "
     "divides bytes by the copy bandwidth measured in its own run), a kernel build cold and from the "
     "on-disk cache, and one step's worth of launches issued directly or replayed from a graph."),
    ("mailbox hand-off", "A token passed around a ring of CTAs, ns per hop from the in-kernel global "
     "timer over about 20,000 hops, median of 7 runs: one box (one thread waits and puts), or a "
     "64-word row (a block-wide wait). The protocol polls relaxed; acquire polls are the baseline in "
     "the same run. Targets: one box at most 300 ns, a 64-word row at most 1 us."),
    ("indexer scoring", "Scoring a request's rows against its paged FP8 index keys (GLM-5 shapes, "
     "32 heads x 128, 64-token pages, 132 B a key). Single launch: the L2 flushed before it, median of "
     "30. In a graph: 6 launches back to back in one captured graph, per launch. Overlapped: the same, "
     "each launch overlapping the one before it (programmatic dependent launch). Baselines: our copy "
     "kernel moving the floor's bytes (half read, half written) timed the same way, and PyTorch eager "
     "(`tools/bench/indexer_torch.py`). Targets: at most 1.5 x the floor at 128K keys and above; 4 "
     "rows of one request at most 1.3 x one row."),
    ("indexer scoring, mma.sync", "The two scorers for GPUs without wgmma (bf16 queries against keys "
     "widened to f16, and FP8 queries against the keys as cached, both on mma.sync), single launches "
     "timed as above, with the wgmma scorer of the same call as the baseline."),
    ("select", "The exact top-2048 of fp32 score rows (random scores). Each case is a captured graph "
     "of 20 selects (4 for one-CTA rows past 128K), the median us per select, every output checked "
     "exact against the reference. Overlapped: each launch overlapping the one before it (the "
     "library's default for the registers and one-CTA kernels); plain: without. torch.topk: "
     "`tools/bench/select_torch.py`, a graph of 20 calls, same call. Targets: 8K x 4 rows at most "
     "5 us, 128K x 4 rows at most 12 us."),
    ("select, launch floor", "What a select launch costs when it has nothing to select (rows of "
     "exactly k keys), same call as the select table."),
    ("fused front half", "A full-indexer layer's front half (index key and query of the step's new "
     "rows, scoring runs, top-2048 of every row) as one fused launch, GLM-5 shapes, one request. A step "
     "is the epoch node and the cooperative fused launch; the median of 30 graph replays of 6 steps "
     "back to back, each on its own copy of the cache, the L2 flushed before each replay, per step. "
     "Baseline: the standalone indexer and select launches (each with its epoch node) replayed the "
     "same way. Where the time goes is in `crates/executor/PERF.md` (the bench's timeline). Targets: "
     "at most 0.75 x the standalone pair at 128K and 512K, 128K x 4 rows in at most 16 us."),
    ("linear (GLM-5.2 TP8 rank's matrices)", "The linear task (`kernels/ops/linear.h`) on a "
     "GLM-5.2 TP8 rank's FP8 matrices (`cargo bench -p linear --bench gpu`): one matrix, a chain of "
     "four each waiting on the one before, or the nine expert slices and the router of one MoE layer, "
     "as graph replays with the weights cold in L2. Beside it, in the same run: a copy kernel moving "
     "the same bytes in the same launch mode, the floor, and PyTorch's bf16 `F.linear` over the same "
     "shapes (`tools/bench/linear_torch.py`: bf16 weights, twice the bytes, as PyTorch has no "
     "128 x 128 block-scaled FP8 matmul), eager and replayed from one CUDA graph; eager PyTorch at "
     "these sizes waits on the host's kernel launches, so it varies from run to run. Target: at most "
     "1.1 x the copy."),
    ("MoE layer, fused launch", "One MoE layer of a GLM-5.2 TP8 rank (router, route, the shared "
     "expert, every expert the rows chose, the combine) as one fused launch (`cargo bench -p executor "
     "--bench moe`), graph replays with the weights cold in L2; beside it the copy of the same bytes "
     "and the floor, and PyTorch eager (`tools/bench/moe_torch.py`: a transformers-style module, the "
     "chosen experts read back to the host and looped over, bf16 weights). Target: at most 1.15 x the "
     "copy at 1 row."),
    ("mla attention", "The sparse MLA attention tasks alone (cache write, splits, combines) at GLM-5 "
     "TP8 shapes, 8 heads, 2048 FP8 records a row (`cargo bench -p mla --bench gpu`), graph replays, "
     "the cache cold in L2, in several cuts of the work; the launch's own cost and the in-launch span "
     "are in the notes. Beside it PyTorch (`tools/bench/mla_torch.py`: gather, dequantise, the "
     "scores, an fp32 softmax, the weighted latents), eager and from one CUDA graph. Targets: at most "
     "5 us at 1 row, 8 us at 4 verify rows."),
    ("attention half", "The attention half of a layer (norm, q_a, q_b, rope, W_UK, kv_a, the cache "
     "write, the sparse attention, W_UV, o_proj and the residual) as one fused launch at GLM-5 TP8 "
     "shapes (`cargo bench -p executor --bench half`). Target: at most 1.3 x a copy kernel moving the "
     "same bytes in the same launch mode."),
    ("head tail", "The tail of a GLM-5.2 TP8 rank as one fused launch (`cargo bench -p executor --bench "
     "head`): the final norm, lm_head's shard (19360 x 6144 bf16), the argmax as (logit, token) pairs "
     "and the pick, with its epoch node; six launches a graph, each on its own copy of the weights, "
     "L2 flushed before each replay. The floor is the weight bytes over the copy bandwidth; the "
     "baseline a copy kernel moving the same bytes in the same graph mode."),
    ("head dense MLP", "The dense MLP of a GLM-5.2 TP8 rank as one fused launch: the post-attention "
     "norm, FP8 gate/up (2 x 1536 x 6144) with SwiGLU, then down (6144 x 1536) with the residual, "
     "measured as the tail is."),
    ("dependent reads", "The floor of a fused launch's chain of links (`cargo bench -p executor "
     "--bench chain`, `device::probes::ReadChain`): the bytes each link of a GLM-5.2 TP8 MoE "
     "shared-indexer launch reads (weights, each row's cache records), read by a plain kernel of one "
     "512-thread CTA an SM (or 2 and 4), link after link, each handed to the next through a "
     "grid-wide count with the next link's first loads issued before its wait; beside it the same "
     "bytes as one link, links with no bytes (the hand-offs and the launch alone), and the four links "
     "of the linear bench's chain. Direct launches, event-timed, median of 20, so the launch's own "
     "~4.6 us is in every figure, as in the step table's launch kinds; before each, the L2 flushed "
     "by reading 256 MB of another buffer (clean lines, as a step's launch finds the L2 after "
     "launches that mostly read). \"The L2 flushed by a memset\": a 256 MB memset instead, which "
     "leaves dirty lines whose write-back the launch pays. \"The TLBs swept first\": the read "
     "flush, then a load every 64 KB of a 32 GB region (`device::pages::PageSweep`), so that every "
     "link finds its pages' translations gone. What it says of the step is in "
     "`crates/executor/PERF.md`."),
    ("instruction cache", "What code out of the SM's instruction cache costs (`tools/probes/icache.cu`): "
     "one CTA runs a straight-line block of N KB of code at once again (the baseline: in the cache), "
     "and again after 128 KB of other code has run (the figure), while the other SMs do nothing, "
     "stream HBM as a fused launch's weight links do, or stream with the probe's own SM; the median "
     "of five launches, us. A block that no other code evicted ran as fast in the next launch as at "
     "once: the cache keeps a kernel's code from launch to launch. Why it matters to the fused "
     "launches: `crates/executor/PERF.md`, \"The instruction cache\"."),
    ("address translation", "How many pages the TLBs keep and what a page past them costs (`cargo "
     "bench -p device --bench pages`, `device::pages::PageChase`): one thread walks n elements a "
     "stride apart, each load waiting on the one before (device scope: from L2 or memory), in an "
     "order no prefetcher follows; the walk is warmed once, then timed. While its pages fit the "
     "TLBs a load costs an L2 hit; past each level's reach it adds that level's miss. A GLM-5.2 TP8 "
     "rank's step reads about 7 GB at 1 row from a ~93 GB arena."),
    ("step", "The whole decode step of one GLM-5.2 TP8 rank on one GPU (`mono bench`): the epoch node, "
     "one fused launch a layer (78) and the tail, and the greedy feed, captured as one graph; "
     "synthetic FP8 weights made on the device, hashed FP8 caches holding the context. The cross-rank "
     "all-reduce is not in it (one GPU holds one rank). The step figure is the median of graph "
     "replays; the floor is the bytes every launch must move (`model::traffic`: weights, cache reads "
     "and writes, and the routed experts the rows chose, read back launch by launch from one more "
     "step; the notes give the floor with every expert the rows may touch) over the copy bandwidth "
     "of the same run. Each launch kind's figure is the median of its launches in one step launched "
     "directly, events between launches. Where the time goes and every idea tried: "
     "`crates/executor/PERF.md`; the per-CTA timeline of each launch kind's first launch at `9067aca`, 1 row, "
     "on an H100 (`mono trace ... --layers 40`): [step-trace.svg](step-trace.svg). Targets: the step at most 1.5 x its floor "
     "at 1 row, 1.6 x at 4 rows. Anchors, whole systems serving a token at TP8 with their "
     "all-reduces (not measured here): vLLM on 8 x H200 at batch 1 about 19 ms a token, TileRT on "
     "8 x B200 about 3.3 ms, AMD's sgl-amd-mono monokernel on 8 x MI355X 4.4 ms; a rank's step "
     "here leaves out the two all-reduces a layer that theirs include. Cases named \"40 layers\" "
     "are the model's first 40 layers and its head (`--layers 40`) on an H100, which cannot hold "
     "the whole rank: not the step's figure, their ratios over the H100's own copy bandwidth, "
     "their launch kinds comparable with the H200's rows above only loosely (another GPU)."),
]

INTRO = """# Benchmarks

The current figure of every kernel and launch, the latest measured of code that exists, with its
floor or a baseline measured in the same run, the command, the commit and the date. Written by
`tools/bench/benchmarks.py` from the records in `tools/bench/results/`; edit those, not this page.
Earlier figures are in git. Why each kernel is shaped as it is, and every idea tried on it, is in
the stage's PERF.md (`crates/indexer/PERF.md`, `crates/select/PERF.md`).

Floors are bytes a launch must move over the copy bandwidth measured in the same run; a cell reads
`figure (ratio)`, the ratio being over the floor where the table has one, else over the baseline.
"""

REPRODUCE = """## How to reproduce

The GPU machine needs no Rust: build here, run there. `bash tools/bench/stage.sh .gpu` builds `mono`
and every GPU bench (`cargo bench -p device --bench probes --no-run`, likewise `-p indexer --bench
gpu`, `-p select --bench gpu`, `-p linear --bench gpu`, `-p mla --bench gpu`, `-p executor --bench
front` / `moe` / `half` / `head` / `chain`, and the mailbox figures' `cargo test --release -p mailbox
--test gpu --no-run`) and puts stripped copies in `.gpu/`. With those and the repository on the GPU
machine:

```sh
MONO_BENCH_COMMIT=<the commit built> bash tools/bench/run.sh .gpu run          # every table
MONO_BENCH_COMMIT=<the commit built> bash tools/bench/run.sh .gpu run step trace linear moe
```

Each job writes `run/<job>.jsonl` (the PyTorch baselines, `tools/bench/*_torch.py`, as
`run/<job>-torch.jsonl`); `step` is `mono bench --preset glm-5.2 --tp 8 --contexts 8192,131072
--rows 1,4 --replays 20`, `trace` the 8K x 1 row `mono trace` whose `kinds.svg` is the picture
beside this page. `MONO_RUN_SECONDS`, where set, bounds the run, so that a run with a time limit
still leaves the records of the jobs that finished.

A bench that flushes the L2 before a timed launch reads 256 MB of a buffer of its own
(`device::probes::L2Flush`); `MONO_L2_FLUSH=memset` flushes by a memset instead, which leaves dirty
lines that the timed launch writes back (`crates/executor/PERF.md` has what that costs each bench).

Then, back in the repository: `python3 tools/bench/benchmarks.py --take run/<job>.jsonl` merges a run's
records into `tools/bench/results/` (each replaces the record of the same table, case and what) and
rewrites this page; `--check` fails when the page is not what the records give.
"""


def load(path):
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            sys.exit(f"{path}:{n}: not JSON: {e}")
        missing = [f for f in REQUIRED if record.get(f) is None]
        unknown = [f for f in record if f not in FIELDS]
        if missing or unknown:
            sys.exit(f"{path}:{n}: missing {missing}, unknown {unknown}")
        records.append({f: record.get(f) for f in FIELDS})
    return records


def load_all():
    """Every record of the results, each in its table's file (where --take puts it) and its key
    once: a record elsewhere would show beside, or instead of, the one --take replaces."""
    records, seen = [], {}
    for path in sorted(RESULTS.glob("*.jsonl")):
        for record in load(path):
            if path.name != f"{slug(record['table'])}.jsonl":
                sys.exit(f"{path}: holds a record of table {record['table']!r}, whose file is "
                         f"{slug(record['table'])}.jsonl")
            if key(record) in seen:
                sys.exit(f"{path}: {key(record)} is there twice")
            seen[key(record)] = path
            records.append(record)
    return records


def slug(table):
    return re.sub(r"[^a-z0-9]+", "-", table.lower()).strip("-")


def key(record):
    return (record["table"], record["case"], record["what"])


def take(run_path):
    """Merges a run's records into the results files, each in place of its namesake."""
    for record in load(run_path):
        path = RESULTS / f"{slug(record['table'])}.jsonl"
        kept = load(path) if path.exists() else []
        for i, old in enumerate(kept):
            if key(old) == key(record):
                kept[i] = record
                break
        else:
            kept.append(record)
        path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")


def number(x):
    if x is None:
        return ""
    if abs(x) >= 100:
        return f"{x:.1f}"
    return f"{x:.2f}"


def cell(record, mixed):
    text = number(record["figure"])
    if record["ratio"] is not None:
        text += f" ({record['ratio']:.2f}x" + (f" {record['ratio_of']})" if mixed else ")")
    return text


def ratio_kinds(records):
    return set(r["ratio_of"] for r in records if r["ratio"] is not None)


def row(values):
    return "| " + " | ".join(values) + " |"


def runs_line(records):
    """The runs behind a table: commit, date, device and the commands."""
    lines = []
    for run in dict.fromkeys((r["commit"], r["date"], r["device"]) for r in records):
        commands = dict.fromkeys(r["command"] for r in records
                                 if (r["commit"], r["date"], r["device"]) == run)
        lines.append(f"Commit `{run[0]}`, {run[1]}, {run[2]}: "
                     + "; ".join(f"`{c}`" for c in commands) + ".")
    return lines


def notes(records):
    out, seen = [], set()
    for how in dict.fromkeys(r["floor_how"] for r in records if r["floor_how"]):
        out.append(f"Floor: {how}.")
    kinds = ratio_kinds(records)
    if len(kinds) == 1:
        out.append(f"Ratios: the figure over the {kinds.pop()}.")
    for r in records:
        if r["note"] and (r["case"], r["what"], r["note"]) not in seen:
            seen.add((r["case"], r["what"], r["note"]))
            out.append(f"{r['case']}, {r['what']}: {r['note']}")
    return out


def pivot(records):
    """Cases down, whats across: for tables whose variants repeat over several cases."""
    cases = list(dict.fromkeys(r["case"] for r in records))
    # Our own figures first, then the PyTorch baselines, however the records came in: a variant
    # taken into a table later would otherwise land after the baselines' columns.
    baseline_whats = {r["what"] for r in records if "_torch.py" in r["command"]}
    whats = sorted(dict.fromkeys(r["what"] for r in records), key=lambda w: w in baseline_whats)
    baselines = list(dict.fromkeys(r["baseline_name"] for r in records if r["baseline_name"]))
    units = dict.fromkeys(r["unit"] for r in records)
    unit = next(iter(units)) if len(units) == 1 else None
    commits = dict.fromkeys(r["commit"] for r in records)
    has_floor = any(r["floor"] is not None for r in records)
    head = ["case"] + (["commit"] if len(commits) > 1 else []) + (["floor"] if has_floor else [])
    head += whats + baselines
    lines = [row(head if unit is None else [f"{h} ({unit})" if h not in ("case", "commit") else h
                                             for h in head]),
             row(["---"] * len(head))]
    by = {(r["case"], r["what"]): r for r in records}
    for case in cases:
        mine = [r for r in records if r["case"] == case]
        values = [case]
        if len(commits) > 1:
            values.append(", ".join(f"`{c}`" for c in dict.fromkeys(r["commit"] for r in mine)))
        if has_floor:
            values.append(number(next((r["floor"] for r in mine if r["floor"] is not None), None)))
        mixed = len(ratio_kinds(records)) > 1
        values += [cell(by[(case, w)], mixed) if (case, w) in by else "" for w in whats]
        for b in baselines:
            values.append(number(next((r["baseline"] for r in mine if r["baseline_name"] == b), None)))
        lines.append(row(values))
    return lines


def listing(records):
    """One record a line: for tables whose cases each have their own variants."""
    commits = dict.fromkeys(r["commit"] for r in records)
    head = ["case", "what", "figure", "unit", "floor", "baseline", "ratio"]
    head += ["commit"] if len(commits) > 1 else []
    lines = [row(head), row(["---"] * len(head))]
    for r in records:
        baseline = f"{number(r['baseline'])} ({r['baseline_name']})" if r["baseline_name"] else ""
        ratio = f"{r['ratio']:.2f} ({r['ratio_of']})" if r["ratio"] is not None else ""
        values = [r["case"], r["what"], number(r["figure"]), r["unit"], number(r["floor"]), baseline,
                  ratio]
        values += [f"`{r['commit']}`"] if len(commits) > 1 else []
        lines.append(row(values))
    return lines


def page(records):
    known = [name for name, _ in TABLES]
    described = dict(TABLES)
    names = known + [t for t in dict.fromkeys(r["table"] for r in records) if t not in known]
    out = [INTRO]
    for name in names:
        mine = [r for r in records if r["table"] == name]
        if not mine:
            continue
        out.append(f"## {name}\n")
        if name in described:
            out.append(textwrap.fill(described[name], 100) + "\n")
        out.append("\n".join(textwrap.fill(line, 100) for line in runs_line(mine)) + "\n")
        repeated = len({r["what"] for r in mine}) < len({(r["case"], r["what"]) for r in mine})
        out.append("\n".join(pivot(mine) if repeated else listing(mine)) + "\n")
        extra = notes(mine)
        if extra:
            out.append("\n".join(f"- {n}" for n in extra) + "\n")
    out.append(REPRODUCE)
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--take", type=pathlib.Path, action="append", default=[],
                        help="a bench run's records to merge into the results first")
    parser.add_argument("--check", action="store_true",
                        help="fail if BENCHMARKS.md differs from what the records give")
    args = parser.parse_args()
    for run in args.take:
        take(run)
    records = load_all()
    text = page(records)
    if args.check:
        if PAGE.read_text(encoding="utf-8") != text:
            sys.exit("BENCHMARKS.md is not what tools/bench/results/ gives: "
                     "run python3 tools/bench/benchmarks.py")
        return
    PAGE.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
