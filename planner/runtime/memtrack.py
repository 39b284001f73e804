"""Peak tensor memory of one training step, measured at the allocator, on CPU as on GPU.

    peak, stats = measure_peak(lambda: executor.run_step(step), held=executor.held_tensors(), device=dev)

On CUDA it is ``torch.cuda.max_memory_allocated`` (the caching allocator's peak of live tensor
bytes), its window reset as the step begins (:class:`hetplan.runtime.device.CudaOps`): each step's
peak is its own, so a checkpoint's spike does not read as every later step's. On CPU there is no
such counter, and process RSS counts the interpreter, libraries and freed-but-kept pages; so the
step runs under the torch profiler with memory tracking (``profile_memory=True``), which records
every allocation and free of the CPU allocator with its size: the peak is the bytes of tensors
alive when the step began plus the highest running sum of those records. The profiler slows the
step down, so the runtime measures one step of a run this way (the second, once the optimizer
state exists), not every step.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import torch
from torch.profiler import ProfilerActivity, profile

from hetplan.runtime.device import make_ops

__all__ = ["live_bytes", "measure_peak"]

T = TypeVar("T")


def live_bytes(tensors: Iterable[torch.Tensor]) -> float:
    """Bytes of the distinct storages behind ``tensors`` (a storage shared by views counts once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return float(sum(seen.values()))


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for a moment: a rank's stderr is for its one-line errors."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def measure_peak(run: Callable[[], T], *, held: Iterable[torch.Tensor], device: torch.device) -> tuple[float, T]:
    """Run ``run()``; return the peak of live tensor bytes during it (``held``: those alive before)."""
    ops = make_ops(device)
    if device.type == "cuda":
        # the window starts with the step: a checkpoint's or an earlier step's spike is not this one's
        ops.reset_peak()
        result = run()
        peak = ops.peak_bytes()
        assert peak is not None
        return peak, result
    baseline = live_bytes(held)
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False)
    with _quiet_stderr():  # kineto announces its start and stop on stderr, whatever its log level
        prof.__enter__()
    try:
        result = run()
    finally:
        with _quiet_stderr():
            prof.__exit__(None, None, None)
    deltas = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    running = peak = 0.0
    for _, nbytes in deltas:
        running += nbytes
        peak = max(peak, running)
    return baseline + peak, result
