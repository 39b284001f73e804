"""Lower bounds on the iteration time, so every plan can say how far it is from ideal.

The bound is a small linear program (scipy's HiGHS): every block's samples may be split across
device types in any proportion (each block on the type that runs it best, as a pipeline can place
it), every device of a type shares that type's work equally and is busy all the time, at its best
per-sample rate over the profiled micro-batch sizes, with no communication, no bubble and no memory
limit. Any real plan does at least this work on these devices, so no plan can beat it.

    minimise T  subject to  sum_k y[b,k] = 1  for every block b,
                            B * sum_b t[b,k] * y[b,k] <= n_k * T  for every type k,   y >= 0
"""

from __future__ import annotations

import numpy as np

from hetplan.contracts.cluster import Cluster
from hetplan.errors import HetplanError
from hetplan.solve.tables import CostTables

__all__ = ["compute_lower_bound", "split_lp"]


def _best_per_sample(tables: CostTables, type_name: str, sizes: list[int]) -> np.ndarray:
    """Per block, the fastest forward + backward seconds per sample over the micro-batch sizes."""
    return np.min([np.diff(tables.prefix(type_name, m)) / m for m in sizes], axis=0)


def split_lp(work: np.ndarray, counts: np.ndarray) -> tuple[float, np.ndarray]:
    """The LP of the module docstring for ``work[k, b]`` (seconds of block ``b``'s whole batch on
    one device of type ``k``) and ``counts[k]`` devices of each type: (T, each type row's
    marginal, <= 0; minus it is that type's price in the dual, which the what-if search reuses)."""
    # imported here: scipy.optimize takes about half a second to import, more than the whole
    # search of a small cluster, and ``hetplan plan`` on a large one solves this in a second process
    from scipy.optimize import linprog

    n_types, n_blocks = work.shape
    n_vars = n_types * n_blocks + 1  # y[k, b] flattened, then T
    cost = np.zeros(n_vars)
    cost[-1] = 1.0
    a_eq = np.zeros((n_blocks, n_vars))
    for k in range(n_types):
        a_eq[np.arange(n_blocks), k * n_blocks + np.arange(n_blocks)] = 1.0
    a_ub = np.zeros((n_types, n_vars))
    for k in range(n_types):
        a_ub[k, k * n_blocks : (k + 1) * n_blocks] = work[k]
        a_ub[k, -1] = -counts[k]
    result = linprog(
        cost,
        A_ub=a_ub,
        b_ub=np.zeros(n_types),
        A_eq=a_eq,
        b_eq=np.ones(n_blocks),
        bounds=[(0, None)] * n_vars,
        method="highs",
    )
    if result.status != 0:
        raise HetplanError(f"the lower-bound LP failed: {result.message}", field="plan")
    return float(result.x[-1]), np.asarray(result.ineqlin.marginals)


def compute_lower_bound(tables: CostTables, cluster: Cluster, global_batch: int, sizes: list[int]) -> float:
    """The LP bound of the module docstring, in seconds."""
    types = list(cluster.device_types)
    counts = np.array([sum(1 for d in cluster.devices if d.type.name == t) for t in types], dtype=float)
    per_sample = np.array([_best_per_sample(tables, t, sizes) for t in types])  # [types, blocks]
    return split_lp(global_batch * per_sample, counts)[0]
