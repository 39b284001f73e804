"""The memory reserve per device type, from the peak memory runs measured.

A process's peak memory (``peak_memory`` of a run: what ``nvidia-smi`` or the job scheduler saw)
is the live tensors, plus what the caching allocator loses to fragmentation, plus a reserve the
tensors never get (CUDA context, library workspaces), plus the communicators' buffers. The simulator
predicts the tensors and the buffers (``MemoryUse.comm_buffers``, per communicator: docs/cost-model.md
section 8a); the type states its fragmentation; so each measured device gives one estimate of its
type's reserve::

    reserve = measured - tensor_bytes x (1 + fragmentation) - comm_buffers

(the buffers taken out: the prediction adds them beside the reserve, and a reserve that had
absorbed them would count them twice).

The type's reserve is the median of its estimates (one odd device or run does not move it), floored
at 0 and kept below the type's memory. No least squares here: the reserve does not change a single
predicted time, and a median is exactly the robust location the few estimates call for.

A run log's ``peak_memory_bytes`` is the allocator's own peak (tensors only; on a CPU the process's
resident size), so it is reported beside the predicted tensor bytes and fits nothing.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from hetplan.calibrate.inputs import Observation
from hetplan.contracts.cluster import Cluster
from hetplan.simulate.memory import MemoryUse
from hetplan.simulate.simulator import SimResult

__all__ = ["AllocatorPeak", "MemoryPoint", "ReserveFit", "fit_reserves", "tensor_bytes"]

#: A fitted reserve stays below this share of the type's memory (the file contract wants it below).
MAX_RESERVE_SHARE = 0.99


def tensor_bytes(memory: MemoryUse) -> float:
    """Live tensor bytes of a device's peak: weights, gradients, optimizer state, activations (no
    fragmentation, no reserve)."""
    return float(memory.tensor_bytes)


@dataclass(frozen=True)
class MemoryPoint:
    """One device of one run with a measured process peak."""

    run: str
    device: str
    type: str
    measured: float
    tensors: float
    fragmentation: float
    reserve_before: float
    comm_buffers: float = 0.0  # the communicators' buffers the walk prices beside the reserve

    def predicted(self, reserve: float) -> float:
        return self.tensors * (1.0 + self.fragmentation) + reserve + self.comm_buffers

    @property
    def reserve_estimate(self) -> float:
        """What this device says its type's reserve is: the measured peak less all the rest."""
        return self.measured - self.tensors * (1.0 + self.fragmentation) - self.comm_buffers


@dataclass(frozen=True)
class ReserveFit:
    """A device type's fitted reserve and the estimates it is the median of."""

    type: str
    before: float  # the reserve the input cluster gives the type
    reserve: float
    points: tuple[MemoryPoint, ...]
    capped: bool = False  # the median was at or above the type's memory


@dataclass(frozen=True)
class AllocatorPeak:
    """A run log's allocator peak of one device beside the predicted live tensors."""

    run: str
    device: str
    measured: float
    tensors: float


def fit_reserves(
    observations: list[Observation], sims: dict[int, SimResult], cluster: Cluster
) -> tuple[list[ReserveFit], list[AllocatorPeak]]:
    """Per device type with measured peaks, its reserve; and every run log's allocator peaks."""
    points: dict[str, list[MemoryPoint]] = {}
    peaks: list[AllocatorPeak] = []
    for i, obs in enumerate(observations):
        for address, measured in obs.peak_memory.items():
            device_type = cluster.device(address).type
            points.setdefault(device_type.name, []).append(
                MemoryPoint(
                    run=obs.name,
                    device=address,
                    type=device_type.name,
                    measured=measured,
                    tensors=tensor_bytes(sims[i].devices[address].memory),
                    fragmentation=device_type.fragmentation,
                    reserve_before=device_type.reserve_bytes,
                    comm_buffers=float(sims[i].devices[address].memory.comm_buffers),
                )
            )
        for address, measured in obs.allocator_peak.items():
            peaks.append(AllocatorPeak(obs.name, address, measured, tensor_bytes(sims[i].devices[address].memory)))
    fits = []
    for name in cluster.device_types:  # cluster order: deterministic
        if name not in points:
            continue
        device_type = cluster.device_types[name]
        estimate = statistics.median(p.reserve_estimate for p in points[name])
        ceiling = MAX_RESERVE_SHARE * device_type.memory
        reserve = min(max(0.0, estimate), ceiling)
        fits.append(
            ReserveFit(
                type=name,
                before=device_type.reserve_bytes,
                reserve=float(round(reserve)),
                points=tuple(points[name]),
                capped=estimate >= ceiling,
            )
        )
    return fits, peaks
