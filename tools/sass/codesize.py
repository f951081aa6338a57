#!/usr/bin/env python3
"""Where a kernel's code goes: its instructions' bytes by source site, so that the code a task runs
can be weighed against the SM's instruction cache. While every SM streams HBM, code that is not in
that cache costs about a microsecond a kilobyte to fetch (`tools/probes/icache.cu`;
crates/executor/PERF.md, "The instruction cache").

    mono kernels --target sm_90a --only fused_layer_moe_shared --out /tmp/k
    nvdisasm -gi /tmp/k/sm_90a/*.cubin | python3 tools/sass/codesize.py --under fused_layer_moe_shared.hip
    nvdisasm -gi /tmp/k/sm_90a/*.cubin | python3 tools/sass/codesize.py --under lin_task.h:225 --depth 2

A row is a site: the `--depth` frames just inside the innermost frame that `--under` names (a
`file:line`, or a file for its innermost line), outermost first; without `--under`, the outermost
frames. Beside it its KB (16 bytes an instruction), its share of the kernel's code, and the runs of
consecutive addresses it spans: a site the compiler copied (inlined in several places, or a loop
unswitched) shows as more runs than its source suggests. Instructions outside the named frame are
left out.
"""
import argparse
import sys
from collections import defaultdict

from spills import NV_SAMPLE, parse


def frames_under(site, under, depth):
    """The `depth` frames inside the innermost one `under` names (site is innermost first), or
    None where no frame is under it."""
    outer_first = list(reversed(site))
    if not under:
        return tuple(outer_first[:depth])
    named = [i for i, f in enumerate(outer_first) if f == under or f.split(":")[0] == under]
    if not named:
        return None
    return tuple(outer_first[named[-1] + 1:named[-1] + 1 + depth])


def report(lines, under, depth, gap=256):
    """Rows (bytes, runs, site), largest first, and the kernel's bytes."""
    insts, _, _ = parse(lines)
    size, runs, last = defaultdict(int), defaultdict(int), {}
    for address, _, site in insts:
        key = frames_under(site, under, depth)
        if key is None:
            continue
        size[key] += 16
        if key not in last or address - last[key] > gap:
            runs[key] += 1
        last[key] = address
    rows = sorted(((b, runs[k], " > ".join(k) or "(the frame itself)") for k, b in size.items()), reverse=True)
    return rows, 16 * len(insts)


def self_test():
    """The weigher on spills.py's sample disassembly: six instructions, three sites."""
    lines = NV_SAMPLE.splitlines()
    rows, total = report(lines, None, 1)
    assert total == 96 and rows == [(48, 1, "linear.h:736"), (32, 1, "mla_attn.h:618"), (16, 1, "prelude.h:10")], rows
    rows, _ = report(lines, "linear.h:736", 1)
    assert rows == [(48, 1, "linear.h:501")], rows
    # Negative controls: a frame no instruction is under weighs nothing, and a site whose
    # instructions lie far apart counts as two runs.
    assert report(lines, "linear.h:999", 1)[0] == []
    rows, _ = report(NV_SAMPLE.replace("/*0050*/", "/*1050*/").splitlines(), "mla_attn.h", 0)
    assert rows == [(32, 2, "(the frame itself)")], rows
    print("codesize.py self-test: 4 passed, 0 failed")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--under", help="a frame (file:line, or a file): the sites just inside it")
    ap.add_argument("--depth", type=int, default=1, help="frames a site names (default 1)")
    ap.add_argument("--top", type=int, default=30, help="rows to print (default 30)")
    ap.add_argument("--self-test", action="store_true", help="check the weigher on a built-in sample")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return
    rows, total = report(sys.stdin, args.under, args.depth)
    if not total:
        sys.exit("no instructions read: pipe in `nvdisasm -gi IMAGE.cubin`")
    print(f"{total / 1024:.1f} KB of code ({total // 16} instructions)")
    print("| KB | share | runs | site |\n|---|---|---|---|")
    for size, n, site in rows[: args.top]:
        print(f"| {size / 1024:.1f} | {100 * size / total:.1f} % | {n} | {site} |")


if __name__ == "__main__":
    main()
