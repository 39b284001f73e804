"""What an analytic model family produces: per-block costs, and the family record itself.

    fam = FAMILIES["gpt"]
    config = fam.full_config({"layers": 2})          # defaults filled in, every value checked
    costs = fam.blocks(config, "fp16")               # list[BlockCost]
    costs[1].bytes_moved(8)                          # forward bytes at micro-batch 8

Weights are read once per micro-batch while activations scale with it, so a :class:`BlockCost`
keeps the two apart (``weight_traffic`` per call, ``activation_traffic`` per sample) and the
memory roof at micro-batch ``m`` uses ``weight_traffic + m * activation_traffic``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from planner.contracts.catalog import DTYPE_BYTES
from planner.errors import HetplanError

__all__ = ["BlockCost", "Family", "config_error", "dtype_bytes"]


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

    def bytes_moved(self, m: int) -> float:
        """Forward bytes through memory at micro-batch ``m``: weights once, activations ``m`` times."""
        return self.weight_traffic + m * self.activation_traffic

    def bwd_bytes_moved(self, m: int) -> float:
        """Backward bytes at micro-batch ``m``: weight reads and weight-gradient writes once per call,
        twice the forward activation traffic (read saved tensors and output gradients, write input
        gradients)."""
        weights = 2.0 * self.weight_traffic if self.bwd_weight_traffic is None else self.bwd_weight_traffic
        return weights + 2.0 * m * self.activation_traffic


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype``; an unknown dtype is a located error."""
    if dtype not in DTYPE_BYTES:
        raise HetplanError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}", field="dtype")
    return DTYPE_BYTES[dtype]


def config_error(key: str, reason: str) -> HetplanError:
    """A HetplanError located at ``config.<key>``."""
    return HetplanError(reason, field=f"config.{key}")


BlocksFn = Callable[[dict[str, int], str], list[BlockCost]]
CheckFn = Callable[[dict[str, int]], None]
InputBytesFn = Callable[[dict[str, int], str], float]


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

    def full_config(self, config: Mapping[str, Any] | None = None) -> dict[str, int]:
        """Defaults overlaid with ``config``; unknown keys and non-positive integers are refused."""
        if config is not None and not isinstance(config, Mapping):
            raise HetplanError(f"expected a mapping of settings, got {type(config).__name__}", field="config")
        given = dict(config or {})
        out = dict(self.defaults)
        for key, value in given.items():
            if key not in self.defaults:
                close = difflib.get_close_matches(str(key), list(self.defaults), n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                known = ", ".join(self.defaults)
                raise config_error(str(key), f"unknown setting for {self.name}{hint} (known: {known})")
            if isinstance(value, bool) or not isinstance(value, int):
                raise config_error(key, f"expected a positive integer, got {value!r}")
            if value <= 0:
                raise config_error(key, f"expected a positive integer, got {value}")
            out[key] = value
        self.check(out)
        return out

    def blocks(self, config: Mapping[str, Any] | None = None, dtype: str = "fp32") -> list[BlockCost]:
        """Per-block costs for ``config`` (defaults filled in) at ``dtype``."""
        dtype_bytes(dtype)
        return self.build(self.full_config(config), dtype)
