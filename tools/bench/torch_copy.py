"""PyTorch's device-to-device copy on the same sizes as `cargo bench -p device --bench probes`:
2 GiB read + 2 GiB written per copy, event-timed, median of 10 after a warm-up. The baseline that
BENCHMARKS.md puts beside our copy kernel; with MONO_BENCH_JSON set it writes its record there
(tools/bench/record.py)."""
import statistics

import torch

import record

n = 2 << 30
src = torch.empty(n, dtype=torch.uint8, device="cuda")
dst = torch.empty_like(src)
dst.copy_(src)
times = []
for _ in range(10):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    dst.copy_(src)
    b.record()
    b.synchronize()
    times.append(a.elapsed_time(b))
ms = statistics.median(times)
tb_s = 2 * n / (ms * 1e-3) / 1e12
print(f"torch copy_: {tb_s:.2f} TB/s (read + written), median {ms:.3f} ms, torch {torch.__version__}")
record.append("device", "copy, 2 GiB read + 2 GiB written", "PyTorch dst.copy_(src)", tb_s, "TB/s",
              torch.cuda.get_device_name())
