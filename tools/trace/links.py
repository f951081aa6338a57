#!/usr/bin/env python3
"""A launch kind's chain of links from a `mono trace` step.json.

A link is every task of one stage and kind in a launch whose names differ only in numbers (a head,
a slot, a tile range). For each launch kind, the median over its launches of: the link's tasks,
when the first of them starts and the last ends (us after the launch's first task), and how long
after the link that ends before it the last one ends. Prints a Markdown table per kind.

    python3 tools/trace/links.py OUT/step.json [--kind 'MoE layer, shared indexer']
"""
import argparse
import json
import re
import statistics
import sys
from collections import defaultdict


def link_of(name):
    return re.sub(r"\d+", "#", re.sub(r" tiles \d+(\.\.\d+)?", " tiles", name))


def kind_of(process):
    return re.sub(r"^layer \d+ \((.*)\)$", r"\1", process)


def launches(events):
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    tasks = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            tasks[e["pid"]].append(e)
    for pid, evs in tasks.items():
        t0 = min(e["ts"] for e in evs)
        links = defaultdict(list)
        for e in evs:
            links[link_of(e["name"])].append((e["ts"] - t0, e["ts"] + e["dur"] - t0))
        yield kind_of(names.get(pid, str(pid))), links


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--kind", help="only this launch kind")
    args = ap.parse_args()
    with open(args.trace) as f:
        events = json.load(f)["traceEvents"]
    kinds = defaultdict(list)
    for kind, links in launches(events):
        kinds[kind].append(links)
    if args.kind and args.kind not in kinds:
        sys.exit(f"no launch of kind {args.kind!r}; kinds: {', '.join(sorted(kinds))}")
    for kind, runs in kinds.items():
        if args.kind and kind != args.kind:
            continue
        rows = []
        for link in set().union(*runs):
            seen = [r[link] for r in runs if link in r]
            med = lambda f: statistics.median(f(s) for s in seen)
            rows.append((med(lambda s: max(e for _, e in s)), med(lambda s: min(b for b, _ in s)), med(len), link))
        rows.sort()
        span = statistics.median(max(e for s in r.values() for _, e in s) for r in runs)
        print(f"\n{kind}: {len(runs)} launch(es), {span:.1f} us from the first task to the last (medians)\n")
        print("| link | tasks | first start | last end | after the link before |")
        print("|---|---|---|---|---|")
        before = None
        for end, start, n, link in rows:
            gap = "" if before is None else f"{end - before:.1f}"
            print(f"| {link} | {n:g} | {start:.1f} | {end:.1f} | {gap} |")
            before = end


if __name__ == "__main__":
    main()
