"""The model zoo: block-by-block determinism, the analytic block list, the synthetic task, bad input."""

from __future__ import annotations

import pytest
import torch

from hetplan.errors import HetplanError
from hetplan.models import resolve_model
from hetplan.profile.analytic import FAMILIES

GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 97}}
RESNET18 = {"family": "resnet", "config": {"depth": 18, "image_size": 32, "classes": 10}}
RESNET50 = {"family": "resnet", "config": {"depth": 50, "image_size": 32, "classes": 10}}
VGG16 = {"family": "vgg", "config": {"depth": 16, "image_size": 32, "classes": 10}}
MLP = {"family": "mlp", "config": {"layers": 3, "width": 32, "input": 24, "classes": 5}}
USER = {"factory": "user_models:build", "config": {"width": 16}, "input_shape": [8]}
USER_LIST = {"factory": "user_models:build_list", "config": {}, "input_shape": [8]}
USER_CONV = {"factory": "user_models:build_conv", "input_shape": [3, 8, 8]}

ZOO_MODELS = {"gpt": GPT, "resnet18": RESNET18, "resnet50": RESNET50, "vgg16": VGG16, "mlp": MLP}
ALL_MODELS = {**ZOO_MODELS, "user": USER, "user_list": USER_LIST, "user_conv": USER_CONV}


def run(blocks: list[torch.nn.Module], x: torch.Tensor) -> list[torch.Tensor]:
    outs = []
    for block in blocks:
        x = block(x)
        outs.append(x)
    return outs


# -- the block list ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [
        GPT,
        RESNET18,
        RESNET50,
        VGG16,
        MLP,
        {"family": "vgg", "config": {"depth": 19}},
        {"family": "resnet", "config": {"depth": 101}},
    ],
    ids=["gpt", "resnet18", "resnet50", "vgg16", "mlp", "vgg19", "resnet101"],
)
def test_block_names_and_kinds_are_the_analytic_familys(model: dict) -> None:
    zoo = resolve_model(model)
    costs = FAMILIES[model["family"]].blocks(model["config"])
    assert zoo.block_names() == [c.name for c in costs]
    assert zoo.block_kinds() == [c.kind for c in costs]
    assert zoo.n_blocks == len(costs)


def test_missing_config_keys_take_the_family_defaults() -> None:
    zoo = resolve_model({"family": "gpt", "config": {"layers": 1, "hidden": 64, "heads": 4}})
    assert zoo.model == {"family": "gpt", "config": {**FAMILIES["gpt"].defaults, "layers": 1, "hidden": 64, "heads": 4}}
    assert resolve_model({"family": "mlp"}).model["config"] == FAMILIES["mlp"].defaults


# -- determinism ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ALL_MODELS))
def test_blocks_built_alone_equal_blocks_built_together_bit_for_bit(name: str) -> None:
    zoo = resolve_model(ALL_MODELS[name])
    together = zoo.build_blocks(0, zoo.n_blocks, seed=3)
    alone = [zoo.build_block(i, seed=3) for i in range(zoo.n_blocks)]
    for a, b in zip(together, alone, strict=True):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    x, _ = zoo.sample_batch(2, seed=0, step=0)
    for oa, ob in zip(run(together, x), run(alone, x), strict=True):
        assert torch.equal(oa, ob)
    # a slice of the model is the same slice
    end = min(4, zoo.n_blocks - 1)
    middle = zoo.build_blocks(1, end, seed=3)
    for a, b in zip(middle, together[1:end], strict=True):
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_the_seed_changes_the_parameters_and_building_leaves_the_global_rng_alone() -> None:
    zoo = resolve_model(GPT)
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = zoo.build_block(1, seed=0)
    assert torch.equal(torch.random.get_rng_state(), before)
    b = zoo.build_block(1, seed=1)
    c = zoo.build_block(3, seed=0)  # another layer of the same shape: other numbers
    assert not torch.equal(a.qkv.weight, b.qkv.weight)
    assert not torch.equal(a.qkv.weight, c.qkv.weight)


def test_a_block_index_out_of_range_is_refused() -> None:
    zoo = resolve_model(MLP)
    with pytest.raises(HetplanError):
        zoo.build_block(3, seed=0)
    with pytest.raises(HetplanError):
        zoo.build_blocks(2, 1, seed=0)


# -- the synthetic task -----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ALL_MODELS))
def test_sample_batch_is_deterministic_and_a_smaller_batch_is_a_prefix(name: str) -> None:
    zoo = resolve_model(ALL_MODELS[name])
    x, y = zoo.sample_batch(6, seed=1, step=2)
    x2, y2 = zoo.sample_batch(6, seed=1, step=2)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    xs, ys = zoo.sample_batch(4, seed=1, step=2)
    assert torch.equal(xs, x[:4]) and torch.equal(ys, y[:4])
    assert x.shape == (6, *zoo.sample_shape())
    assert x.dtype == zoo.input_dtype()
    xn, _ = zoo.sample_batch(6, seed=1, step=3)
    assert not torch.equal(xn, x)
    xo, _ = zoo.sample_batch(6, seed=2, step=2)
    assert not torch.equal(xo, x)


