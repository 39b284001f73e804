"""Lower bounds on the iteration time, so every plan can say how far it is from ideal."""

from __future__ import annotations

from planner.contracts.cluster import Cluster
from planner.solve.tables import CostTables

__all__ = ["compute_lower_bound"]


def best_per_sample(tables: CostTables, type_name: str, sizes: list[int]) -> float:
    """The fastest forward + backward seconds per sample of the whole model on one device type."""
    return min(tables.stage_time(type_name, m, 0, tables.n) / m for m in sizes)


def compute_lower_bound(tables: CostTables, cluster: Cluster, global_batch: int, sizes: list[int]) -> float:
    """Total work over total speed: every device busy all the time at its best per-sample rate,
    no communication, no bubble, no memory limit. No plan can beat it."""
    rate = sum(1.0 / best_per_sample(tables, d.type.name, sizes) for d in cluster.devices)
    return global_batch / rate
