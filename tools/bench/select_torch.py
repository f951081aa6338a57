"""torch.topk(k=2048) on the shapes of the select benchmark (crates/select/benches/gpu.rs): rows
1 / 4 / 8 at 8K, 32K, 128K, 300K and 1M fp32 keys. Each case is a CUDA graph of 20 topk calls,
replayed 15 times with events around each replay; printed: the median replay over 20, in us. With
MONO_BENCH_JSON set each figure is also written there as a record (tools/bench/record.py).

    python3 tools/bench/select_torch.py
"""
import torch

import record

K = 2048
LENS = [8192, 32768, 131072, 300_000, 1 << 20]
ROWS = [1, 4, 8]
REPEATS = 20
REPLAYS = 15


def time_topk(rows: int, length: int) -> float:
    scores = torch.empty(rows, length, device="cuda").uniform_(-4.0, 4.0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up outside the graph (allocator, kernel selection)
            torch.topk(scores, K, dim=-1)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPEATS):
            torch.topk(scores, K, dim=-1)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / REPEATS)
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"{'kernel':<12} {'rows':>4} {'keys':>8} {'us/select':>10}")
    for length in LENS:
        for rows in ROWS:
            us = time_topk(rows, length)
            print(f"{'torch.topk':<12} {rows:>4} {length:>8} {us:>10.2f}", flush=True)
            case = f"{record.keys_label(length)} x {record.rows_label(rows)}"
            record.append("select", case, "torch.topk", us, "us", torch.cuda.get_device_name())


if __name__ == "__main__":
    main()
