"""Why the indexer's wgmma scorer widens E4M3 to f16 instead of multiplying the codes on FP8 tensor
cores: how exact the FP8 path's sums are for the indexer's dots (K = 128) on this GPU.

Keys and queries quantised as the indexer does (E4M3 codes, a power-of-two scale a token or head);
the codes' dots on the FP8 tensor cores (torch._scaled_mm, with and without fast accumulation) and
on f16 with fp32 sums, against the exact dots (f64); scored as the indexer scores (ReLU, head
weights, key scale); error = max |score - exact| / max |exact| over 64K keys, the check's metric
(bound 1e-4). One line per case and path.

    python3 tools/bench/indexer_fp8_accumulation.py
"""
import torch
torch.manual_seed(7)
dev = "cuda"
H, D, N = 32, 128, 65536

def quant(x):  # per row: power-of-two scale so the largest |x| fits 448
    amax = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
    s = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    return (x / s).to(torch.float8_e4m3fn), s.squeeze(-1)

def case(name, k, q, w):
    kc, ks = quant(k); qc, qs = quant(q)
    exact = kc.double() @ qc.double().T                        # [N, H] exact dots of the codes
    one = torch.ones((), device=dev)
    for mode, dots in (
        ("fp8 fast", torch._scaled_mm(kc, qc.T, scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=True)),
        ("fp8 promo", torch._scaled_mm(kc, qc.T, scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=False)),
        ("f16, f32 sums", torch.matmul(kc.half().float(), qc.half().float().T)),
    ):
        ww = (w * qs).double()
        ref = (exact.clamp_min(0) * ww).sum(1) * ks.double()
        got = (dots.double().clamp_min(0) * ww).sum(1) * ks.double()
        dot_err = ((dots.double() - exact).abs() / exact.abs().amax()).max().item()
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        print(f"{name:28s} {mode:12s} score err/max {err:.3e}   dot err/max|dot| {dot_err:.3e}")

w = torch.rand(H, device=dev) + 0.1
case("random", torch.randn(N, D, device=dev), torch.randn(H, D, device=dev), w)
k = torch.randn(N, D, device=dev); k[:, 5] *= 30
case("key outlier dim", k, torch.randn(H, D, device=dev), w)
q = torch.randn(H, D, device=dev)
case("keys near queries", q[torch.randint(0, H, (N,), device=dev)] + 0.3 * torch.randn(N, D, device=dev), q, w)
k = torch.randn(N, D, device=dev); k = k - (k @ q[0]).unsqueeze(1) * q[0] / (q[0] @ q[0])
case("cancelling (head 0)", k, q, w)
case("heavy tails", torch.randn(N, D, device=dev) ** 3, torch.randn(H, D, device=dev) ** 3, w)
case("uniform small", torch.rand(N, D, device=dev), torch.rand(H, D, device=dev) - 0.5, w)
