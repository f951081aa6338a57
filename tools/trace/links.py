#!/usr/bin/env python3
"""A launch kind's chain of links from a `mono trace` step.json.

A link is every task of one stage and kind in a launch whose names differ only in numbers (a head,
a slot, a tile range). For each launch kind, the median over its launches of: the link's tasks,
when the first of them starts and the last ends (us after the launch's first task), and how long
after the link that ends before it the last one ends. Prints a Markdown table per kind.

With --behind LINK (a link as the table names it), a second table per kind: for each link, the
tasks that started after LINK's last end, that is tasks whose CTA was still busy when LINK was
done (a task starts when the task before it on its CTA ends), how late the latest of them
started, and the links they ran behind. For a link that waits on LINK, these are the tasks the
placement held back.

With --uneven, a table per kind of the links of which some CTA holds at least two tasks more than
another CTA (a CTA with two of a link where another has none runs its second a whole task after
the rest): the most and the fewest a CTA holds, how many CTAs hold the most, and how long after
the link's median task end its last one ends.

With --slots, a table per MoE launch kind of its launches grouped by how many expert slots the
route filled: when the filled slots' last members end after the route (a member of a slot the
rows left empty publishes at once; one that streams its expert ends tens of us later, so a slot
counts as filled when a member ends more than FILLED_AFTER_US after the route).

    python3 tools/trace/links.py OUT/step.json [--kind 'MoE layer, shared indexer'] [--behind 'moe route'] [--slots] [--uneven]
    python3 tools/trace/links.py --self-test
"""
import argparse
import gzip
import json
import re
import statistics
import sys
from collections import defaultdict


def link_of(name):
    return re.sub(r"\d+", "#", re.sub(r" tiles \d+(\.\.\d+)?", " tiles", name))


def kind_of(process):
    return re.sub(r"^layer \d+ \((.*)\)$", r"\1", process)


def launch_events(events):
    """Each launch's kind and its task events."""
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    tasks = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            tasks[e["pid"]].append(e)
    for pid, evs in tasks.items():
        yield kind_of(names.get(pid, str(pid))), evs


def launches(events):
    for kind, evs in launch_events(events):
        t0 = min(e["ts"] for e in evs)
        links = defaultdict(list)
        ctas = defaultdict(list)
        for e in evs:
            links[link_of(e["name"])].append((e["ts"] - t0, e["ts"] + e["dur"] - t0))
            ctas[e["tid"]].append((e["ts"] - t0, e["ts"] + e["dur"] - t0, link_of(e["name"])))
        yield kind, links, [sorted(c) for c in ctas.values()]


# A slot whose member ends this long after the route streamed an expert.
FILLED_AFTER_US = 10.0


def filled_slots(events):
    """Per launch of a kind with a route: (kind, filled slots, the median and the last of their
    members' last ends, us after the route's end)."""
    for kind, evs in launch_events(events):
        route = [e["ts"] + e["dur"] for e in evs if e["name"].startswith("moe route")]
        if not route:
            continue
        slots = defaultdict(float)
        for e in evs:
            m = re.match(r"moe expert slot (\d+) ", e["name"])
            if m:
                slot = int(m.group(1))
                slots[slot] = max(slots[slot], e["ts"] + e["dur"] - route[0])
        ends = sorted(end for end in slots.values() if end > FILLED_AFTER_US)
        if ends:
            yield kind, len(ends), statistics.median(ends), ends[-1]


def print_slots(events, only):
    groups = defaultdict(list)
    for kind, filled, median, last in filled_slots(events):
        if not only or kind == only:
            groups[(kind, filled)].append((median, last))
    for kind in sorted({k for k, _ in groups}):
        print(f"\n{kind}: expert slots the route filled, and when their members end (us after the route)\n")
        print("| filled slots | launches | median slot's end | last slot's end |")
        print("|---|---|---|---|")
        for (k, filled), runs in sorted(groups.items()):
            if k == kind:
                median = statistics.median(m for m, _ in runs)
                last = statistics.median(l for _, l in runs)
                print(f"| {filled} | {len(runs)} | {median:.1f} | {last:.1f} |")


def held_back(runs, producer):
    """Per link: the median a launch of its tasks that started after `producer`'s last end, the
    median of the latest such start (us after that end), and the links they ran behind."""
    late = defaultdict(list)
    latest = defaultdict(list)
    after = defaultdict(lambda: defaultdict(int))
    every = set().union(*(links for links, _ in runs))
    for links, ctas in runs:
        if producer not in links:
            continue
        ready = max(e for _, e in links[producer])
        counts = defaultdict(int)
        worst = defaultdict(float)
        for tasks in ctas:
            for (_, _, before), (start, _, link) in zip(tasks, tasks[1:]):
                if start > ready:
                    counts[link] += 1
                    worst[link] = max(worst[link], start - ready)
                    after[link][before] += 1
        for link in every:
            late[link].append(counts[link])
            latest[link].append(worst[link])
    return {
        link: (statistics.median(late[link]), statistics.median(latest[link]), after[link])
        for link in late
        if statistics.median(late[link]) > 0
    }


