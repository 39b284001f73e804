"""Fast cost lookups for the search: stage time and memory of any block range in O(1).

    tables = CostTables(profile, cluster, optimizer="adam")
    tables.stage_time("A100-80GB", m=4, start=0, end=9)        # fwd + bwd seconds, one micro-batch
    tables.stage_memory(device_type, 0, 9, m=4, in_flight=3)   # bytes, the simulator's formula

Prefix sums over blocks, per device type and micro-batch size, computed once and cached. Times come
from the profile exactly as the simulator reads them, so the search and the simulator agree.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from hetplan.contracts.catalog import DeviceType
from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.simulate.memory import static_bytes_per_param

__all__ = ["CostTables"]


class CostTables:
    """Prefix sums of block costs for the partition search."""

    def __init__(self, profile: ModelProfile, cluster: Cluster, *, optimizer: str) -> None:
        self.profile = profile
        self.cluster = cluster
        self.optimizer = optimizer
        self.n = len(profile.blocks)
        blocks = profile.blocks
        self.params = np.concatenate([[0.0], np.cumsum([float(b.params) for b in blocks])])
        self.param_bytes = np.concatenate([[0.0], np.cumsum([b.param_bytes for b in blocks])])
        self.activation = np.concatenate([[0.0], np.cumsum([b.activation_bytes for b in blocks])])
        self.output_bytes = np.array([b.output_bytes for b in blocks])
        # held_output[j]: bytes per sample a stage ending at block j keeps besides its saved
        # activations until the backward: its output, as the memory walk counts it
        self.held_output = np.concatenate([[0.0], self.output_bytes])
        # bytes per parameter beyond the weights (gradients, master copy, optimizer state), as the
        # memory walk counts them (planner/simulate/memory.py)
        weight = float(profile.dtype_bytes)
        self.state_per_param = static_bytes_per_param(profile.dtype, optimizer, weight) - weight
        self._prefix = lru_cache(maxsize=None)(self._compute_prefix)

    def device_type(self, name: str) -> DeviceType:
        return self.cluster.catalog.get(name)

    def _compute_prefix(self, type_name: str, m: int) -> tuple[np.ndarray, np.ndarray]:
        device = self.device_type(type_name)
        pairs = [self.profile.block_time(i, device, m) for i in range(self.n)]
        fwd = np.concatenate([[0.0], np.cumsum([p[0] for p in pairs])])
        bwd = np.concatenate([[0.0], np.cumsum([p[1] for p in pairs])])
        return fwd, bwd

    def prefix(self, type_name: str, m: int) -> np.ndarray:
        """Cumulative forward + backward seconds of blocks ``[0, i)`` at micro-batch ``m``: length n + 1."""
        fwd, bwd = self._prefix(type_name, m)
        return fwd + bwd

    def stage_time(self, type_name: str, m: int, start: int, end: int) -> float:
        p = self.prefix(type_name, m)
        return float(p[end] - p[start])

    def static_memory(self, start: int, end: int) -> float:
        """Weights, gradients and optimizer state of blocks ``[start, end)``."""
        weights = self.param_bytes[end] - self.param_bytes[start]
        params = self.params[end] - self.params[start]
        return float(weights + self.state_per_param * params)

    def stage_memory(self, device: DeviceType, start: int, end: int, *, m: int, in_flight: int) -> float:
        """Peak bytes on a device holding ``[start, end)`` with ``in_flight`` micro-batches of ``m`` samples."""
        activations = (self.activation[end] - self.activation[start] + self.held_output[end]) * m * in_flight
        return self.static_memory(start, end) + float(activations)

    def fits(self, device: DeviceType, start: int, end: int, *, m: int, in_flight: int) -> bool:
        """A quick check for pruning (the memory walk of the compiled plan is the exact one)."""
        return device.fits(self.stage_memory(device, start, end, m=m, in_flight=in_flight))
