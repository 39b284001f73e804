"""Where the runtimes can cut a model: DeepSpeed's partition methods and transformer-layer cuts.

    deepspeed_uniform(10, 3)                  # [0, 4, 7, 10]: what partition_method="uniform" gives
    deepspeed_parameters([5, 1, 1, 5], 2)     # what partition_method="parameters" gives
    layers = transformer_layers(profile)      # first block of each layer, for Megatron and torchtitan
    nearest_cuts(reference, candidates, 0, n) # the closest increasing cut from allowed boundaries

Boundaries are block indices, ``[0, c_1, ..., n]``, as a plan's stages are. The DeepSpeed functions
re-implement ``deepspeed.runtime.utils.partition_uniform`` and ``partition_balanced`` (the dynamic
program on the spread ``max - min`` of part weights, later split points winning ties) as they read
in microsoft/DeepSpeed at commit 029615a; older DeepSpeed releases balanced by a binary search on
the heaviest part instead, which may cut differently (docs/export.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetplan.contracts.model_profile import ModelProfile
from hetplan.errors import HetplanError

__all__ = [
    "TransformerLayers",
    "cut_distance",
    "deepspeed_parameters",
    "deepspeed_uniform",
    "nearest_cuts",
    "transformer_layers",
]

_LAYER = re.compile(r"^layer(\d+)(\..+)?$")
#: Block kinds a transformer layer is made of (the zoo's sub-blocks; Sailor's whole layers).
_LAYER_KINDS = frozenset({"attention", "mlp", "transformer"})


def deepspeed_uniform(num_items: int, num_parts: int) -> list[int]:
    """Boundaries of ``partition_method="uniform"``: equal counts, the first parts one larger."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    return [p * chunk + min(p, residual) for p in range(num_parts + 1)]


def deepspeed_parameters(weights: Sequence[float], num_parts: int) -> list[int]:
    """Boundaries of ``partition_method="parameters"`` on per-layer parameter counts ``weights``.

    DeepSpeed's ``partition_balanced``: over contiguous non-empty parts, minimise the spread
    between the heaviest and the lightest part, extending the best ``j - 1``-part prefix; among
    equal spreads the last split point considered wins (its ``>=`` comparison).
    """
    n, m = len(weights), num_parts
    if n <= m:
        return deepspeed_uniform(n, m)
    inf = float("inf")
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(weights, dtype=float))])
    best_max = np.full((n + 1, m + 1), inf)
    best_min = np.full((n + 1, m + 1), inf)
    cost = np.full((n + 1, m + 1), inf)
    position = np.zeros((n + 1, m + 1), dtype=int)
    best_max[0, 0] = 0.0
    cost[0, 0] = 0.0
    for i in range(1, n + 1):
        part = prefix[i] - prefix[:i]  # the last part's weight for each split point k < i
        for j in range(1, min(i, m) + 1):
            high = np.maximum(best_max[:i, j - 1], part)
            low = np.minimum(best_min[:i, j - 1], part)
            spread = high - low
            k = i - 1 - int(np.argmin(spread[::-1]))  # the last k of the smallest spread
            cost[i, j], best_max[i, j], best_min[i, j], position[i, j] = spread[k], high[k], low[k], k
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(int(position[parts[-1], j]))
    return parts[::-1]


@dataclass(frozen=True)
class TransformerLayers:
    """A transformer's layers among a profile's blocks: blocks ``[0, starts[0])`` come before the
    first layer (embedding), layer ``k`` spans ``[starts[k], starts[k + 1])``, and the blocks from
    ``end`` on come after the last (final norm and head)."""

    starts: tuple[int, ...]
    end: int
    blocks: int

    @property
    def count(self) -> int:
        return len(self.starts)

    def boundary(self, layer: int) -> int:
        """The block where layer ``layer`` begins (``count``: where the last layer ends)."""
        return self.starts[layer] if layer < self.count else self.end


def transformer_layers(profile: ModelProfile, *, runtime: str) -> TransformerLayers:
    """The transformer layers of ``profile``, or a one-line error naming the profile.

    A layer is a run of consecutive blocks named ``layerN`` or ``layerN.part`` of kind attention,
    mlp or transformer, with N counting up from 0 (the zoo's gpt and bert, Sailor's imports);
    anything else before or after belongs to the first or the last stage, as Megatron-LM and
    torchtitan place the embedding and the head.
    """
    starts: list[int] = []
    end = -1
    for i, block in enumerate(profile.blocks):
        match = _LAYER.match(block.name)
        if match is None or block.kind not in _LAYER_KINDS:
            if starts and end < 0:
                end = i
            continue
        if end >= 0:
            raise HetplanError(
                f"{runtime} pipelines transformer layers, and block {i} ({block.name}) is a layer after the "
                f"non-layer block {profile.blocks[end].name}",
                file=profile.file,
                field=f"blocks[{i}]",
            )
        number = int(match.group(1))
        if number == len(starts):
            starts.append(i)
        elif number != len(starts) - 1:
            raise HetplanError(
                f"{runtime} pipelines transformer layers in order, and block {i} ({block.name}) follows "
                f"layer {len(starts) - 1}",
                file=profile.file,
                field=f"blocks[{i}]",
            )
    if not starts:
        raise HetplanError(
            f"{runtime} trains transformers, and this profile has no transformer layers (blocks named "
            "layerN or layerN.attn / layerN.mlp of kind attention, mlp or transformer); export it with deepspeed",
            file=profile.file,
            field="blocks",
        )
    n = len(profile.blocks)
    return TransformerLayers(starts=tuple(starts), end=end if end >= 0 else n, blocks=n)


def cut_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """How far two cuts of the same stage count are apart: blocks moved across boundaries."""
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


def nearest_cuts(reference: Sequence[int], candidates: Sequence[int], first: int, last: int) -> list[int]:
    """``[first, c_1, ..., last]`` with strictly increasing inner boundaries taken from
    ``candidates``, as close as possible to ``reference`` (least :func:`cut_distance`; on a tie the
    earlier boundaries). An exact dynamic program over (boundary, candidate)."""
    inner = len(reference) - 2
    options = sorted({c for c in candidates if first < c < last})
    if inner <= 0:
        return [first, last]
    if len(options) < inner:
        raise ValueError(f"{inner} inner boundaries cannot come from {len(options)} candidates")
    inf = float("inf")
    cost = [[inf] * len(options) for _ in range(inner)]
    back = [[-1] * len(options) for _ in range(inner)]
    for j, c in enumerate(options):
        cost[0][j] = abs(c - reference[1])
    for i in range(1, inner):
        best, arg = inf, -1
        for j, c in enumerate(options):
            if j > 0 and cost[i - 1][j - 1] < best:  # the cheapest strictly earlier candidate
                best, arg = cost[i - 1][j - 1], j - 1
            if arg >= 0:
                cost[i][j] = best + abs(c - reference[i + 1])
                back[i][j] = arg
    j = min(range(len(options)), key=lambda k: (cost[inner - 1][k], k))
    chosen = [options[j]]
    for i in range(inner - 1, 0, -1):
        j = back[i][j]
        chosen.append(options[j])
    return [first, *chosen[::-1], last]