def uneven(runs):
    """Per link whose tasks lie unevenly on some launch's CTAs (a CTA holds at least two more than
    another): the medians over those launches of the most and the fewest a CTA holds, of the CTAs
    holding the most, and of the last task's end after the median task's end (us)."""
    seen = defaultdict(list)
    for links, ctas in runs:
        for link, tasks in links.items():
            held = [sum(1 for _, _, l in c if l == link) for c in ctas]
            most, fewest = max(held), min(held)
            if most > fewest + 1:
                ends = sorted(e for _, e in tasks)
                seen[link].append((most, fewest, held.count(most), ends[-1] - statistics.median(ends)))
    return {
        link: tuple(statistics.median(r[i] for r in rows) for i in range(4)) + (len(rows),)
        for link, rows in seen.items()
    }


def self_test():
    """One launch on three CTAs: link `a` one task a CTA, link `b` two tasks on CTA 0 and none on
    CTA 2 (its second task a whole task late)."""
    def task(cta, name, start, end):
        return {"ph": "X", "pid": 0, "tid": cta, "name": name, "ts": start, "dur": end - start}

    one = [task(0, "a 0", 0, 5), task(1, "a 1", 0, 5), task(2, "a 2", 0, 6),
           task(0, "b 0", 5, 9), task(0, "b 1", 9, 13), task(1, "b 2", 5, 9)]
    events = [{"name": "process_name", "pid": 0, "args": {"name": "layer 3 (k)"}}] + one
    runs = [(links, ctas) for _, links, ctas in launches(events)]
    got = uneven(runs)
    assert set(got) == {"b #"}, got
    assert got["b #"] == (2, 0, 1, 4, 1), got
    # Negative control: with b's second task moved to CTA 2 the link is even, and nothing is listed.
    even = one[:4] + [task(2, "b 1", 6, 10), one[5]]
    events = events[:1] + even
    assert uneven([(links, ctas) for _, links, ctas in launches(events)]) == {}
    print("links.py self-test: 3 passed, 0 failed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", help="mono trace's step.json, or it gzipped (.gz)")
    ap.add_argument("--kind", help="only this launch kind")
    ap.add_argument("--behind", help="a link: the tasks that started after its last end")
    ap.add_argument("--slots", action="store_true", help="the MoE launches by expert slots filled")
    ap.add_argument("--uneven", action="store_true", help="the links whose tasks lie unevenly on the CTAs")
    ap.add_argument("--self-test", action="store_true", help="check the tables on a built-in trace")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return
    if not args.trace:
        ap.error("name mono trace's step.json")
    opener = gzip.open if args.trace.endswith(".gz") else open
    with opener(args.trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    if args.slots:
        print_slots(events, args.kind)
        return
    kinds = defaultdict(list)
    for kind, links, ctas in launches(events):
        kinds[kind].append((links, ctas))
    if args.kind and args.kind not in kinds:
        sys.exit(f"no launch of kind {args.kind!r}; kinds: {', '.join(sorted(kinds))}")
    for kind, both in kinds.items():
        if args.kind and kind != args.kind:
            continue
        runs = [links for links, _ in both]
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
        if args.uneven:
            found = uneven(both)
            print(f"\nLinks of which a CTA holds at least two tasks more than another (medians over the {len(runs)} launch(es) where one does):\n")
            print("| link | launches | most a CTA | fewest | CTAs with the most | last end after the median end (us) |")
            print("|---|---|---|---|---|---|")
            for link, (most, fewest, holders, tail, n) in sorted(found.items()):
                print(f"| {link} | {n} | {most:g} | {fewest:g} | {holders:g} | {tail:.1f} |")
        if args.behind:
            if not any(args.behind in r for r in runs):
                sys.exit(f"no link {args.behind!r} in {kind!r}; links: {', '.join(sorted(set().union(*runs)))}")
            print(f"\nTasks that started after {args.behind}'s last end (medians a launch):\n")
            print("| link | tasks | latest start after it (us) | behind (tasks, all launches) |")
            print("|---|---|---|---|")
            for link, (n, worst, after) in sorted(held_back(both, args.behind).items()):
                what = ", ".join(f"{b} {c}" for b, c in sorted(after.items(), key=lambda x: -x[1]))
                print(f"| {link} | {n:g} | {worst:.1f} | {what} |")


if __name__ == "__main__":
    main()
