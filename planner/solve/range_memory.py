"""Memory of every block range at once: the search's numpy twin of :meth:`CostTables.stage_memory`.

    terms = range_terms(profile, optimizer="adam", tp=2, recompute="selective", zero_holders=4)
    need = terms.memory(m=2, in_flight=3, shared=True)     # (n+1) x (n+1) bytes, inf where unusable

The partition DP needs the memory of all n^2 / 2 block ranges for each option; asking
:meth:`CostTables.stage_memory` range by range costs O(n) per range (it walks the blocks), too slow
for planning in a second. The peak has the form ``static + max(in_flight m held + m during,
buckets)``, whose four terms depend on the range, degree, recomputation and ZeRO holders but not on
the micro-batch or the position in the pipeline, so they are built here once per option from prefix
sums (and a running maximum for the backward workspace) with the memory walk's formulas
(:func:`hetplan.simulate.memory.stage_terms`). tests/solve/test_tp_search.py checks every range
against :meth:`CostTables.stage_memory`, and tests/simulate/test_backward_workspace.py the backward's
term against the walk's, so the three cannot drift apart silently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetplan.contracts.model_profile import ModelProfile
from hetplan.simulate.memory import FP32_BYTES, MIXED_PRECISION, OPTIMIZER_STATE_BYTES, held_output_bytes

__all__ = ["RangeBase", "RangeTerms", "range_base", "range_terms"]


@dataclass(frozen=True)
class RangeTerms:
    """``[i, j]``-indexed matrices (i < j; elsewhere and where a block lacks the degree: unusable)."""

    usable: np.ndarray  # bool
    static: np.ndarray  # weights, gradients, optimizer state (and fp32 master copy)
    held: np.ndarray  # per sample, kept from a forward to its backward
    during: np.ndarray  # per sample, extra during a backward (gradients in and out, workspace)
    buckets: np.ndarray  # all-reduce buckets of a shared stage

    def memory(self, *, m: int, in_flight: int, shared: bool) -> np.ndarray:
        """Peak live tensor bytes of one device per range (inf where unusable)."""
        activations = in_flight * m * self.held + m * self.during
        if shared:
            activations = np.maximum(activations, self.buckets)
        return np.where(self.usable, self.static + activations, np.inf)


def _prefix(values: list[float]) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(values)])


def range_terms(profile: ModelProfile, *, optimizer: str, tp: int, recompute: str, zero_holders: int) -> RangeTerms:
    """The four terms of every range at one degree, recomputation and ZeRO-1 sharding."""
    return range_base(profile, optimizer=optimizer, tp=tp, recompute=recompute).terms(zero_holders)


@dataclass(frozen=True)
class RangeBase:
    """What :func:`range_terms` computes before the ZeRO-1 holders come in (only the optimizer
    state depends on them): built once per degree and recomputation, sharded per holder count."""

    usable: np.ndarray
    weights: np.ndarray  # per range: weight bytes (with the shared parameters' copies)
    gradients: np.ndarray  # per range: gradient bytes (with the copies')
    params: np.ndarray  # per range: the blocks' own parameters
    per_param: float  # optimizer state (and fp32 master copy) per parameter
    held: np.ndarray
    during: np.ndarray
    zero_master: float = 0.0  # fp32 runs: the master shard a ZeRO-1 holder steps (mixed: in per_param)
    buckets: np.ndarray | None = None  # per range: the all-reduce buckets (None: the gradients)
    shared_state: np.ndarray | float = 0.0  # per range: the copies' optimizer state (never sharded)

    def terms(self, zero_holders: int) -> RangeTerms:
        """The terms with the optimizer state sharded over ``zero_holders`` devices (1: none)."""
        if zero_holders > 1:
            state = (self.per_param + self.zero_master) * self.params / zero_holders
        else:
            state = self.per_param * self.params
        static = self.weights + self.gradients + state + self.shared_state
        buckets = self.gradients if self.buckets is None else self.buckets
        return RangeTerms(usable=self.usable, static=static, held=self.held, during=self.during, buckets=buckets)


def range_base(profile: ModelProfile, *, optimizer: str, tp: int, recompute: str) -> RangeBase:
    """Every range's terms at one degree and recomputation, but the sharded optimizer state."""
    blocks = profile.blocks
    n = len(blocks)
    has = [tp == 1 or tp in b.tensor_parallel for b in blocks]
    shards = [profile.shard(b, tp) if has[b] else None for b in range(n)]
    zero = [0.0] * n

    def per_block(get) -> list[float]:
        return [float(get(sh)) if sh is not None else 0.0 for sh in shards] if shards else zero

    params = _prefix(per_block(lambda sh: sh.params))
    weights = _prefix(per_block(lambda sh: sh.param_bytes))
    act = per_block(lambda sh: sh.activation_bytes)
    sel = per_block(lambda sh: sh.selective_bytes)
    output = [float(b.output_bytes) for b in blocks]
    inputs = [output[b - 1] if b > 0 else float(profile.input_bytes) for b in range(n)]
    if recompute == "full":
        saved, work = _prefix(inputs), [2.0 * a for a in act]
    elif recompute == "selective":
        saved, work = (
            _prefix([a - s for a, s in zip(act, sel, strict=True)]),
            [a + s for a, s in zip(act, sel, strict=True)],
        )
    else:
        saved, work = _prefix(act), act
    mixed = profile.dtype in MIXED_PRECISION
    per_param = OPTIMIZER_STATE_BYTES[optimizer] + (FP32_BYTES if mixed else 0.0)

    i = np.arange(n + 1)[:, None]
    j = np.arange(n + 1)[None, :]
    lack = _prefix([0.0 if h else 1.0 for h in has])
    usable = (i < j) & (lack[None, :] == lack[:, None])
    p = params[None, :] - params[:, None]
    w = weights[None, :] - weights[:, None]
    gradients = FP32_BYTES * p if mixed else w
    last = held_output_bytes(profile, n, tp) if has[-1] else output[-1]  # a vocabulary-parallel head's: 1/t
    out_end = np.concatenate([[0.0], output[:-1], [last]])  # output of block j - 1, by end j
    held = saved[None, :] - saved[:, None] + out_end[None, :]
    # the backward's peak beyond what the forward kept (simulate.memory.backward_extra): the most
    # over the range's blocks k of work[k] + saved up to k, by a running maximum over ends, less
    # all the range saved (the blocks after k have freed theirs when k's backward runs)
    peak_at = np.asarray(work, dtype=float) + saved[1:]
    workspace = np.zeros((n + 1, n + 1))
    for s in range(n):
        workspace[s, s + 1 :] = np.maximum.accumulate(peak_at[s:]) - saved[s + 1 :]
    grad_in = np.where(j == n, 0.0, out_end[None, :])
    grad_out = np.where(i == 0, 0.0, out_end[:, None])
    during = grad_in + grad_out + workspace
    if not profile.shared:
        return RangeBase(
            usable=usable,
            weights=w,
            gradients=gradients,
            params=p,
            per_param=per_param,
            held=held,
            during=during,
            zero_master=0.0 if mixed else FP32_BYTES,
        )
    shared_p, shared_w = _shared_per_range(profile, tp)
    return RangeBase(
        usable=usable,
        weights=w + shared_w,
        gradients=gradients + (FP32_BYTES * shared_p if mixed else shared_w),
        params=p,
        per_param=per_param,
        held=held,
        during=during,
        zero_master=0.0 if mixed else FP32_BYTES,
        buckets=gradients,
        shared_state=per_param * shared_p,
    )


def _shared_per_range(profile: ModelProfile, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """(params, bytes) of the shared parameters' copies a range ``[i, j)`` holds, each entry once:
    it holds one where the entry's first holder at or after ``i`` lies before ``j``."""
    n = len(profile.blocks)
    ends = np.arange(n + 1)[None, :]
    params = np.zeros((n + 1, n + 1))
    weights = np.zeros((n + 1, n + 1))
    for entry in profile.shared:
        after = np.full(n + 1, n + 1)  # the first holder at or after each start
        for b in sorted(entry.blocks, reverse=True):
            after[: b + 1] = b
        holds = after[:, None] < ends
        member_params, member_bytes = entry.at(tp)
        params += holds * float(member_params)
        weights += holds * float(member_bytes)
    return params, weights
