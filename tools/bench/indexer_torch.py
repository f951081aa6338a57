"""PyTorch eager baseline for the indexer's scoring (crates/indexer/benches/gpu.rs, same shapes).

Per request: gather its pages of the paged FP8 index-key cache (64 tokens a page: keys e4m3, one
fp32 scale a token), dequantise to fp32, score the request's rows together
(einsum q.k per head, ReLU, times the head weights, sum over heads), -inf past each row's position.
Rows 1, 2, 4, 8 as one request's draft chain and as separate requests, at 8K, 128K and 512K keys.
Each figure: median of 30 CUDA-event-timed runs, the L2 flushed before each. One line per case;
with MONO_BENCH_JSON set each figure is also written there as a record (tools/bench/record.py).

    python3 tools/bench/indexer_torch.py
"""
import torch

import record

HEADS, DIM, PAGE = 32, 128, 64
KEYS = [8192, 131072, 524288]
ROWS = [1, 2, 4, 8]
TIMED = 30


def score_request(q, w, cache_keys, cache_scales, pages, positions):
    """q [R, H, D] bf16, w [R, H] fp32, pages [n] physical page ids, positions [R]: scores [R, n * 64]."""
    k = cache_keys[pages].reshape(-1, DIM).to(torch.float32) * cache_scales[pages].reshape(-1, 1)
    logits = torch.einsum("rhd,td->rht", q.to(torch.float32), k).relu_()
    scores = (logits * w[:, :, None]).sum(dim=1)
    t = torch.arange(scores.shape[1], device=scores.device)
    return scores.masked_fill_(t[None, :] > positions[:, None], float("-inf"))


def main():
    dev = torch.device("cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for keys in KEYS:
        pages_per_request = keys // PAGE
        total_pages = 8 * pages_per_request
        cache_keys = torch.randint(0, 120, (total_pages, PAGE, DIM), device=dev, dtype=torch.uint8)  # finite codes
        cache_keys = cache_keys.view(torch.float8_e4m3fn)
        cache_scales = torch.rand(total_pages, PAGE, device=dev) * 0.1
        # Pages dealt round-robin over 8 requests, as the Rust bench's scene does.
        tables = [torch.arange(r, total_pages, 8, device=dev) for r in range(8)]
        for rows in ROWS:
            for chain in (True, False):
                if rows == 1 and not chain:
                    continue
                q = torch.randn(rows, HEADS, DIM, device=dev, dtype=torch.bfloat16)
                w = torch.randn(rows, HEADS, device=dev)
                if chain:
                    groups = [(tables[0], torch.arange(keys - rows, keys, device=dev), slice(0, rows))]
                else:
                    last = torch.tensor([keys - 1], device=dev)
                    groups = [(tables[r], last, slice(r, r + 1)) for r in range(rows)]

                def run():
                    return [score_request(q[s], w[s], cache_keys, cache_scales, p, pos) for p, pos, s in groups]

                run()
                times = []
                for _ in range(TIMED):
                    flush.zero_()
                    start.record()
                    run()
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) * 1e3)
                times.sort()
                us = times[len(times) // 2]
                kind = "1 (chain)" if chain else "separate"
                print(f"torch eager: keys {keys:>7} rows {rows} requests {kind:>9}: {us:9.1f} us")
                case = f"{record.keys_label(keys)} x {record.rows_label(rows)}"
                if rows > 1:
                    case += ", one request" if chain else ", separate requests"
                record.append("indexer scoring", case, "PyTorch eager", us, "us", torch.cuda.get_device_name())


if __name__ == "__main__":
    main()
