"""A rank's boundary shapes come from the blocks up to its stage's end only, and match the whole model's."""

from __future__ import annotations

import torch

from hetplan.models import resolve_model
from hetplan.runtime.executor import _io_shapes


def test_the_shapes_up_to_a_stage_end_are_the_whole_models_first_ones() -> None:
    zoo = resolve_model({"family": "gpt", "config": {"layers": 2, "hidden": 16, "heads": 2, "seq": 4, "vocab": 11}})
    whole = _io_shapes(zoo, 3, torch.bfloat16, zoo.n_blocks)
    assert len(whole) == zoo.n_blocks and whole[-1][0] == (4, 11)  # the head's logits
    assert whole[0] == ((4, 16), torch.bfloat16)
    for end in range(1, zoo.n_blocks):
        assert _io_shapes(zoo, 3, torch.bfloat16, end) == whole[:end]
