#!/usr/bin/env python3
"""Where a kernel's local-memory traffic sits: each source site of its spill loads and stores, and
the size of the smallest loop around it, so that a spill inside a hot loop stands out from one on
a task's cold path.

Reads a disassembly with line information, either format:
- sm_90a: `nvdisasm -gi IMAGE.cubin` (the images `mono kernels --out DIR` writes carry line
  information; nvdisasm is in the `nvidia-cuda-nvdisasm` wheel). LDL and STL count.
- gfx950: `llvm-objdump-22 -d -l IMAGE.hsaco`. scratch_load and scratch_store count.

    mono kernels --target sm_90a --only fused_layer_moe_shared --out /tmp/k
    nvdisasm -gi /tmp/k/sm_90a/crates-executor-kernels-fused_layer_moe_shared.cubin | python3 tools/sass/spills.py
    llvm-objdump-22 -d -l /tmp/k/gfx950/*.hsaco | python3 tools/sass/spills.py --depth 2

A site is the source line of the instruction and the lines it was inlined at (nvdisasm; llvm-objdump
gives the innermost line only), innermost first, `--depth` of them. The loop is the shortest range
from a backward branch's target to the branch that holds the instruction, in instructions; "-" when
no loop holds it. Rows come hottest first: the smallest loop, then the most instructions.

With --mix SITE (a `file:line`, e.g. `linear.h:513`): instead, for each smallest loop holding an
instruction of that line (innermost), its length and its opcodes by count, so that a hot loop's
work reads at a glance (an FP8 batch of the linear tile: its conversions beside its HMMA).

    nvdisasm -gi /tmp/k/sm_90a/*.cubin | python3 tools/sass/spills.py --mix linear.h:513
"""
import argparse
import re
import sys
from collections import Counter

NV_MARK = re.compile(r'//## File "([^"]+)", line (\d+)')
NV_INST = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
NV_LABEL = re.compile(r"^\s*\.(L_x_\d+):")
NV_TARGET = re.compile(r"BRA.*`\(\.(L_x_\d+)\)")
NV_SPILL = re.compile(r"^(@!?U?P\w+\s+)?(LDL|STL)\b")

AMD_MARK = re.compile(r"^; (\S+):(\d+)\s*$")
AMD_INST = re.compile(r"^\s+(\w+)\b.*//\s*([0-9A-Fa-f]+):")
AMD_TARGET = re.compile(r"^\s*s_(?:c?branch)\w*\s.*<[^+>]+\+0x([0-9a-f]+)>")
AMD_SYMBOL = re.compile(r"^([0-9a-f]+) <([^>]+)>:")


def short(path):
    return path.rsplit("/", 1)[-1]


def parse_nvidia(lines):
    """(address, text, site) of every instruction, and the loops as (first, last) addresses."""
    insts, labels, pending, site, marking = [], {}, [], [], False
    for line in lines:
        mark = NV_MARK.search(line)
        if mark:
            if not marking:
                site = []
            site.append(f"{short(mark.group(1))}:{mark.group(2)}")
            marking = True
            continue
        marking = False
        label = NV_LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        inst = NV_INST.search(line)
        if inst:
            address = int(inst.group(1), 16)
            for name in pending:
                labels[name] = address
            pending = []
            insts.append((address, inst.group(2), tuple(site)))
    loops = []
    for address, text, _ in insts:
        target = NV_TARGET.search(text)
        if target and labels.get(target.group(1), address + 1) <= address:
            loops.append((labels[target.group(1)], address))
    spills = [(a, "load" if "LDL" in t else "store", s) for a, t, s in insts if NV_SPILL.match(t)]
    return insts, loops, spills


def parse_amd(lines):
    insts, loops, spills, site, base = [], [], [], (), 0
    for line in lines:
        symbol = AMD_SYMBOL.match(line)
        if symbol:
            base = int(symbol.group(1), 16)
            continue
        mark = AMD_MARK.match(line)
        if mark:
            site = (f"{short(mark.group(1))}:{mark.group(2)}",)
            continue
        inst = AMD_INST.match(line)
        if not inst:
            continue
        address, opcode = int(inst.group(2), 16), inst.group(1)
        insts.append((address, opcode, site))
        target = AMD_TARGET.match(line)
        if target and base + int(target.group(1), 16) <= address:
            loops.append((base + int(target.group(1), 16), address))
        if opcode.startswith("scratch_load"):
            spills.append((address, "load", site))
        elif opcode.startswith("scratch_store"):
            spills.append((address, "store", site))
    return insts, loops, spills


def parse(lines):
    """Either disassembly's instructions, loops and local-memory accesses."""
    text = list(lines)
    nvidia = any(NV_MARK.search(line) or NV_INST.search(line) for line in text)
    return (parse_nvidia if nvidia else parse_amd)(text)


