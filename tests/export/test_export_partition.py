"""Where runtimes cut: DeepSpeed's partition methods as DeepSpeed computes them, transformer
layers found among blocks, and the nearest increasing cut from allowed boundaries."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from builders import make_profile

from hetplan.contracts.model_profile import ModelProfile, load_profile
from hetplan.errors import HetplanError
from hetplan.export.partition import (
    cut_distance,
    deepspeed_parameters,
    deepspeed_uniform,
    nearest_cuts,
    transformer_layers,
)


def _deepspeed_uniform_as_written(num_items: int, num_parts: int) -> list[int]:
    """``deepspeed.runtime.utils.partition_uniform`` step by step (microsoft/DeepSpeed 029615a)."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunksize = num_items // num_parts
    residual = num_items - chunksize * num_parts
    parts = np.arange(0, (num_parts + 1) * chunksize, chunksize)
    for i in range(residual):
        parts[i + 1 :] += 1
    return parts.tolist()


def _deepspeed_balanced_as_written(weights: list[float], num_parts: int) -> list[int]:
    """``partition_balanced``'s triple loop as DeepSpeed writes it, one comparison at a time."""
    n, m = len(weights), num_parts
    if n <= m:
        return _deepspeed_uniform_as_written(n, m)
    inf = float("inf")
    dp_max = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_min = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_cost = [[inf] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    prefix = [0.0, *itertools.accumulate(float(w) for w in weights)]
    dp_max[0][0] = 0.0
    dp_cost[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                max_sum = max(dp_max[k][j - 1], prefix[i] - prefix[k])
                min_sum = min(dp_min[k][j - 1], prefix[i] - prefix[k])
                cost = max_sum - min_sum
                if dp_cost[i][j] >= cost:
                    dp_cost[i][j], dp_max[i][j], dp_min[i][j], position[i][j] = cost, max_sum, min_sum, k
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(position[parts[-1]][j])
    return parts[::-1]


@pytest.mark.parametrize("num_items", range(1, 16))
def test_uniform_matches_deepspeed(num_items: int) -> None:
    for num_parts in range(1, 7):
        assert deepspeed_uniform(num_items, num_parts) == _deepspeed_uniform_as_written(num_items, num_parts)
    assert deepspeed_uniform(10, 3) == [0, 4, 7, 10]  # the first parts take the remainder


def test_parameters_matches_deepspeed_on_random_and_tied_weights() -> None:
    rng = random.Random(7)
    cases = [[1.0] * 8, [5, 1, 1, 5], [0, 0, 3, 0, 0, 3], [4198400, 8392704] * 6]
    cases += [[rng.choice([1, 2, 3, 10, 100]) for _ in range(rng.randint(1, 14))] for _ in range(60)]
    for weights in cases:
        for parts in range(1, 6):
            assert deepspeed_parameters(weights, parts) == _deepspeed_balanced_as_written(weights, parts), (
                weights,
                parts,
            )


def test_nearest_cuts_is_the_closest_increasing_choice() -> None:
    rng = random.Random(3)
    for _ in range(80):
        n = rng.randint(4, 14)
        candidates = sorted(rng.sample(range(1, n), rng.randint(1, n - 1)))
        stages = rng.randint(1, len(candidates) + 1)
        reference = [0, *sorted(rng.sample(range(1, n), stages - 1)), n]
        got = nearest_cuts(reference, candidates, 0, n)
        best = min(
            (cut_distance([0, *c, n], reference), [0, *c, n]) for c in itertools.combinations(candidates, stages - 1)
        )
        assert cut_distance(got, reference) == best[0]
        assert got[0] == 0 and got[-1] == n and all(a < b for a, b in itertools.pairwise(got))
        assert set(got[1:-1]) <= set(candidates)


def test_transformer_layers_of_the_zoo_gpt(inputs) -> None:
    profile: ModelProfile = load_profile(inputs / "gpt.yaml")
    layers = transformer_layers(profile, runtime="X")
    assert layers.starts == (1, 3, 5, 7, 9, 11) and layers.end == 13 and layers.blocks == 14
    assert layers.boundary(6) == 13 and layers.count == 6


def test_a_model_without_transformer_layers_is_refused_in_one_line() -> None:
    profile = make_profile(4)
    profile.file = "mlp.yaml"
    with pytest.raises(HetplanError) as info:
        transformer_layers(profile, runtime="Megatron-LM")
    assert str(info.value).startswith("mlp.yaml: blocks: Megatron-LM trains transformers")
