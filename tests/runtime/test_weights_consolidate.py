"""Weights in and out: ``--init-from`` a ``save_pretrained`` folder, train, ``hetplan consolidate``.

The multi-process run (gloo, 2 pipelines x 2 stages, one process per device) starts from a GPT-2
``save_pretrained`` folder (sharded safetensors, tied head) and its checkpoint is consolidated; the
result must load with ``GPT2LMHeadModel.from_pretrained`` and equal plain ``transformers`` training
of the same start, data and optimizer in one process (no hetplan code in that loop), within 1e-5.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from builders import make_cluster

from hetplan.cli import main
from hetplan.contracts.model_profile import Block, ModelProfile, Timing
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.models import resolve_model
from hetplan.runtime.checkpoint import checkpoint_state, save_checkpoint
from hetplan.runtime.data import open_samples
from hetplan.runtime.launcher import launch_local
from hetplan.runtime.precision import Precision
from hetplan.runtime.weights.consolidate import consolidate, consolidated_state

transformers = pytest.importorskip(
    "transformers", reason="the Hugging Face tests need transformers (pip install transformers)"
)
pytest.importorskip("safetensors", reason="safetensors folders need the safetensors package")

#: A tiny GPT-2 without dropout (training must be deterministic to compare with one process).
GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 32,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}  # fmt: skip
MODEL = {"hf": "gpt2", "config": GPT2, "seq": 16}
SEED, LR, STEPS = 3, 0.05, 3


def _profile(model: dict) -> ModelProfile:
    zoo = resolve_model(model)
    timing = {"cpu": {1: Timing(1.0, 1.0)}}
    blocks = [Block(n, "zoo", 0, 0.0, 0.0, 0.0, 0.0, timing) for n in zoo.block_names()]
    return ModelProfile(model=zoo.model, dtype="fp32", blocks=blocks)


def _stage(start: int, end: int, device: str) -> Stage:
    return Stage(start, end, (device,), (1.0,))


def _pretrained(folder: Path) -> None:
    """A user's starting weights: a GPT-2 of its own seed, saved as sharded safetensors."""
    torch.manual_seed(1234)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))
    model.save_pretrained(folder, max_shard_size="40KB")