def report(lines, depth):
    """Rows (loop length or None, loads, stores, site), hottest first."""
    insts, loops, spills = parse(lines)
    order = {address: i for i, (address, _, _) in enumerate(insts)}
    counts = Counter()
    for address, kind, site in spills:
        around = [order[e] - order[s] + 1 for s, e in loops if s <= address <= e and s in order and e in order]
        loop = min(around) if around else None
        counts[(loop, " < ".join(site[:depth]) or "?", kind)] += 1
    rows = {}
    for (loop, site, kind), n in counts.items():
        row = rows.setdefault((loop, site), [0, 0])
        row[0 if kind == "load" else 1] += n
    return sorted(
        ((loop, loads, stores, site) for (loop, site), (loads, stores) in rows.items()),
        key=lambda r: (r[0] is None, r[0] or 0, -(r[1] + r[2]), r[3]),
    )


def opcode(text):
    """An instruction's opcode without its predicate and modifiers (HMMA.16816.F32 -> HMMA)."""
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def mix(lines, site):
    """(first, last, instructions, Counter of opcodes) of each smallest loop around `site`."""
    insts, loops, _ = parse(lines)
    chosen = set()
    for address, _, where in insts:
        if where and where[0] == site:
            around = [(e - s, s, e) for s, e in loops if s <= address <= e]
            if around:
                chosen.add(min(around)[1:])
    out = []
    for first, last in sorted(chosen):
        body = [t for a, t, _ in insts if first <= a <= last]
        out.append((first, last, len(body), Counter(opcode(t) for t in body)))
    return out


def render_mix(loops, site):
    if not loops:
        return f"no loop holds an instruction of {site}"
    rows = []
    for first, last, n, ops in loops:
        rows.append(f"loop {first:#x}-{last:#x}: {n} instructions")
        rows.append("  " + ", ".join(f"{op} {c}" for op, c in ops.most_common()))
    return "\n".join(rows)


def render(rows):
    out = [f"{'loop':>6} {'loads':>5} {'stores':>6}  site"]
    for loop, loads, stores, site in rows:
        out.append(f"{'-' if loop is None else loop:>6} {loads:>5} {stores:>6}  {site}")
    loads = sum(r[1] for r in rows)
    stores = sum(r[2] for r in rows)
    out.append(f"total: {loads} loads, {stores} stores of local memory at {len(rows)} sites")
    return "\n".join(out)


NV_SAMPLE = """\
	//## File "/k/prelude.h", line 10
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
	//## File "/k/ops/linear.h", line 501 inlined at "/k/ops/linear.h", line 736
	//## File "/k/ops/linear.h", line 736 inlined at "/k/lin_task.h", line 204
        /*0010*/                   LDL R19, [R1+0xa8] ;
        /*0020*/                   FFMA R2, R3, R4, R2 ;
        /*0030*/               @P0 BRA `(.L_x_1) ;
	//## File "/k/mla_attn.h", line 618
        /*0040*/                   STL [R1+0x10], R3 ;
        /*0050*/                   EXIT ;
"""

AMD_SAMPLE = """\
0000000000001a00 <linear_tasks>:
; /k/linear.h:483
	s_mov_b32 s0, 0                                            // 000000001A00: BE800080
	scratch_store_dword off, v1, off offset:4                  // 000000001A04: DC700004 007F0100
; /k/linear.h:501
	scratch_load_dword v2, off, off offset:4                   // 000000001A0C: DC500004 027F0000
	v_fmac_f32_e32 v3, v4, v5                                  // 000000001A14: 56060B04
	s_cbranch_scc1 65533                                       // 000000001A18: BF85FFFD <linear_tasks+0xc>
	s_endpgm                                                   // 000000001A1C: BF810000
"""


def self_test():
    nv = report(NV_SAMPLE.splitlines(), 2)
    assert nv == [(3, 1, 0, "linear.h:501 < linear.h:736"), (None, 0, 1, "mla_attn.h:618")], nv
    amd = report(AMD_SAMPLE.splitlines(), 2)
    assert amd == [(3, 1, 0, "linear.h:501"), (None, 0, 1, "linear.h:483")], amd
    # Negative control: with the backward branch taken out, nothing is in a loop any more.
    flat = report(NV_SAMPLE.replace("@P0 BRA `(.L_x_1)", "NOP").splitlines(), 2)
    assert all(loop is None for loop, *_ in flat), flat
    loops = mix(NV_SAMPLE.splitlines(), "linear.h:501")
    assert [(n, dict(ops)) for _, _, n, ops in loops] == [(3, {"LDL": 1, "FFMA": 1, "BRA": 1})], loops
    # Negative control: a line with no instruction in a loop has no mix.
    assert mix(NV_SAMPLE.splitlines(), "mla_attn.h:618") == []
    print("spills.py self-test: 5 passed, 0 failed")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("disassembly", nargs="?", help="a file (default: standard input)")
    parser.add_argument("--depth", type=int, default=3, help="source lines a site names (default 3)")
    parser.add_argument("--self-test", action="store_true", help="check the parser on built-in samples")
    parser.add_argument("--mix", metavar="SITE", help="the opcodes of the loops around a file:line instead")
    args = parser.parse_args()
    if args.self_test:
        self_test()
        return
    source = open(args.disassembly) if args.disassembly else sys.stdin
    with source:
        if args.mix:
            print(render_mix(mix(source, args.mix), args.mix))
        else:
            print(render(report(source, args.depth)))


if __name__ == "__main__":
    main()
