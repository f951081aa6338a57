"""PyTorch baseline for the sparse MLA attention (crates/mla/benches/gpu.rs, the same shapes): GLM-5
at a TP8 rank, 8 heads, each row's 2048 selected slots of an FP8 latent cache (a token's record: 512
E4M3 codes, 4 fp32 scales, one per 128, and the 64 bf16 rope values, 656 B), in eager PyTorch:
gather the rows' records, dequantise, the absorbed query's scores against latent and rope (scale
1/sqrt(qk_head_dim = 256)), an fp32 softmax, the weighted sum of the latents. 1 row and 4 verify
rows of one request (their lists differ in their last entries), 8K and 128K contexts, the cache cold
in L2; eager, and the same kernels replayed from one CUDA graph. Median of 30 event-timed runs
(tools/bench/baseline.py); with MONO_BENCH_JSON set each figure is also a record
(tools/bench/record.py).

    python3 tools/bench/mla_torch.py
"""
import torch

import record
from baseline import ColdTimer, device_name, graphed

HEADS, LATENT, ROPE, TOPK, RECORD = 8, 512, 64, 2048, 656
SCALE = 256 ** -0.5
CONTEXTS = [8192, 131072]
ROWS = [(1, "1 row"), (4, "4 verify rows")]
TABLE = "mla attention"
EAGER = "PyTorch eager: gather, dequantise, fp32 softmax"
GRAPH = "the same PyTorch, one CUDA graph"


def attend(q, cache, slots):
    """q [R, H, 576] bf16, cache [T, 656] uint8, slots [R, k]: [R, H, 512] bf16."""
    rec = cache[slots]
    scales = rec[..., LATENT:LATENT + 16].contiguous().view(torch.float32)
    latent = rec[..., :LATENT].contiguous().view(torch.float8_e4m3fn).float()
    latent = (latent.unflatten(-1, (4, 128)) * scales[..., None]).flatten(-2)
    rope = rec[..., LATENT + 16:].contiguous().view(torch.bfloat16).float()
    qf = q.float()
    scores = (torch.einsum("rhd,rsd->rhs", qf[..., :LATENT], latent)
              + torch.einsum("rhd,rsd->rhs", qf[..., LATENT:], rope)) * SCALE
    return torch.einsum("rhs,rsd->rhd", scores.softmax(-1), latent).to(torch.bfloat16)


def main():
    timer = ColdTimer()
    name = device_name()
    for context in CONTEXTS:
        tokens = context + 8  # the context and the verify rows' new tokens
        cache = torch.randint(0, 256, (tokens, RECORD), dtype=torch.uint8, device="cuda")
        codes = torch.randint(0, 120, (tokens, LATENT), dtype=torch.uint8, device="cuda")
        cache[:, :LATENT] = codes
        scales = torch.full((tokens, 4), 0.01, device="cuda")
        cache[:, LATENT:LATENT + 16] = scales.view(torch.uint8)
        rope = torch.randn(tokens, ROPE, device="cuda").to(torch.bfloat16)
        cache[:, LATENT + 16:] = rope.view(torch.uint8)
        common = torch.randperm(context, device="cuda")[:TOPK]
        for rows, label in ROWS:
            slots = common.repeat(rows, 1)
            for r in range(rows):  # each verify row sees the new tokens up to its own
                slots[r, TOPK - 1 - r:] = context + torch.arange(r + 1, device="cuda")
            q = torch.randn(rows, HEADS, LATENT + ROPE, device="cuda", dtype=torch.bfloat16)
            case = f"{record.keys_label(context)} context x {label}"
            run = lambda: attend(q, cache, slots)
            for what, timed in ((EAGER, run), (GRAPH, graphed(run))):
                us = timer.median_us(timed)
                print(f"{case:<30} {us:9.1f} us, {what}")
                record.append(TABLE, case, what, us, "us", name)


if __name__ == "__main__":
    main()
