"""What an analytic model family produces: per-block costs, and the family record itself.

    fam = FAMILIES["gpt"]
    config = fam.full_config({"layers": 2})          # defaults filled in, every value checked
    costs = fam.blocks(config, "fp16")               # list[BlockCost]
    costs[1].bytes_moved(8)                          # forward bytes at micro-batch 8

Weights are read once per micro-batch while activations scale with it, so a :class:`BlockCost`
keeps the two apart (``weight_traffic`` per call, ``activation_traffic`` per sample) and the
memory roof at micro-batch ``m`` uses ``weight_traffic + m * activation_traffic``.

A block is also split into :class:`Work` parts by kind (``gemm``, ``attention``, ``memory``),
because the kernels of a block run one after another and each kind runs on its own roof: a GEMM
at the achieved matmul rate, a LayerNorm at the achieved bandwidth (docs/estimates.md). The parts
add up exactly to the block's totals (checked on construction).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hetplan.contracts.catalog import DTYPE_BYTES
from hetplan.contracts.model_profile import SharedParams
from hetplan.errors import HetplanError
from hetplan.families.base import config_error, full_config
from hetplan.profile.efficiency import TILE

__all__ = ["WORK_KINDS", "BlockCost", "Family", "Work", "config_error", "dtype_bytes", "gemm_work", "memory_work"]

#: The kinds of work a block is split into, each timed on its own roof.
WORK_KINDS = ("gemm", "attention", "memory")


@dataclass(frozen=True)
class Work:
    """One kind of work inside a block: per sample unless the name says otherwise.

    ``tiles`` is the GEMM's output tiles per sample (rows x columns / 128², times the batch of a
    batched matmul): how much parallel work it gives the SMs. None means "large enough to fill any
    GPU" (used where the shape is unknown). Memory work has no tiles and no FLOPs.
    """

    kind: str
    flops: float = 0.0
    traffic: float = 0.0  # activation bytes read and written, per sample
    weight_traffic: float = 0.0  # per call: weights read once however large the micro-batch
    tiles: float | None = 0.0
    kernels: int = 1
    bwd_weight_traffic: float | None = None  # per call; None: 2 x weight_traffic (read W, write dW)

    def __post_init__(self) -> None:
        if self.kind not in WORK_KINDS:
            raise HetplanError(f"unknown kind of work {self.kind!r}; expected one of {', '.join(WORK_KINDS)}")
        if min(self.flops, self.traffic, self.weight_traffic) < 0 or self.kernels < 0:
            raise HetplanError(f"negative amounts in {self!r}")
        if self.kind == "memory" and self.flops:
            raise HetplanError("memory-bound work carries no FLOPs (they would go unpriced)")
        if self.kind != "memory" and self.flops and self.tiles is not None and self.tiles <= 0:
            raise HetplanError(f"a matmul needs output tiles > 0, got {self.tiles!r}")

    @property
    def bwd_weights(self) -> float:
        """Weight bytes the backward touches per call."""
        return 2.0 * self.weight_traffic if self.bwd_weight_traffic is None else self.bwd_weight_traffic


def gemm_work(
    rows: float, inner: float, cols: float, d: int, *, batch: float = 1.0, weights: bool = True, kind: str = "gemm"
) -> Work:
    """A matmul ``[rows x inner] @ [inner x cols]`` per sample (``batch`` of them, batched).

    With ``weights`` the right operand is a weight, read once per call; otherwise (attention's
    batched matmuls) both operands are activations, read for every sample.
    """
    traffic = d * batch * (rows * inner + rows * cols + (0 if weights else inner * cols))
    return Work(
        kind=kind,
        flops=2.0 * batch * rows * inner * cols,
        traffic=float(traffic),
        weight_traffic=float(d * inner * cols) if weights else 0.0,
        tiles=batch * rows * cols / TILE,
        kernels=1,
    )


def memory_work(
    traffic: float, kernels: int, *, weight_traffic: float = 0.0, bwd_weight_traffic: float | None = None
) -> Work:
    """Elementwise, norm, softmax or lookup kernels moving ``traffic`` bytes per sample."""
    return Work(
        kind="memory",
        traffic=float(traffic),
        weight_traffic=float(weight_traffic),
        tiles=None,
        kernels=kernels,
        bwd_weight_traffic=bwd_weight_traffic,
    )


@dataclass(frozen=True)
class BlockCost:
    """Costs of one block, from closed-form formulas (see docs/analytic-profiles.md).

    Per sample unless the name says otherwise. FLOPs count 2 per multiply-add and only matmuls and
    convolutions; elementwise work (norms, activations, softmax, adds) is left to the memory roof.
    """

    name: str
    kind: str
    params: int
    param_bytes: float
    flops_fwd: float  # per sample
    activation_bytes: float  # per sample, kept for backward
    output_bytes: float  # per sample, sent to the next block
    weight_traffic: float  # per micro-batch: weight bytes the forward reads once
    activation_traffic: float  # per sample: activation bytes the forward reads and writes
    work_items: float  # per sample: rows of parallel work (GEMM rows or output pixels)
    kernels: int = 1  # kernels one forward call launches
    bwd_weight_traffic: float | None = None  # per micro-batch; None: 2 x weight_traffic (read W, write dW)
    parts: tuple[Work, ...] = ()  # the same work split by kind; () = one GEMM-like part (see works())
    # what selective recomputation drops (per sample) and the parts that recompute it (a subset of
    # ``parts``: the attention core), Korthikanti et al. 2022
    selective_bytes: float = 0.0
    recompute_parts: tuple[Work, ...] = ()
    # per sample: the tensor-parallel all-reduce at the block's end (0 for an unsplit block)
    allreduce_bytes: float = 0.0

    def __post_init__(self) -> None:
        if not self.parts:
            return
        totals = (
            ("flops_fwd", self.flops_fwd, sum(p.flops for p in self.parts)),
            ("activation_traffic", self.activation_traffic, sum(p.traffic for p in self.parts)),
            ("weight_traffic", self.weight_traffic, sum(p.weight_traffic for p in self.parts)),
            ("bwd_weight_traffic", self.bwd_weights, sum(p.bwd_weights for p in self.parts)),
            ("kernels", float(self.kernels), float(sum(p.kernels for p in self.parts))),
        )
        for name, whole, parts in totals:
            if not math.isclose(whole, parts, rel_tol=1e-9, abs_tol=1e-9):
                raise HetplanError(f"block {self.name}: its parts add up to {name} {parts:g}, not {whole:g}")

    @property
    def bwd_weights(self) -> float:
        """Weight bytes the backward touches per call."""
        return 2.0 * self.weight_traffic if self.bwd_weight_traffic is None else self.bwd_weight_traffic

    def works(self) -> tuple[Work, ...]:
        """The block's work by kind. A block built without parts is one matmul-like part of unknown
        shape (taken as filling the GPU), or pure memory work when it has no FLOPs."""
        if self.parts:
            return self.parts
        kind = "gemm" if self.flops_fwd > 0 else "memory"
        return (
            Work(
                kind=kind,
                flops=self.flops_fwd,
                traffic=self.activation_traffic,
                weight_traffic=self.weight_traffic,
                tiles=None,
                kernels=self.kernels,
                bwd_weight_traffic=self.bwd_weight_traffic,
            ),
        )

    def bytes_moved(self, m: int) -> float:
        """Forward bytes through memory at micro-batch ``m``: weights once, activations ``m`` times."""
        return self.weight_traffic + m * self.activation_traffic

    def bwd_bytes_moved(self, m: int) -> float:
        """Backward bytes at micro-batch ``m``: weight reads and weight-gradient writes once per call,
        twice the forward activation traffic (read saved tensors and output gradients, write input
        gradients)."""
        return self.bwd_weights + 2.0 * m * self.activation_traffic


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype``; an unknown dtype is a located error."""
    if dtype not in DTYPE_BYTES:
        raise HetplanError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}", field="dtype")
    return DTYPE_BYTES[dtype]


