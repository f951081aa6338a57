#!/usr/bin/env python3
"""Where a kernel's warps wait, by source site: Nsight Compute's PC samples of one launch (its
source page as CSV) joined to the line table of the same image (`nvdisasm -gi`), so that each stall
reason's samples read as the frames they fell in.

    ncu --replay-mode application --cache-control none --clock-control none -k regex:mono_layer \\
        --launch-skip 46 --launch-count 1 --section SourceCounters -o /tmp/src \\
        mono dump --preset glm-5.2 --tp 8 --rows 1 --out /tmp/d          # on the GPU machine
    ncu -i /tmp/src.ncu-rep --page source --csv --print-source sass > stalls.csv
    mono kernels --target sm_90a --only fused_layer_moe_shared --out /tmp/k   # here: the same image
    nvdisasm -gi /tmp/k/sm_90a/*.cubin > /tmp/k/listing.sass
    python3 tools/sass/stalls.py stalls.csv /tmp/k/listing.sass --under fused_layer_moe_shared.hip

(`tools/bench/run.sh`'s `stalls` job runs the first two. `--launch-skip 46` is a MoE shared-indexer
launch of a glm-5.2 step. Where this machine's NVRTC and the GPU machine's build the same image,
the addresses agree, as they did for CUDA 13.0 on both; the join checks every instruction's opcode
and refuses a listing that differs.) The second file is `nvdisasm -gi` of the cubin. For each
reason (`--reason`, repeatable; default: no instruction, barrier, a load in flight) the total of
its samples, its share of all samples and its largest sites; a site is the `--depth` innermost
frames under the frame `--under` names (see codesize.py). With `--executed`, instead: the code
the launch ran (the column `Instructions Executed`), by site as codesize.py names them (the `--depth`
outermost frames inside `--under`): each site's bytes in the image, the bytes of its instructions
that ran at least once and the 128-byte lines they lie in, which is what the instruction cache had
to hold.
"""
import argparse
import csv
import sys

from codesize import frames_under
from spills import NV_SAMPLE, opcode, parse

DEFAULT_REASONS = ["stall_no_inst", "stall_barrier", "stall_long_sb"]
ALL = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
LINE = 128  # bytes of an instruction-cache line


def read_samples(lines):
    """(offset from the kernel's first instruction, SASS text, {column: value}) of every row of
    ncu's source page."""
    rows = list(csv.reader(lines))
    header = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    names = rows[header]
    out, base = [], None
    for r in rows[header + 1:]:
        if len(r) != len(names) or not r[0].startswith("0x"):
            continue
        address = int(r[0], 16)
        base = address if base is None else base
        values = {}
        for name, v in zip(names[2:], r[2:]):
            try:
                values[name] = float(v.replace(",", ""))
            except ValueError:
                pass
        out.append((address - base, r[1].strip(), values))
    return out


def join(samples, listing):
    """Each sample row with its site from the listing; an error where an opcode differs."""
    insts, _, _ = parse(listing)
    by_address = {a: (text, site) for a, text, site in insts}
    joined = []
    for offset, text, values in samples:
        if offset not in by_address:
            raise ValueError(f"ncu's instruction at +{offset:#x} is not in the listing: another image?")
        listed, site = by_address[offset]
        if opcode(listed) != opcode(text):
            raise ValueError(f"+{offset:#x}: ncu has {opcode(text)}, the listing {opcode(listed)}: another image?")
        joined.append((offset, site, values))
    return joined


def report(joined, reasons, under, depth):
    """{reason: (total, share of all samples, [(samples, site)] largest first)}."""
    everything = sum(v.get(ALL, 0.0) for _, _, v in joined)
    out = {}
    for reason in reasons:
        by, total = {}, 0.0
        for _, site, values in joined:
            n = values.get(reason, 0.0)
            if not n:
                continue
            total += n
            key = frames_under(site, under, len(site))
            key = "outside" if key is None else " > ".join(key[-depth:]) or "(the frame itself)"
            by[key] = by.get(key, 0.0) + n
        out[reason] = (total, total / everything if everything else 0.0, sorted(((n, k) for k, n in by.items()), reverse=True))
    return out


