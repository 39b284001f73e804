"""Memory per device: weights, gradients, optimizer state, activations in flight, a reserve.

The activations term follows the schedule as it actually runs: each forward adds its micro-batch
share's saved activations, each backward frees them; the peak of that walk is what the device must
hold (1F1B: stage s of S holds min(S - s, M) micro-batches; GPipe: all M).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.contracts.model_profile import ModelProfile
from planner.schedule.actions import Kind
from planner.schedule.compile import DeviceProgram

__all__ = ["OPTIMIZER_STATE_BYTES", "MemoryUse", "device_memory", "reserve_bytes"]

#: fp32 optimizer state per parameter: SGD none, momentum one buffer, Adam two moments.
OPTIMIZER_STATE_BYTES = {"sgd": 0.0, "momentum": 4.0, "adam": 8.0}
#: With fp16/bf16 training, an fp32 master copy of the weights (mixed precision).
MASTER_COPY_BYTES = 4.0
#: Kept free for the CUDA context, allocator fragmentation and workspaces.
RESERVE_BYTES = 1.0 * 2**30
RESERVE_FRACTION = 0.10


def reserve_bytes(capacity: float) -> float:
    """The reserve: 1 GiB, or 10% of a small device's memory, whichever is smaller."""
    return min(RESERVE_BYTES, RESERVE_FRACTION * capacity)


@dataclass(frozen=True)
class MemoryUse:
    """Bytes on one device at its peak."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    reserve: float
    capacity: float
    peak_micro_batches: int  # micro-batches whose activations are held at the peak

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.reserve

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    @property
    def headroom(self) -> float:
        return self.capacity - self.total


def device_memory(program: DeviceProgram, profile: ModelProfile, *, optimizer: str, capacity: float) -> MemoryUse:
    """Peak memory of one device running ``program``."""
    blocks = profile.blocks[program.start : program.end]
    params = sum(b.params for b in blocks)
    weight_bytes = sum(b.param_bytes for b in blocks)
    state = OPTIMIZER_STATE_BYTES[optimizer] * params
    if profile.dtype in ("fp16", "bf16"):
        state += MASTER_COPY_BYTES * params
    per_sample = sum(b.activation_bytes for b in blocks)
    held = peak = 0.0
    in_flight = peak_count = 0
    forward, backward = Kind.FORWARD, Kind.BACKWARD
    for action in program.actions:
        kind = action[0]
        if kind is forward:
            held += per_sample * (action[4] - action[3])  # its samples (hi - lo)
            in_flight += 1
            if held > peak:
                peak = held
            if in_flight > peak_count:
                peak_count = in_flight
        elif kind is backward:
            held -= per_sample * (action[4] - action[3])
            in_flight -= 1
    return MemoryUse(
        weights=weight_bytes,
        gradients=weight_bytes,
        optimizer=state,
        activations=peak,
        reserve=reserve_bytes(capacity),
        capacity=capacity,
        peak_micro_batches=peak_count,
    )
