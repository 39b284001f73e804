"""What the runtime asks of a rank's device: time a compute, settle a collective, track peak memory.

    ops = make_ops(torch.device("cuda", 0))       # CudaOps; CpuOps for "cpu" (the stand-in)
    mark = ops.mark()                             # an event recorded on the compute stream
    run_forward()
    seconds = ops.since(mark)                     # waits for that stream only, not NCCL's
    wait(work); ops.settle()                      # the host knows the collective has really ended
    ops.reset_peak(); ...; ops.peak_bytes()       # the allocator's peak of this step

Every CUDA-specific call of the runtime lives in :class:`CudaOps`, and :class:`CpuOps` implements
the same calls with the host clock, so a CPU test drives the very bookkeeping the GPU path runs
(the executor never branches on the device type). The one rule the CUDA side keeps: never
``torch.cuda.synchronize()``, which waits for every stream of the device, NCCL's included, so the
all-reduces the backward hooks issue and the sends in flight would finish inside "compute" and the
overlap the simulator times would never happen. An event recorded on the compute stream and waited
on alone ends where the compute ends.

``CudaOps`` takes the ``torch.cuda`` namespace as an argument so a test can hand it a stand-in that
records what it was asked (tests/runtime/test_device_ops.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["CpuOps", "CudaOps", "DeviceOps", "Mark", "make_ops"]


@dataclass
class Mark:
    """A point on the compute stream: the host time it was taken, and the device event (CUDA)."""

    host_s: float
    event: Any = None


class DeviceOps:
    """The interface (and the CPU behaviour, which :class:`CpuOps` is): see the module docstring."""

    #: the device the rank computes on
    device: torch.device

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> Mark:
        """Now, on the compute stream."""
        return Mark(time.perf_counter())

    def since(self, mark: Mark) -> float:
        """Seconds the compute stream took from ``mark`` to now; returns once that work has ended."""
        return time.perf_counter() - mark.host_s

    def settle(self) -> None:
        """Block the host until what the compute stream was told to wait for (a collective's
        ``work.wait()`` under NCCL makes the stream wait, not the host) has happened."""

    def reset_peak(self) -> None:
        """Start a new peak-memory window (each step's peak is that step's own)."""

    def peak_bytes(self) -> float | None:
        """The allocator's peak of live tensor bytes since :meth:`reset_peak`; None where the
        allocator keeps none (CPU: :func:`hetplan.runtime.memtrack.measure_peak` profiles a step)."""
        return None


class CpuOps(DeviceOps):
    """The CPU device, and the CPU stand-in of the CUDA path: host clock, no streams."""


class CudaOps(DeviceOps):
    """A CUDA device: compute timed by events on the current (compute) stream."""

    def __init__(self, device: torch.device, *, cuda: Any = None) -> None:
        super().__init__(device)
        self.cuda = cuda if cuda is not None else torch.cuda

    def _record(self) -> Any:
        event = self.cuda.Event(enable_timing=True)
        event.record(self.cuda.current_stream(self.device))
        return event

    def mark(self) -> Mark:
        return Mark(time.perf_counter(), self._record())

    def since(self, mark: Mark) -> float:
        end = self._record()
        end.synchronize()  # this stream's work up to here; NCCL's streams go on
        return float(mark.event.elapsed_time(end)) / 1e3

    def settle(self) -> None:
        self._record().synchronize()

    def reset_peak(self) -> None:
        self.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> float | None:
        return float(self.cuda.max_memory_allocated(self.device))


def make_ops(device: torch.device) -> DeviceOps:
    """The ops of ``device``: :class:`CudaOps` for a CUDA device, :class:`CpuOps` otherwise."""
    return CudaOps(device) if device.type == "cuda" else CpuOps(device)