def executed(joined, under, depth):
    """Rows (bytes run, bytes of their lines, bytes in the image, site), most run first, and the
    totals (bytes run, bytes of their lines, bytes in the image). A site's lines count every
    line one of its run instructions lies in, so sites sharing a line each count it."""
    if joined and not any(EXECUTED in v for _, _, v in joined):
        raise ValueError(f"the CSV has no column '{EXECUTED}': collect it with --section SourceCounters")
    run, lines, image = {}, {}, {}
    all_lines = set()
    for offset, site, values in joined:
        key = frames_under(site, under, depth)
        key = "outside" if key is None else " > ".join(key) or "(the frame itself)"
        image[key] = image.get(key, 0) + 16
        if values.get(EXECUTED, 0.0) > 0:
            run[key] = run.get(key, 0) + 16
            lines.setdefault(key, set()).add(offset // LINE)
            all_lines.add(offset // LINE)
    rows = sorted(((run.get(k, 0), LINE * len(lines.get(k, ())), b, k) for k, b in image.items()), reverse=True)
    return rows, (sum(run.values()), LINE * len(all_lines), 16 * len(joined))


SAMPLE_CSV = """\
"Kernel Name","k",
"Address","Source","Warp Stall Sampling (All Samples)","stall_no_inst","stall_barrier","stall_long_sb","Instructions Executed"
"0x7f0000000000","      MOV R1, c[0x0][0x28]","2","2","0","0","4"
"0x7f0000000010","      LDL R19, [R1+0xa8]","5","0","0","5","12"
"0x7f0000000020","      FFMA R2, R3, R4, R2","1","1","0","0","12"
"0x7f0000000030","  @P0 BRA `(.L_x_1)","0","0","0","0","12"
"0x7f0000000040","      STL [R1+0x10], R3","2","0","2","0","0"
"0x7f0000000050","      EXIT","0","0","0","0","4"
"""


def self_test():
    joined = join(read_samples(SAMPLE_CSV.splitlines()), NV_SAMPLE.splitlines())
    got = report(joined, DEFAULT_REASONS, None, 1)
    assert got["stall_no_inst"] == (3.0, 0.3, [(2.0, "prelude.h:10"), (1.0, "linear.h:501")]), got
    assert got["stall_long_sb"][2] == [(5.0, "linear.h:501")], got
    assert got["stall_barrier"][2] == [(2.0, "mla_attn.h:618")], got
    # Negative control: a listing of another image (an opcode moved) is refused, not joined.
    try:
        join(read_samples(SAMPLE_CSV.replace("FFMA", "FMUL").splitlines()), NV_SAMPLE.splitlines())
    except ValueError:
        pass
    else:
        raise AssertionError("a listing of another image was joined")
    rows, totals = executed(joined, None, 1)
    assert rows == [(48, 128, 48, "linear.h:736"), (16, 128, 32, "mla_attn.h:618"), (16, 128, 16, "prelude.h:10")], rows
    assert totals == (80, 128, 96), totals
    # Negative control: a CSV without the column is refused rather than read as nothing run.
    bare = "\n".join(",".join(line.split(",")[:-1]) for line in SAMPLE_CSV.splitlines())
    try:
        executed(join(read_samples(bare.splitlines()), NV_SAMPLE.splitlines()), None, 1)
    except ValueError:
        pass
    else:
        raise AssertionError("a CSV without the executed counts was read")
    print("stalls.py self-test: 7 passed, 0 failed")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="?", help="ncu --page source --csv --print-source sass")
    ap.add_argument("listing", nargs="?", help="nvdisasm -gi of the same image")
    ap.add_argument("--reason", action="append", help="a stall column, e.g. stall_wait (repeatable)")
    ap.add_argument("--under", help="a frame (file:line, or a file): sites are the frames inside it")
    ap.add_argument("--depth", type=int, default=3, help="frames a site names (default 3): the innermost, or with --executed the outermost")
    ap.add_argument("--top", type=int, default=12, help="sites a reason lists (default 12)")
    ap.add_argument("--executed", action="store_true", help="the code the launch ran, by site, instead of stalls")
    ap.add_argument("--self-test", action="store_true", help="check the join on a built-in sample")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return
    if not args.csv or not args.listing:
        ap.error("name the CSV and the listing")
    with open(args.csv) as c, open(args.listing) as l:
        joined = join(read_samples(c), l)
    if args.executed:
        rows, (run, lines, image) = executed(joined, args.under, args.depth)
        print(f"run {run / 1024:.1f} KB of {image / 1024:.1f} KB, in {lines / 1024:.1f} KB of {LINE}-byte lines")
        print("| run (KB) | its lines (KB) | image (KB) | site |\n|---|---|---|---|")
        for r, li, b, site in rows[: args.top]:
            print(f"| {r / 1024:.1f} | {li / 1024:.1f} | {b / 1024:.1f} | {site} |")
        return
    for reason, (total, share, sites) in report(joined, args.reason or DEFAULT_REASONS, args.under, args.depth).items():
        print(f"\n{reason}: {total:.0f} samples, {100 * share:.1f} % of all")
        print("| samples | share | site |\n|---|---|---|")
        for n, site in sites[: args.top]:
            print(f"| {n:.0f} | {100 * n / total:.1f} % | {site} |")


if __name__ == "__main__":
    main()
