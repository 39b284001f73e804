"""A factory's ModelSpec: its own loss (sum or mean made a sum), any-dtype samples, one-line errors,
and parameters shared between blocks found by identity and counted once."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from hetplan.errors import HetplanError
from hetplan.models import resolve_model
from hetplan.profile.measure import measure_profile


def test_a_spec_brings_int64_inputs_and_its_loss_as_a_sum() -> None:
    zoo = resolve_model({"factory": "user_models:shared_tokens"})
    assert zoo.input_dtype() == torch.long and zoo.sample_shape() == (5,)
    assert zoo.model["input_shape"] == [5]
    x, y = zoo.sample_batch(4, seed=1, step=2)
    assert x.dtype == torch.long and x.shape == (4, 5)
    assert torch.equal(x[:2], zoo.sample_batch(2, seed=1, step=2)[0])  # sample i independent of the size
    h = x
    for b in zoo.build_blocks(0, zoo.n_blocks, seed=0):
        h = b(h)
    mean = F.cross_entropy(h.flatten(0, 1), y.flatten())
    torch.testing.assert_close(zoo.loss(h, y), mean * 4)  # the user's mean, as hetplan's SUM


def test_shared_parameters_are_one_parameter_and_counted_once() -> None:
    zoo = resolve_model({"factory": "user_models:shared_four", "input_shape": [16]})
    assert zoo.tied_parameters() == [((0, "weight"), (2, "weight")), ((0, "bias"), (2, "bias"))]
    blocks = zoo.build_blocks(0, 4, seed=0)
    assert blocks[0].weight is blocks[2].weight
    alone = zoo.build_block(2, seed=0)  # a rank holding only block 2 has the same values
    assert torch.equal(alone.weight, blocks[0].weight)
    profile = measure_profile(zoo.model, micro_batches=(2,), warmup=0, repeat=1)
    assert profile.total_params == 340  # not 612: the shared layer once
    # listed once under ``shared`` (DESIGN.md), in no block's own count
    assert [b.params for b in profile.blocks] == [0, 0, 0, 68]
    assert [(e.name, e.params, e.blocks) for e in profile.shared] == [
        ("block0.weight", 256, (0, 2)),
        ("block0.bias", 16, (0, 2)),
    ]
    # a stage holding block 2 alone keeps a copy; one holding blocks 0 to 2 keeps one
    assert profile.shared_held(2, 4) == (272.0, 272.0 * 4)
    assert profile.shared_held(0, 3) == (272.0, 272.0 * 4)
    assert profile.shared_held(1, 2) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("user_models:spec_tuple_loss", "the loss returned shape [2, 2]; expected a scalar tensor"),
        ("user_models:spec_loss_without_sample", "a ModelSpec with a loss needs sample() too"),
        ("user_models:spec_bad_reduction", "reduction is 'avg'; expected 'mean' or 'sum'"),
        ("user_models:spec_tuple_block", "block 1 (block1) returned a tuple; every block must return one tensor"),
    ],
)
def test_a_spec_that_does_not_fit_is_one_line_naming_the_factory(factory: str, message: str) -> None:
    with pytest.raises(HetplanError) as info:
        resolve_model({"factory": factory})
    text = str(info.value)
    assert "\n" not in text and message in text
    assert factory in text or "block" in text