def test_gpt_targets_are_the_next_tokens_of_the_teacher_chain() -> None:
    zoo = resolve_model(GPT)
    x, y = zoo.sample_batch(3, seed=0, step=0)
    assert x.dtype == torch.long and x.shape == (3, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])
    table = zoo.teacher(0)
    for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
        for a, b in zip(row_x, row_y, strict=True):
            assert b in table[a]


@pytest.mark.parametrize("name", [n for n in ALL_MODELS if n != "vgg16"])  # vgg: resnet's task, 138M weights
def test_the_loss_is_a_sum_over_samples(name: str) -> None:
    zoo = resolve_model(ALL_MODELS[name])
    blocks = zoo.build_blocks(0, zoo.n_blocks, seed=0)
    x, y = zoo.sample_batch(4, seed=0, step=0)
    with torch.no_grad():
        out = run(blocks, x)[-1]
        whole = zoo.loss(out, y)
        halves = zoo.loss(out[:1], y[:1]) + zoo.loss(out[1:], y[1:])
    assert whole.dim() == 0
    assert whole.item() == pytest.approx(halves.item(), rel=1e-5)
    assert whole.item() > 0


@pytest.mark.parametrize(
    ("model", "make_opt", "steps", "batch"),
    [
        (MLP, lambda p: torch.optim.SGD(p, lr=0.5), 40, 32),
        (GPT, lambda p: torch.optim.Adam(p, lr=1e-2), 25, 16),
    ],
    ids=["mlp-sgd", "gpt-adam"],
)
def test_the_synthetic_task_is_learnable(model: dict, make_opt, steps: int, batch: int) -> None:
    zoo = resolve_model(model)
    net = torch.nn.Sequential(*zoo.build_blocks(0, zoo.n_blocks, seed=0))
    opt = make_opt(net.parameters())
    held_x, held_y = zoo.sample_batch(64, seed=0, step=10_000)

    def held_out() -> float:
        with torch.no_grad():
            return zoo.loss(net(held_x), held_y).item() / 64

    before = held_out()
    for step in range(steps):
        x, y = zoo.sample_batch(batch, seed=0, step=step)
        opt.zero_grad()
        (zoo.loss(net(x), y) / batch).backward()
        opt.step()
    assert held_out() < 0.8 * before


# -- user factories ---------------------------------------------------------------------------


def test_a_user_factory_takes_its_sequentials_names_and_the_probe_picks_the_task() -> None:
    zoo = resolve_model(USER)
    assert zoo.block_names() == ["fc1", "fc2", "out"]
    assert zoo.block_kinds() == ["sequential", "sequential", "linear"]
    assert zoo.model == {"factory": "user_models:build", "config": {"width": 16}, "input_shape": [8]}
    _, y = zoo.sample_batch(5, seed=0, step=0)
    assert y.dtype == torch.long and int(y.max()) < 4  # classification over the 4 logits
    regression = resolve_model(USER_LIST)
    assert regression.block_names() == ["block0", "block1", "block2"]
    _, y = regression.sample_batch(5, seed=0, step=0)
    assert y.shape == (5, 1) and y.dtype == torch.float32


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "field", "words"),
    [
        ({"family": "gtp"}, "family", "did you mean 'gpt'"),
        ({"family": "bert"}, "family", "no torch implementation"),
        ({"family": "gpt", "config": {"layerz": 2}}, "config.layerz", "did you mean 'layers'"),
        ({"family": "gpt", "config": {"hidden": 64, "heads": 5}}, "config.heads", "divisor"),
        ({"family": "gpt", "extra": 1}, "model.extra", "unknown field"),
        ({"family": "gpt", "factory": "a:b"}, "model", "not both"),
        ({"name": "OPT-350"}, "model", "imported"),
        ("gpt", "model", "expected a mapping"),
        ({"factory": "no_such_module_here:build", "input_shape": [8]}, "factory", "cannot import module"),
        ({"factory": "user_models:nope", "input_shape": [8]}, "factory", "no attribute"),
        ({"factory": "user_models", "input_shape": [8]}, "factory", "package.module:function"),
        ({"factory": "user_models:NOT_CALLABLE", "input_shape": [8]}, "factory", "not callable"),
        ({"factory": "user_models:not_modules", "input_shape": [8]}, "factory", "returned a str"),
        ({"factory": "user_models:list_with_a_number", "input_shape": [8]}, "factory", "not an nn.Module"),
        ({"factory": "user_models:empty", "input_shape": [8]}, "factory", "no blocks"),
        ({"factory": "user_models:broken", "input_shape": [8]}, "factory", "the factory itself is broken"),
        ({"factory": "user_models:build", "config": {"depth": 3}, "input_shape": [8]}, "config", "unexpected"),
        ({"factory": "user_models:returns_tuple", "input_shape": [8]}, "factory", "returned a tuple"),
        ({"factory": "user_models:do_not_chain", "input_shape": [8]}, "factory", "do not chain"),
        ({"factory": "user_models:build", "input_shape": [3, 32, 32]}, "--input-shape", "does not fit"),
        ({"factory": "user_models:build"}, "--input-shape", "needs input_shape"),
        ({"factory": "user_models:build", "input_shape": [0]}, "--input-shape", "positive"),
    ],
)
def test_bad_models_are_located_errors(model: object, field: str, words: str) -> None:
    with pytest.raises(HetplanError) as err:
        resolve_model(model)  # type: ignore[arg-type]
    assert err.value.field == field
    assert words in str(err.value)
    assert "\n" not in str(err.value)
