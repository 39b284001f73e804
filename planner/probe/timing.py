"""Short timings of what a planner needs to know about a device: matmul rate, copy bandwidths.

    seconds = time_call(lambda: a @ b, sync=torch.cuda.synchronize, budget=0.2)
    tflops = matmul_tflops(torch, torch.device("cuda", 0), "bf16", size=8192, budget=0.2)

Each figure is the median of timed batches after one untimed warm-up; a batch repeats the call
enough times to last a few milliseconds, so the host's launch and synchronisation overhead (tens
of microseconds) stays out of the rate. ``budget`` bounds the timed seconds of each figure (at least
three batches run). These run once, off any training hot path: a device-wide synchronise between
batches is the point here, not a cost.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["copy_bandwidth", "copy_latency", "matmul_tflops", "time_call"]

#: A batch lasts at least this long, so launch and sync overhead stays a few percent of it.
_MIN_BATCH_S = 0.005
_MIN_BATCHES = 3
_MAX_BATCHES = 200

_TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def time_call(run: Callable[[], Any], *, sync: Callable[[], Any], budget: float) -> float:
    """Median seconds of one ``run()`` (``sync()`` waits for it to finish)."""
    run()
    sync()
    start = time.perf_counter()
    run()
    sync()
    single = max(time.perf_counter() - start, 1e-9)
    inner = max(1, math.ceil(_MIN_BATCH_S / single))
    samples: list[float] = []
    began = time.perf_counter()
    while len(samples) < _MIN_BATCHES or (time.perf_counter() - began < budget and len(samples) < _MAX_BATCHES):
        start = time.perf_counter()
        for _ in range(inner):
            run()
        sync()
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


def _sync_for(torch: Any, device: Any) -> Callable[[], Any]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def matmul_tflops(torch: Any, device: Any, dtype: str, *, size: int, budget: float) -> float:
    """Dense ``size x size`` matmul TFLOP/s (2 size^3 FLOP per product) at ``dtype`` on ``device``;
    tf32 enables TF32 math for this call only (fp32 disables it)."""
    torch_dtype = getattr(torch, _TORCH_DTYPES[dtype])
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=torch_dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=torch_dtype)
    out = torch.empty_like(a)
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    matmul.allow_tf32 = dtype == "tf32"
    try:
        seconds = time_call(lambda: torch.mm(a, b, out=out), sync=_sync_for(torch, device), budget=budget)
    finally:
        matmul.allow_tf32 = before
    return 2.0 * size**3 / seconds / 1e12


def copy_bandwidth(torch: Any, src: Any, dst: Any, *, nbytes: int, budget: float) -> float:
    """Bytes/s of copying ``nbytes`` from device ``src`` to device ``dst`` (host memory pinned when
    one side is a GPU). A copy within one device counts its bytes twice (read and written), the way
    vendors quote memory bandwidth."""
    n = max(1, nbytes // 4)
    pin = "cuda" in (src.type, dst.type)
    source = torch.ones(n, dtype=torch.float32, device=src, pin_memory=pin and src.type == "cpu")
    target = torch.empty(n, dtype=torch.float32, device=dst, pin_memory=pin and dst.type == "cpu")
    gpu = src if src.type == "cuda" else dst

    def sync() -> None:
        if gpu.type == "cuda":
            torch.cuda.synchronize(src if src.type == "cuda" else dst)
            torch.cuda.synchronize(dst if dst.type == "cuda" else src)

    seconds = time_call(lambda: target.copy_(source, non_blocking=True), sync=sync, budget=budget)
    moved = 4.0 * n * (2 if src == dst else 1)
    return moved / seconds


def copy_latency(torch: Any, src: Any, dst: Any, *, budget: float) -> float:
    """Seconds for a 4-byte copy from ``src`` to ``dst``: the fixed cost a transfer pays."""
    source = torch.ones(1, device=src)
    target = torch.empty(1, device=dst)
    devices = [d for d in (src, dst) if d.type == "cuda"]

    def sync() -> None:
        for d in devices:
            torch.cuda.synchronize(d)

    start = time.perf_counter()
    target.copy_(source)
    sync()
    samples = []
    began = time.perf_counter()
    while len(samples) < 20 or (time.perf_counter() - began < budget and len(samples) < 2000):
        start = time.perf_counter()
        target.copy_(source)
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
