"""Plain modules split at their chain of child calls (hetplan.models.chain): torchvision's ResNet and
VGG layouts (tests/models/tv_like.py), and torchvision itself where it loads."""

from __future__ import annotations

import pytest
import torch
import tv_like
from torch import nn

from hetplan.errors import HetplanError
from hetplan.models import derive_seed, resolve_model
from hetplan.models.chain import split_chain

RESNET18 = ["conv1"] + [f"layer{s}.{j}" for s in range(1, 5) for j in range(2)] + ["fc"]
RESNET50 = ["conv1"] + [f"layer{s}.{j}" for s, n in zip((1, 2, 3, 4), (3, 4, 6, 3), strict=True) for j in range(n)]
VGG11 = [f"features.{i}" for i in (0, 3, 6, 8, 11, 13, 16, 18)] + [f"classifier.{i}" for i in (0, 3, 6)]


def _run(blocks: list[tuple[str, nn.Module]], x: torch.Tensor) -> torch.Tensor:
    for _, block in blocks:
        x = block(x)
    return x


@pytest.mark.parametrize(
    ("build", "names"),
    [
        (tv_like.resnet18, RESNET18),
        (tv_like.resnet50, [*RESNET50, "fc"]),
        (tv_like.vgg11, VGG11),
    ],
    ids=["resnet18", "resnet50", "vgg11"],
)
def test_torchvision_layouts_split_as_the_zoo_splits_and_compute_the_same(build, names) -> None:
    torch.manual_seed(0)
    model = build()
    blocks = split_chain(model, where="test")
    assert [n for n, _ in blocks] == names
    x = torch.randn(2, 3, 64, 64)
    model.eval()  # VGG's dropout off; ResNet's BatchNorm on running statistics, in both
    for _, b in blocks:
        b.eval()
    torch.testing.assert_close(_run(blocks, x), model(x), rtol=0, atol=0)
    # the stem keeps its BatchNorm, ReLU and pool; the head its pool and flatten (ResNet)
    if names is RESNET18:
        assert str(blocks[0][1]).count("conv1 -> bn1 -> relu -> maxpool") == 1
        assert "avgpool -> flatten -> fc" in str(blocks[-1][1])


def test_the_blocks_keys_are_the_models_own() -> None:
    model = tv_like.resnet18()
    blocks = split_chain(model, where="test")
    joined = {k: v for _, b in blocks for k, v in b.state_dict().items()}
    assert list(joined) == list(model.state_dict())
    assert all(joined[k] is v or joined[k].data_ptr() == v.data_ptr() for k, v in model.state_dict().items())


def test_a_module_used_twice_is_one_tied_parameter() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(self.b(self.a(x)))

    blocks = split_chain(Twice(), where="test")
    assert [n for n, _ in blocks] == ["a", "b", "a'"]
    assert blocks[0][1].a is blocks[2][1].a


def test_what_is_not_a_chain_is_one_line_naming_the_module_and_the_node() -> None:
    with pytest.raises(HetplanError) as info:
        split_chain(tv_like.branchy(), where="tv_like:branchy")
    assert info.value.field == "factory"
    text = str(info.value)
    assert "Branchy.forward is not a chain" in text and "'x' goes to 2 operations" in text
    assert "\n" not in text

    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x) if x.sum() > 0 else x

    with pytest.raises(HetplanError, match=r"cannot trace Gated.forward into a chain of child calls \(TraceError"):
        split_chain(Gated(), where="m:gated")


def test_a_factory_returning_a_plain_module_is_split_trained_and_built_partially() -> None:
    zoo = resolve_model({"factory": "tv_like:resnet18", "config": {"num_classes": 4}, "input_shape": [3, 32, 32]})
    assert zoo.block_names() == RESNET18
    assert zoo.state_dict_keys(1)["layer1.0.conv1.weight"] == "layer1.0.conv1.weight"
    _, y = zoo.sample_batch(2, seed=0, step=0)
    assert y.dtype == torch.long  # [B, 4] logits: cross-entropy on class labels
    with torch.random.fork_rng(devices=[]):  # the factory's own call, as hetplan makes it
        torch.manual_seed(derive_seed("factory", 3))
        whole = tv_like.resnet18(num_classes=4)
    for index in (0, 4, zoo.n_blocks - 1):  # a rank builds only its block: the whole model's values
        block = zoo.build_block(index, 3)
        for key, value in block.state_dict().items():
            torch.testing.assert_close(value, whole.state_dict()[key], rtol=0, atol=0)
    assert zoo.built_whole is None  # built partially, not by the full factory call


def _torchvision():
    """torchvision, or a skip saying why (the index's CUDA wheels fail beside a CPU torch at import)."""
    try:
        return pytest.importorskip("torchvision", reason="torchvision is not installed (pip install torchvision)")
    except RuntimeError as exc:  # operator torchvision::nms does not exist
        pytest.skip(f"torchvision does not load beside this torch ({str(exc).splitlines()[0]})")


@pytest.mark.parametrize("arch", ["resnet18", "resnet50", "vgg11"])
def test_torchvision_models_split_by_name(arch: str) -> None:
    tv = _torchvision()
    zoo = resolve_model({"factory": f"torchvision:{arch}", "config": {"num_classes": 4}, "input_shape": [3, 64, 64]})
    model = getattr(tv.models, arch)(num_classes=4).eval()
    blocks = [(n, b.eval()) for n, b in split_chain(model, where=arch)]
    assert zoo.block_names() == [n for n, _ in blocks]
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(_run(blocks, x), model(x), rtol=0, atol=0)


def test_a_parameter_read_outside_a_child_is_refused_and_a_single_layer_is_one_block() -> None:
    class Positional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.pos = nn.Parameter(torch.zeros(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x + self.pos)

    with pytest.raises(HetplanError, match="reads the tensor 'pos' of its own"):
        split_chain(Positional(), where="m:positional")
    layer = nn.Linear(4, 2)
    assert split_chain(layer, where="m:linear") == [("linear", layer)]


def test_a_split_model_starts_from_its_own_state_dict_file(tmp_path) -> None:
    """``--init-from model.pt`` (``torch.save(model.state_dict())``): a rank's blocks read the
    model's own keys, only theirs, BatchNorm statistics included."""
    from hetplan.runtime.weights.materialise import build_rank_blocks

    zoo = resolve_model({"factory": "tv_like:resnet18", "config": {"num_classes": 4}, "input_shape": [3, 32, 32]})
    torch.manual_seed(11)  # other values than the seeded build
    mine = tv_like.resnet18(num_classes=4)
    with torch.no_grad():
        mine.layer2[0].bn1.running_mean.add_(1.5)
    torch.save(mine.state_dict(), tmp_path / "model.pt")
    blocks = build_rank_blocks(zoo, 3, 5, seed=0, init_from=str(tmp_path / "model.pt"))
    assert list(blocks[0].state_dict()) == list(zoo.build_block(3, 0).state_dict())
    for block in blocks:
        for key, value in block.state_dict().items():
            torch.testing.assert_close(value, mine.state_dict()[key], rtol=0, atol=0, msg=key)
