"""Lower bounds on every what-if candidate's iteration time, from one set of per-type tables.

    bounds = CandidateBounds(profile, tables, types, sizes, global_batch)
    bounds.fast(type_counts_grid)      # a bound for every candidate at once (numpy)
    bounds.lp({"T4": 2, "A100-40GB": 1})  # the planner's LP bound of one candidate, memoised

Why one module: the planner's LP bound (:mod:`hetplan.solve.bounds`) reads only each device type's
fastest forward + backward seconds per sample and the number of devices of each type. Those times
do not change with the counts, so they are computed once for the whole pool (not once per
candidate, which built a cluster and its cost tables for every LP) and the LP of one set of type
counts is solved once however many candidates share it (a base node of 8 A100s and 8 pool A100s
are the same LP).

The LP ``min T: sum_k y[b,k] = 1, B sum_b t[b,k] y[b,k] <= n_k T`` has the dual
``max sum_b u_b: u_b <= B t[b,k] lam_k, sum_k n_k lam_k = 1``. Any ``lam >= 0`` gives the bound
``B sum_b min_k(t[b,k] lam_k) / sum_k n_k lam_k`` for *every* candidate whose types it prices (weak
duality); :meth:`CandidateBounds.fast` takes the best of the speed-proportional ``lam`` (exact when
the types differ by one factor) and every optimal ``lam`` an LP solved so far returned, so each LP
solved tightens the bound of every candidate still waiting.
"""

from __future__ import annotations

import numpy as np

from hetplan.contracts.model_profile import ModelProfile
from hetplan.solve.bounds import split_lp
from hetplan.solve.tables import CostTables

__all__ = ["CandidateBounds", "per_sample_times"]


def per_sample_times(tables: CostTables, types: list[str], sizes: list[int]) -> np.ndarray:
    """[types, blocks]: the fastest fwd + bwd seconds per sample over the micro-batch sizes (the LP's)."""
    return np.array([np.min([np.diff(tables.prefix(t, m)) / m for m in sizes], axis=0) for t in types])


class CandidateBounds:
    """The planner's LP bound and cheaper bounds below it, for clusters made of ``types``."""

    def __init__(self, profile: ModelProfile, tables: CostTables, types: list[str], sizes: list[int], batch: int):
        self.types = list(types)
        self.batch = batch
        self.work = batch * per_sample_times(tables, self.types, sizes)  # [types, blocks]: B t[b,k]
        speed = 1.0 / self.work.sum(axis=1)
        self._duals: list[np.ndarray] = [speed]  # dual points known feasible for any type set
        self._lp: dict[tuple[int, ...], float] = {}

    def vector(self, type_counts: dict[str, int]) -> tuple[int, ...]:
        return tuple(int(type_counts.get(t, 0)) for t in self.types)

    def lp(self, type_counts: dict[str, int]) -> float:
        """The LP bound (as :func:`hetplan.solve.bounds.compute_lower_bound`) of a cluster with these
        devices per type, memoised; its optimal dual point joins the cuts :meth:`fast` applies."""
        n = self.vector(type_counts)
        if n not in self._lp:
            self._lp[n] = self._solve(np.array(n, dtype=float))
        return self._lp[n]

    def _solve(self, n: np.ndarray) -> float:
        idx = [k for k in range(len(self.types)) if n[k] > 0]
        bound, marginals = split_lp(self.work[idx], n[idx])
        dual = np.zeros(len(self.types))
        dual[idx] = np.maximum(0.0, -marginals)
        if dual.sum() > 0:
            # types absent here get a price from the speed-proportional point, scaled to the same
            # total on the types present: any lam >= 0 is dual feasible, this one is rarely useless
            speed = self._duals[0]
            absent = [k for k in range(len(self.types)) if k not in idx]
            dual[absent] = speed[absent] * dual[idx].sum() / speed[idx].sum()
            self._duals.append(dual)
        return bound

    @staticmethod
    def groups(n: np.ndarray) -> list[tuple[np.ndarray, list[int]]]:
        """The rows of ``n`` grouped by which types they have (for :meth:`fast`): (rows, types)."""
        present = n > 0
        masks = np.unique(present, axis=0)
        return [(np.flatnonzero(np.all(present == m, axis=1)), [int(i) for i in np.flatnonzero(m)]) for m in masks]

    def fast(self, n: np.ndarray, groups: list | None = None, since: int = 0) -> np.ndarray:
        """A lower bound on the LP of every row of ``n`` ([candidates, types]: devices per type), the
        best of the known dual points from index ``since`` on (0 for all). Never above the LP.
        ``groups``: :meth:`groups` of ``n``, when the caller keeps them."""
        out = np.zeros(n.shape[0])
        known = np.array(self._duals[since:]).reshape(-1, len(self.types))  # [cuts, types]
        for rows, idx in self.groups(n) if groups is None else groups:
            if not idx:
                out[rows] = np.inf
                continue
            if not len(known):
                continue
            duals = known[:, idx]  # [cuts, types here]
            numer = (self.work[idx][None, :, :] * duals[:, :, None]).min(axis=1).sum(axis=1)  # [cuts]
            denom = n[rows][:, idx] @ duals.T  # [rows, cuts]
            with np.errstate(divide="ignore", invalid="ignore"):
                value = np.where(denom > 0, numer[None, :] / denom, 0.0)
            out[rows] = value.max(axis=1)
        return out

    @property
    def cuts(self) -> int:
        """How many dual points are known (for :meth:`fast`'s ``since``)."""
        return len(self._duals)