def _plain_transformers(start: Path, global_batch: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same training in one process, with transformers' own model and loss and torch's SGD."""
    model = transformers.GPT2LMHeadModel.from_pretrained(start)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    zoo = resolve_model(MODEL)
    samples = open_samples(zoo.model, zoo, global_batch=global_batch, seed=SEED)
    losses = []
    for step in range(STEPS):
        ids, _ = samples.step(step).rows(0, global_batch)
        optimizer.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss  # mean over every token: each sample counts T - 1
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach() for k, v in model.state_dict().items()}


def test_init_from_save_pretrained_then_consolidate_equals_plain_transformers(tmp_path, capsys) -> None:
    start, ckpt, out = tmp_path / "start", tmp_path / "ckpt", tmp_path / "out"
    _pretrained(start)
    assert len(list(start.glob("model-*.safetensors"))) > 1  # sharded, with model.safetensors.index.json
    # 2 pipelines x 2 stages: the embedding and the tied head on different ranks of each pipeline
    pipelines = [Pipeline(4, (2, 2), (_stage(0, 3, f"n0/{2 * q}"), _stage(3, 6, f"n0/{2 * q + 1}"))) for q in range(2)]
    plan = Plan(global_batch=8, pipelines=pipelines, optimizer="sgd")
    cluster = make_cluster([("n0", [("cpu", 4)])])
    config = build_rank_config(
        plan, _profile(MODEL), cluster, seed=SEED, lr=LR, backend="gloo", timeout_s=60, init_from=str(start)
    )
    path = tmp_path / "rank-config.yaml"
    write_yaml(config, path)
    result = launch_local(path, steps=STEPS, save=ckpt)
    # every rank logs the step's loss over the global batch (summed across ranks at OPT)
    losses = [r["loss"] for r in sorted(result.records, key=lambda r: r["step"]) if r["rank"] == 0]

    with pytest.raises(SystemExit) as info:
        main(["consolidate", str(ckpt), "-o", str(out)])
    assert info.value.code == 0, capsys.readouterr().err
    assert {p.name for p in out.iterdir()} >= {"model.safetensors", "config.json"}

    loaded = transformers.GPT2LMHeadModel.from_pretrained(out)
    assert loaded.lm_head.weight is loaded.transformer.wte.weight  # tied again by from_pretrained
    ref_losses, ref_state = _plain_transformers(start, 8)
    assert losses == pytest.approx(ref_losses, abs=1e-5)
    for key, value in loaded.state_dict().items():
        torch.testing.assert_close(value, ref_state[key], atol=1e-5, rtol=0, msg=key)
    # the run did start from the folder: its first loss is the pretrained model's
    assert ref_losses[0] == pytest.approx(losses[0], abs=1e-5)


# -- one process: a factory model's checkpoint back to the user's own nn.Sequential ---------------------

FACTORY = """
from collections import OrderedDict

import torch
from torch import nn


def build(width=8):
    return nn.Sequential(OrderedDict(
        embed=nn.Linear(4, width),
        body=nn.Sequential(nn.Linear(width, width), nn.BatchNorm1d(width), nn.ReLU()),
        out=nn.Linear(width, 3),
    ))
"""


@pytest.fixture
def factory_module(tmp_path, monkeypatch) -> str:
    (tmp_path / "weights_models.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "weights_models:build"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_consolidate_gives_the_factory_models_own_state_dict(tmp_path, factory_module, dtype: str) -> None:
    import weights_models

    zoo = resolve_model({"factory": factory_module, "input_shape": [4]})
    blocks = zoo.build_blocks(0, zoo.n_blocks, seed=0)
    with torch.no_grad():  # values a run could have left: distinct from the seeded build
        for b in blocks:
            for p in b.parameters():
                p.add_(0.5)
    if dtype == "fp32":
        params = [p for b in blocks for p in b.parameters()]
        precision = Precision("fp32", params, optimizer="sgd", lr=0.1)
    else:
        Precision.cast_model(blocks, dtype)
        precision = Precision(dtype, [p for b in blocks for p in b.parameters()], optimizer="sgd", lr=0.1)
    state = checkpoint_state(dict(enumerate(blocks)), precision, zoo.block_names())
    info = {"model": zoo.model, "dtype": dtype, "blocks": {n: {"index": i} for i, n in enumerate(zoo.block_names())}}
    save_checkpoint(tmp_path / "ckpt", state, step=5, info=info)

    done = consolidate(tmp_path / "ckpt", tmp_path / "out")
    assert done.step == 5 and [p.name for p in done.files] == ["model.safetensors"]  # no config.json: not HF
    from safetensors.torch import load_file

    user = weights_models.build()
    user.load_state_dict(load_file(tmp_path / "out" / "model.safetensors"), strict=True)  # the user's own names
    mine, _, _ = consolidated_state(tmp_path / "ckpt")
    for i, block in enumerate(blocks):
        for key, value in block.state_dict().items():
            full = zoo.state_dict_keys(i)[key]
            # bf16: the fp32 master is written (what the optimizer steps), not the rounded weight
            want = precision.master_of(block.get_parameter(key)) if key in dict(block.named_parameters()) else value
            assert torch.equal(mine[full], want.detach().to(mine[full].dtype)), full
            assert torch.equal(user.state_dict()[full], mine[full]), full
    assert mine["out.weight"].dtype == torch.float32


def test_consolidate_of_a_folder_that_is_no_checkpoint_is_one_line(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["consolidate", str(tmp_path / "nothing"), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "\n" not in err and err.startswith("error: ")
