"""A factory built for some blocks only: their values are a full call's, bit for bit; the rest on meta.

The full call is the factory run plainly under the seeded RNG (what ``FactoryModel`` did before it
built partially); the partial build must reproduce it whatever blocks it keeps, including custom
initialisations (``randn * 0.02`` parameters, ``trunc_normal_``, which skips meta tensors, and a
rejection loop that depends on the values drawn) and a layer shared by two blocks.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hetplan.models import resolve_model
from hetplan.models.base import derive_seed
from hetplan.models.partial_build import PartialBuildError, build_on_meta, build_partially


class Custom(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(d, d) * 0.02)  # a value made out of place, then wrapped
        self.register_buffer("scale", torch.ones(d))
        self.lin = nn.Linear(d, d)
        nn.init.trunc_normal_(self.lin.weight, std=0.1)  # a no-op on meta in torch: must still draw
        with torch.no_grad():
            self.lin.bias.uniform_(-0.1, 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x @ self.w) * self.scale


def factory() -> list[nn.Module]:
    torch.manual_seed(7)
    emb = nn.Embedding(50, 16)
    head = nn.Linear(16, 50, bias=False)
    head.weight = emb.weight  # tied
    return [emb, Custom(16), nn.LayerNorm(16), nn.Sequential(nn.Conv1d(4, 4, 3), nn.BatchNorm1d(4)), Custom(16), head]


def _state(block: nn.Module) -> dict[str, torch.Tensor]:
    return block.state_dict(keep_vars=True)


@pytest.mark.parametrize("keep", [(0, 1), (1, 3), (2, 5), (4, 6), (5, 6), (0, 6)])
def test_kept_blocks_equal_the_full_call_and_the_others_hold_nothing(keep: tuple[int, int]) -> None:
    full = factory()
    part = build_partially(factory, lambda blocks: blocks[keep[0] : keep[1]])
    for i in range(*keep):
        for key, value in _state(full[i]).items():
            got = _state(part[i])[key]
            assert got.device.type == "cpu" and torch.equal(got, value), (i, key)
    tied_to_kept = {0, 5} if {0, 5} & set(range(*keep)) else set()  # the head's weight is the embedding's
    for i in set(range(6)) - set(range(*keep)) - tied_to_kept:  # (a step count made by torch.tensor(0) is real)
        assert all(t.device.type == "meta" or t.numel() == 1 for t in _state(part[i]).values()), i
    assert part[5].weight is part[0].weight


def test_the_random_generator_ends_where_the_full_call_leaves_it() -> None:
    factory()
    after_full = torch.random.get_rng_state()
    build_partially(factory, lambda blocks: blocks[2:3])
    assert torch.equal(torch.random.get_rng_state(), after_full)


def test_a_factory_that_reads_a_value_it_does_not_keep_is_refused() -> None:
    def reads() -> list[nn.Module]:
        torch.manual_seed(0)
        a, b = nn.Linear(4, 4), nn.Linear(4, 4)
        if a.weight.sum().item() > 100:  # a branch on data outside the kept block
            b = nn.Linear(4, 5)
        return [a, b]

    with pytest.raises((PartialBuildError, RuntimeError, NotImplementedError)):
        build_partially(reads, lambda blocks: blocks[1:])


def test_build_on_meta_gives_the_structure_without_memory() -> None:
    blocks = build_on_meta(factory)
    assert [type(b) for b in blocks] == [type(b) for b in factory()]
    assert all(t.device.type == "meta" or t.numel() == 1 for b in blocks for t in _state(b).values())


# -- through FactoryModel ---------------------------------------------------------------------------------

USER = {"factory": "user_models:build", "config": {"width": 16}, "input_shape": [8]}


def test_a_factory_models_blocks_are_the_users_init_built_alone() -> None:
    import user_models

    zoo = resolve_model(USER)
    torch.manual_seed(derive_seed("factory", 5))
    whole = user_models.build(width=16)
    children = list(whole.children())
    for start, end in [(0, 1), (1, 3), (2, 3)]:
        blocks = zoo.build_blocks(start, end, seed=5)
        for i, block in enumerate(blocks, start):
            assert block.state_dict().keys() == children[i].state_dict().keys()
            for key, value in children[i].state_dict().items():
                assert torch.equal(block.state_dict()[key], value), (i, key)
    assert zoo.built_whole is None  # every build was partial


def test_a_factory_that_cannot_be_built_partially_is_built_whole_with_the_same_values(tmp_path, monkeypatch) -> None:
    (tmp_path / "reading_models.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "def build():\n"
        "    a = nn.Linear(8, 8)\n"
        "    width = 4 if float(a.weight.detach().abs().max()) < 10 else 5  # reads a value\n"
        "    return nn.Sequential(a, nn.Linear(8, width), nn.Linear(width, 2))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import reading_models

    zoo = resolve_model({"factory": "reading_models:build", "input_shape": [8]})
    torch.manual_seed(derive_seed("factory", 0))
    whole = reading_models.build()
    block = zoo.build_blocks(2, 3, seed=0)[0]
    assert zoo.built_whole is not None  # it said why it fell back
    assert torch.equal(block.weight, whole[2].weight)


def test_state_dict_keys_are_the_factorys_own_names() -> None:
    zoo = resolve_model(USER)
    assert zoo.state_dict_keys(0) == {"0.weight": "fc1.0.weight", "0.bias": "fc1.0.bias"}
    assert zoo.state_dict_keys(2) == {"weight": "out.weight", "bias": "out.bias"}
    listed = resolve_model({"factory": "user_models:build_list", "input_shape": [8]})
    assert listed.state_dict_keys(2) == {"weight": "2.weight", "bias": "2.bias"}
