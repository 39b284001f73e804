"""Fast cost lookups for the search: stage time and memory of any block range in O(1).

    tables = CostTables(profile, cluster, optimizer="adam")
    tables.stage_time("A100-80GB", m=4, start=0, end=9)        # fwd + bwd seconds, one micro-batch
    tables.tp_options(1, 9)                                     # (1, 2, 4, 8): degrees every block has
    tables.stage_time("A100-80GB", 4, 1, 9, tp=2, recompute="selective", tp_link=node.link)
    tables.stage_memory(device_type, 0, 9, m=4, in_flight=3)   # bytes, the memory walk's peak
    tables.fits(device_type, 1, 9, m=4, in_flight=3, tp=2, recompute="full", zero_holders=4)

Prefix sums over blocks, per device type, micro-batch size, degree, recomputation and link,
computed once and cached. Times come from the same formula the simulator uses
(:func:`hetplan.simulate.costs.block_costs`), memory from the per-sample terms of the memory walk
(:func:`hetplan.simulate.memory.stage_terms`, here as prefix sums: O(1) a range but the workspace's
maximum), so the search and the simulator agree (tests/simulate/test_tensor_parallel_costs.py).

The API helper C builds against (issue 10), final signatures::

    CostTables.tp_options(start, end, type_name=None) -> tuple[int, ...]
    CostTables.stage_time(type_name, m, start, end, *, tp=1, recompute="none", tp_link=None) -> float
    CostTables.stage_memory(device, start, end, *, m, in_flight, tp=1, recompute="none",
                            zero_holders=1, reduced=None, n_micro=None) -> float
    CostTables.fits(device, start, end, *, m, in_flight, tp=1, recompute="none",
                    zero_holders=1, reduced=None, n_micro=None) -> bool

``type_name`` (optional) keeps only the degrees with times for that type. ``reduced``: whether the
stage's gradients go through all-reduce buckets (another device holds its blocks); None means
``zero_holders > 1``. ``n_micro``: the micro-batches the stage runs (fp32 only: None assumes more
than ``in_flight``, an upper bound).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from hetplan.contracts.catalog import DeviceType
from hetplan.contracts.cluster import Cluster, Link
from hetplan.contracts.model_profile import ModelProfile
from hetplan.simulate.costs import block_costs
from hetplan.simulate.memory import (
    FP32_BYTES,
    MIXED_PRECISION,
    OPTIMIZER_STATE_BYTES,
    held_output_bytes,
    static_bytes_per_param,
)

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
        self._tp_prefix = lru_cache(maxsize=None)(self._compute_tp_prefix)
        self._terms = lru_cache(maxsize=None)(self._compute_terms)
        self._arrays = lru_cache(maxsize=None)(self._compute_arrays)
        self._degrees = [profile.tp_degrees(i) for i in range(self.n)]
        self._options = lru_cache(maxsize=None)(self._compute_options)

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

    # -- tensor parallelism and recomputation ---------------------------------------------------
    def tp_options(self, start: int, end: int, type_name: str | None = None) -> tuple[int, ...]:
        """Tensor-parallel degrees every block of ``[start, end)`` has (always 1), ascending; with
        ``type_name``, only those with times for that device type."""
        return self._options(start, end, type_name)

    def _compute_options(self, start: int, end: int, type_name: str | None) -> tuple[int, ...]:
        if type_name is None:
            common = set(self._degrees[start])
            for b in range(start + 1, end):
                common &= set(self._degrees[b])
        else:
            device = self.device_type(type_name)
            common = set(self.profile.tp_degrees(start, device))
            for b in range(start + 1, end):
                common &= set(self.profile.tp_degrees(b, device))
        return tuple(sorted(common))

    def _compute_tp_prefix(
        self, type_name: str, m: int, tp: int, recompute: str, link: tuple[float, float] | None
    ) -> np.ndarray:
        """Cumulative fwd + bwd seconds at a degree and recomputation (a block lacking the degree counts 0)."""
        fwd, bwd = block_costs(
            self.profile,
            self.device_type(type_name),
            m,
            tp=tp,
            recompute=recompute,
            link=Link(bandwidth=link[0], latency=link[1]) if link is not None else None,
            collective_efficiency=self.cluster.collective_efficiency,
        )
        per_block = np.asarray(fwd) + np.asarray(bwd)
        # blocks without the degree cost nothing here (a NaN would poison every later prefix):
        # stage_time refuses a range that holds one
        return np.concatenate([[0.0], np.cumsum(np.nan_to_num(per_block, nan=0.0))])

    def stage_time(
        self,
        type_name: str,
        m: int,
        start: int,
        end: int,
        *,
        tp: int = 1,
        recompute: str = "none",
        tp_link: Link | None = None,
    ) -> float:
        """Forward + backward seconds of one micro-batch of ``m`` samples on one replica of blocks
        ``[start, end)``: at degree ``tp`` each member's compute plus the blocks' all-reduces over
        ``tp_link`` (the node's own link), with what ``recompute`` adds (the simulator's formula).
        NaN where a block lacks the degree, or times for ``type_name`` at it (see :meth:`tp_options`)."""
        if tp == 1 and recompute == "none":
            p = self.prefix(type_name, m)
            return float(p[end] - p[start])
        if tp > 1 and tp not in self.tp_options(start, end, type_name):
            return float("nan")
        link = (tp_link.bandwidth, tp_link.latency) if tp_link is not None and tp > 1 else None
        p = self._tp_prefix(type_name, m, tp, recompute, link)
        return float(p[end] - p[start])

    # -- memory ---------------------------------------------------------------------------------
    def static_memory(self, start: int, end: int) -> float:
        """Weights, gradients and optimizer state of blocks ``[start, end)`` (degree 1, no ZeRO),
        with the copies of the shared parameters the range holds."""
        shared_params, shared_weights = self.profile.shared_held(start, end)
        weights = self.param_bytes[end] - self.param_bytes[start] + shared_weights
        params = self.params[end] - self.params[start] + shared_params
        return float(weights + self.state_per_param * params)

    def _compute_arrays(self, tp: int, recompute: str) -> tuple[np.ndarray, ...]:
        """Per block at degree ``tp`` with ``recompute``, as :func:`hetplan.simulate.memory.stage_terms`
        counts them: prefix sums of params, weights and saved bytes per sample, and each block's
        backward workspace (0 for a block without the degree; :meth:`stage_memory` refuses such ranges)."""
        params, weights, saved, workspace = [], [], [], []
        for b, block in enumerate(self.profile.blocks):
            if tp > 1 and tp not in block.tensor_parallel:  # 0, not NaN: it would poison the prefix sums
                for values in (params, weights, saved, workspace):
                    values.append(0.0)
                continue
            sh = block.shard(tp)
            params.append(float(sh.params))
            weights.append(sh.param_bytes)
            if recompute == "full":  # the block's input, as stage_terms
                saved.append(self.profile.blocks[b - 1].output_bytes if b > 0 else self.profile.input_bytes)
                workspace.append(2.0 * sh.activation_bytes)
            elif recompute == "selective":
                saved.append(sh.activation_bytes - sh.selective_bytes)
                workspace.append(sh.activation_bytes + sh.selective_bytes)
            else:
                saved.append(sh.activation_bytes)
                workspace.append(sh.activation_bytes)

        def cum(values: list[float]) -> np.ndarray:
            return np.concatenate([[0.0], np.cumsum(values)])

        return cum(params), cum(weights), cum(saved), np.asarray(workspace)

    def _compute_terms(self, start: int, end: int, tp: int, recompute: str, zero_holders: int) -> tuple:
        params_cum, weights_cum, saved_cum, workspace = self._arrays(tp, recompute)
        params = float(params_cum[end] - params_cum[start])
        weights = float(weights_cum[end] - weights_cum[start])
        shared_params, shared_weights = self.profile.shared_held(start, end, tp)  # tied copies
        out_bytes = held_output_bytes(self.profile, end, tp)  # a vocabulary-parallel head's: 1/t
        held = float(saved_cum[end] - saved_cum[start]) + out_bytes
        grad_in = 0.0 if end == self.n else out_bytes
        grad_out = 0.0 if start == 0 else self.profile.blocks[start - 1].output_bytes
        # the backward's peak beyond what the forward kept (simulate.memory.backward_extra): the
        # blocks after the one running have freed what they saved
        extra = float((workspace[start:end] + saved_cum[start + 1 : end + 1]).max() - saved_cum[end])
        during = grad_in + grad_out + extra
        dtype = self.profile.dtype
        mixed = dtype in MIXED_PRECISION
        sharded = zero_holders > 1  # ZeRO-1: a flat fp32 master shard and gradient buffer, any dtype
        per_param = OPTIMIZER_STATE_BYTES[self.optimizer] + (FP32_BYTES if mixed or sharded else 0.0)
        state = per_param * params / max(1, zero_holders)
        # a tied copy: stepped whole by each holder, its gradient summed in place (no bucket)
        state += (OPTIMIZER_STATE_BYTES[self.optimizer] + (FP32_BYTES if mixed else 0.0)) * shared_params
        buckets = FP32_BYTES * params if mixed else weights
        gradients = buckets + (FP32_BYTES * shared_params if mixed else shared_weights)
        return mixed or sharded, weights + shared_weights, gradients, state, held, during, buckets

    def stage_memory(
        self,
        device: DeviceType,
        start: int,
        end: int,
        *,
        m: int,
        in_flight: int,
        tp: int = 1,
        recompute: str = "none",
        zero_holders: int = 1,
        reduced: bool | None = None,
        n_micro: int | None = None,
    ) -> float:
        """Peak live tensor bytes on one member of a replica holding ``[start, end)`` with
        ``in_flight`` micro-batches of ``m`` samples: the memory walk's peak in closed form
        (docs/cost-model.md, Memory). With ``A = in_flight·m·held + m·(boundary gradients +
        backward workspace)`` (the first backward) and the buckets ``G`` (the gradients' size,
        where ``reduced``): fp16/bf16 static + max(A, G); fp32, whose gradients exist only from
        the first backward on, weights + state + max(A, gradients + later, gradients + G), where
        ``later`` is A again if more than ``in_flight`` micro-batches run (``n_micro``; None:
        assumed, an upper bound), else the second backward's ``(in_flight - 1)·m·held + m·(...)``.
        ``zero_holders``: the devices the stage's optimizer state is sharded over (ZeRO-1; 1 without)."""
        if tp > 1 and tp not in self.tp_options(start, end):
            return float("inf")
        mixed, weights, gradients, state, held, during, bucket_bytes = self._terms(
            start, end, tp, recompute, zero_holders
        )
        shared = zero_holders > 1 if reduced is None else reduced
        buckets = bucket_bytes if shared else 0.0
        first = in_flight * m * held + m * during
        if mixed:
            return float(weights + gradients + state + max(first, buckets))
        if n_micro is None or n_micro > in_flight:
            later = first
        else:
            later = (in_flight - 1) * m * held + m * during if in_flight > 1 else 0.0
        return float(weights + state + max(first, gradients + later, gradients + buckets))

    def fits(
        self,
        device: DeviceType,
        start: int,
        end: int,
        *,
        m: int,
        in_flight: int,
        tp: int = 1,
        recompute: str = "none",
        zero_holders: int = 1,
        reduced: bool | None = None,
        n_micro: int | None = None,
    ) -> bool:
        """Whether :meth:`stage_memory` fits ``device`` (fragmentation and reserve as the walk)."""
        need = self.stage_memory(
            device,
            start,
            end,
            m=m,
            in_flight=in_flight,
            tp=tp,
            recompute=recompute,
            zero_holders=zero_holders,
            reduced=reduced,
            n_micro=n_micro,
        )
        return device.fits(need)