BlocksFn = Callable[[dict[str, int], str], list[BlockCost]]
CheckFn = Callable[[dict[str, int]], None]
InputBytesFn = Callable[[dict[str, int], str], float]
#: One device's costs of each block at a tensor-parallel degree (None: the block is not split).
BlocksAtFn = Callable[[dict[str, int], str, int], "list[BlockCost | None]"]
#: ``(config, dtype, degrees) -> [SharedParams]``: the parameters several blocks hold (a tied head)
SharedFn = Callable[[dict[str, int], str, "list[int]"], "list[SharedParams]"]


@dataclass(frozen=True)
class Family:
    """A model family: its config keys with defaults (the CLI's options), a help line, and costs.

    ``build`` receives a full, checked config; call :meth:`blocks`, which checks first.
    ``check`` adds the family's own rules (heads divide hidden, known depths) to the common ones
    (known keys, positive integers). ``input_bytes`` is the per-sample size of the batch input.
    """

    name: str
    defaults: dict[str, int]
    help: str
    build: BlocksFn
    check: CheckFn
    input_bytes: InputBytesFn
    build_at: BlocksAtFn | None = None  # families that split Megatron-style (gpt, bert); None: no TP
    shared_of: SharedFn | None = None  # families that may tie parameters between blocks (gpt's head)

    def shared(self, config: Mapping[str, Any] | None, dtype: str, degrees: list[int]) -> list[SharedParams]:
        """The parameters several of the blocks hold, listed once (none for most families): each
        holder block's costs count them too, and :func:`hetplan.profile.analytic.build` takes them
        out of the blocks for the profile."""
        if self.shared_of is None:
            return []
        return self.shared_of(self.full_config(config), dtype, degrees)

    def full_config(self, config: Mapping[str, Any] | None = None) -> dict[str, int]:
        """Defaults overlaid with ``config``; unknown keys and non-positive integers are refused
        (the rule every family shares: :func:`hetplan.families.full_config`)."""
        return full_config(self.name, self.defaults, self.check, config)

    def blocks(self, config: Mapping[str, Any] | None = None, dtype: str = "fp32") -> list[BlockCost]:
        """Per-block costs for ``config`` (defaults filled in) at ``dtype``."""
        dtype_bytes(dtype)
        return self.build(self.full_config(config), dtype)

    def blocks_at(self, config: Mapping[str, Any] | None, dtype: str, tp: int) -> list[BlockCost | None]:
        """One device's costs per block at tensor-parallel degree ``tp`` (None where a block does
        not split at ``tp``, or the family has no tensor parallelism)."""
        full = self.full_config(config)
        if self.build_at is None or tp < 2:
            return [None] * len(self.build(full, dtype))
        dtype_bytes(dtype)
        return self.build_at(full, dtype, tp)
