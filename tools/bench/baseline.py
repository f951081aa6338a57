"""What the PyTorch baselines share: event timing (the median of runs, each after a 256 MB write
that evicts the L2, 50 MB on an H200, so that every run reads its weights or cache from HBM, as the
Rust benches' replays do), CUDA-graph capture, and the SwiGLU expert."""
import torch
import torch.nn.functional as F

FLUSH_BYTES = 256 << 20


class ColdTimer:
    def __init__(self):
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def median_us(self, run, timed=30, warm=3):
        """`run()` timed `timed` times with the L2 flushed before each; the median, in us."""
        for _ in range(warm):
            run()
        times = []
        for _ in range(timed):
            self.flush.zero_()
            self.start.record()
            run()
            self.end.record()
            self.end.synchronize()
            times.append(self.start.elapsed_time(self.end) * 1e3)
        times.sort()
        return times[len(times) // 2]


def graphed(run, warm=3):
    """`run` captured once as a CUDA graph (after a few runs on a side stream, as capture asks):
    the graph's replay, which launches the same kernels without the host's per-kernel cost."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warm):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


def expert(x, gate_up, down):
    """down(silu(gate) * up), gate and up the halves of one matrix."""
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down)


def device_name():
    """The GPU's name, printed with PyTorch's version."""
    name = torch.cuda.get_device_name()
    print(f"device: {name}, torch {torch.__version__}")
    return name
