"""PyTorch baseline for the MoE layer (crates/executor/benches/moe.rs, the same shapes): one MoE
layer of a GLM-5.2 TP8 rank in eager PyTorch, the way a transformers-style module runs it: the post-
attention RMSNorm, the fp32 router (sigmoid, + e_score_correction_bias for the choice, top-8,
weights normalised, x 2.5), the shared expert, then a loop over the experts the rows chose (their
ids read back to the host), each expert's rows gathered, gate/up, SwiGLU, down, weighted and added,
and the residual. bf16 weights (PyTorch has no 128 x 128 block-scaled FP8 matmul), cold in L2; 1 and
4 rows. Median of 30 event-timed runs (tools/bench/baseline.py); with MONO_BENCH_JSON set each
figure is also a record (tools/bench/record.py).

    python3 tools/bench/moe_torch.py
"""
import torch
import torch.nn.functional as F

import record
from baseline import ColdTimer, device_name, expert

HIDDEN, EXPERTS, TOP_K, INTER, SCALING, EPS = 6144, 256, 8, 256, 2.5, 1e-5
ROWS = [1, 4]
TABLE = "MoE layer, fused launch"
WHAT = "PyTorch eager MoE layer, bf16 weights"


def rms_norm(x, weight):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * weight



def main():
    timer = ColdTimer()
    name = device_name()
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    norm_w = torch.ones(HIDDEN, **bf16)
    router = torch.randn(EXPERTS, HIDDEN, **bf16) * HIDDEN ** -0.5
    bias = torch.randn(EXPERTS, device="cuda") * 0.01
    gate_up = torch.randn(EXPERTS, 2 * INTER, HIDDEN, **bf16) * HIDDEN ** -0.5
    down = torch.randn(EXPERTS, HIDDEN, INTER, **bf16) * INTER ** -0.5
    shared_gate_up = torch.randn(2 * INTER, HIDDEN, **bf16) * HIDDEN ** -0.5
    shared_down = torch.randn(HIDDEN, INTER, **bf16) * INTER ** -0.5
    for rows in ROWS:
        residual = torch.randn(rows, HIDDEN, **bf16)
        chosen_counts = []

        def layer():
            x = rms_norm(residual, norm_w)
            scores = F.linear(x.float(), router.float()).sigmoid()
            choice = (scores + bias).topk(TOP_K, dim=-1).indices
            weights = scores.gather(1, choice)
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20) * SCALING
            out = expert(x, shared_gate_up, shared_down)
            chosen = choice.unique().tolist()
            chosen_counts.append(len(chosen))
            for e in chosen:
                r, k = (choice == e).nonzero(as_tuple=True)
                y = expert(x[r], gate_up[e], down[e]) * weights[r, k, None]
                out.index_add_(0, r, y.to(out.dtype))
            return residual + out

        us = timer.median_us(layer)
        distinct = sorted(chosen_counts)[len(chosen_counts) // 2]
        mb = (router.numel() + shared_gate_up.numel() + shared_down.numel()
              + distinct * (gate_up[0].numel() + down[0].numel())) * 2 / 1e6
        case = f"GLM-5.2 TP8 x {record.rows_label(rows)}"
        print(f"{case:<24} {us:9.1f} us ({distinct} distinct experts, {mb:.2f} MB of bf16 weights)")
        record.append(TABLE, case, WHAT, us, "us", name,
                      note=f"{distinct} distinct experts, {mb:.2f} MB of bf16 weights")


if __name__ == "__main__":
    main()
