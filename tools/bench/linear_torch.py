"""PyTorch baseline for the linear task (crates/linear/benches/gpu.rs, the same cases): bf16
`F.linear` (y = x W^T) over a GLM-5.2 TP8 rank's matrices, weights cold in L2, at 1 and 4 rows:
eager, and the same kernels replayed from one CUDA graph (what an engine's decode runs). PyTorch has
no 128 x 128 block-scaled FP8 matmul, so its weights are bf16: twice the bytes of the FP8 weights
the case names. Median of 30 event-timed runs (tools/bench/baseline.py); with MONO_BENCH_JSON set
each figure is also a record (tools/bench/record.py).

    python3 tools/bench/linear_torch.py
"""
import torch
import torch.nn.functional as F

import record
from baseline import ColdTimer, device_name, expert, graphed

HIDDEN, Q_LORA, O_IN, EXPERT_INTER, EXPERTS_IN_CASE, ROUTER = 6144, 2048, 2048, 256, 9, 256
ROWS = [1, 4]
TABLE = "linear (GLM-5.2 TP8 rank's matrices)"
EAGER = "PyTorch bf16 F.linear, eager, weights cold in L2"
GRAPH = "PyTorch bf16 F.linear, one CUDA graph, weights cold in L2"


def weight(n, k):
    return torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5



def main():
    timer = ColdTimer()
    name = device_name()
    q_a, o_proj = weight(Q_LORA, HIDDEN), weight(HIDDEN, O_IN)
    gate_up, down = weight(2 * EXPERT_INTER, HIDDEN), weight(HIDDEN, EXPERT_INTER)
    router = weight(ROUTER, HIDDEN)
    experts = [(weight(2 * EXPERT_INTER, HIDDEN), weight(HIDDEN, EXPERT_INTER))
               for _ in range(EXPERTS_IN_CASE)]
    for rows in ROWS:
        x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)

        def chain():
            return expert(F.linear(F.linear(x, q_a), o_proj), gate_up, down)

        def nine_experts():
            return F.linear(x, router), [expert(x, g, d) for g, d in experts]

        # (the case as the Rust bench names it, with its FP8 megabytes; the bf16 weights it reads)
        cases = [
            ("q_a", 12.63, [q_a], lambda: F.linear(x, q_a)),
            ("q_a, o_proj, gate/up, down chain", 30.00, [q_a, o_proj, gate_up, down], chain),
            ("9 experts + router, one launch", 45.78,
             [router] + [w for e in experts for w in e], nine_experts),
        ]
        for label, fp8_mb, weights, run in cases:
            case = f"{label}, {record.rows_label(rows)}, {fp8_mb:.2f} MB"
            mb = sum(w.numel() * w.element_size() for w in weights) / 1e6
            for what, timed in ((EAGER, run), (GRAPH, graphed(run))):
                us = timer.median_us(timed)
                print(f"{case:<55} {us:9.2f} us ({mb:.2f} MB of bf16 weights), {what}")
                record.append(TABLE, case, what, us, "us", name,
                              note=f"{mb:.2f} MB of bf16 weights")


if __name__ == "__main__":
    main()
