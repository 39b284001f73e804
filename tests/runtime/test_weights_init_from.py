"""``--init-from``: a rank builds only its blocks, on meta, and reads only their tensors from the file.

Sources: a ``save_pretrained`` folder (sharded safetensors with its index), a ``.safetensors`` file
and a ``torch.save`` state_dict. The end-to-end test is a user's own flow on the command line:
profile a factory, plan it, ``launch --init-from`` the user's ``state_dict()`` file, ``consolidate``,
and the result loads into the user's ``nn.Sequential`` equal to a plain PyTorch loop from the same
weights (1e-5).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from hetplan.cli import main
from hetplan.errors import HetplanError
from hetplan.models import resolve_model
from hetplan.runtime.data import open_samples
from hetplan.runtime.weights import init_from as init_module
from hetplan.runtime.weights.init_from import check_init_from, open_weights
from hetplan.runtime.weights.materialise import build_rank_blocks

FACTORY = """
from collections import OrderedDict

import torch
from torch import nn


def build(width=16):
    return nn.Sequential(OrderedDict(
        fc1=nn.Sequential(nn.Linear(8, width), nn.ReLU()),
        fc2=nn.Sequential(nn.Linear(width, width), nn.BatchNorm1d(width), nn.ReLU()),
        out=nn.Linear(width, 4),
    ))


def plain(width=16):  # no BatchNorm: a pipeline's micro-batches would see other statistics than one batch
    return nn.Sequential(nn.Sequential(nn.Linear(8, width), nn.Tanh()), nn.Linear(width, width), nn.Linear(width, 4))
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "init_models.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import init_models

    return init_models


def _user_weights(module, seed: int = 99) -> dict[str, torch.Tensor]:
    """The user's own trained weights: not what hetplan's seeded build would give."""
    torch.manual_seed(seed)
    model = module.build(width=16)
    with torch.no_grad():
        model.fc2[1].running_mean.normal_()
        model.fc2[1].num_batches_tracked.fill_(7)
    return model.state_dict()


def _reads(monkeypatch) -> list[str]:
    seen: list[str] = []
    original = init_module.WeightSource.read

    def spy(self, key):
        seen.append(key)
        return original(self, key)

    monkeypatch.setattr(init_module.WeightSource, "read", spy)
    return seen


@pytest.mark.parametrize("kind", ["pt", "safetensors"])
def test_a_rank_loads_only_its_blocks_from_a_state_dict_file(tmp_path, user_module, monkeypatch, kind: str) -> None:
    weights = _user_weights(user_module)
    path = tmp_path / f"w.{kind}"
    if kind == "pt":
        torch.save(weights, path)
    else:
        safetensors = pytest.importorskip("safetensors.torch", reason="needs safetensors")
        safetensors.save_file(weights, str(path))
    zoo = resolve_model({"factory": "init_models:build", "input_shape": [8]})
    seen = _reads(monkeypatch)
    (fc2,) = build_rank_blocks(zoo, 1, 2, seed=0, init_from=str(path))
    assert sorted(seen) == sorted(k for k in weights if k.startswith("fc2."))  # nothing of fc1 or out
    for key, value in fc2.state_dict().items():
        assert torch.equal(value, weights[f"fc2.{key}"]), key
    assert fc2.training


def test_a_sharded_save_pretrained_folder_gives_the_transformers_model(tmp_path, monkeypatch) -> None:
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    pytest.importorskip("safetensors", reason="needs safetensors")
    config = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "n_positions": 32}
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config)).eval()
    hf.save_pretrained(tmp_path / "gpt2", max_shard_size="20KB")
    assert (tmp_path / "gpt2" / "model.safetensors.index.json").is_file()
    zoo = resolve_model({"hf": "gpt2", "config": config, "seq": 16})
    seen = _reads(monkeypatch)
    head = build_rank_blocks(zoo, 4, 6, seed=0, init_from=str(tmp_path / "gpt2"))
    # layer 1's MLP, the final norm and the head (tied: read under the embedding's name), nothing else
    assert all(k.startswith(("transformer.h.1.ln_2", "transformer.h.1.mlp", "transformer.ln_f")) or
               k == "transformer.wte.weight" for k in seen), seen  # fmt: skip
    assert torch.equal(head[-1].lm_head.weight, hf.lm_head.weight)
    blocks = build_rank_blocks(zoo, 0, zoo.n_blocks, seed=0, init_from=str(tmp_path / "gpt2"))
    assert blocks[0].wte.weight is blocks[-1].lm_head.weight  # one parameter on a rank holding both
    ids = torch.randint(0, 64, (2, 16))
    h = ids
    for block in blocks:
        h = block.eval()(h)
    torch.testing.assert_close(h, hf(ids).logits, atol=1e-6, rtol=0)


def test_weights_that_do_not_fit_are_one_line(tmp_path, user_module) -> None:
    model = {"factory": "init_models:build", "input_shape": [8]}
    weights = _user_weights(user_module)
    cases = {
        "missing.pt": {k: v for k, v in weights.items() if k != "out.bias"},
        "shape.pt": {**weights, "out.weight": torch.zeros(5, 16)},
    }
    messages = {
        "missing.pt": "no tensor 'out.bias' (block 2, 'out')",
        "shape.pt": "tensor 'out.weight' has shape [5, 16]; block 2 weight needs [4, 16]",
    }
    for name, state in cases.items():
        torch.save(state, tmp_path / name)
        with pytest.raises(HetplanError) as info:
            check_init_from(model, tmp_path / name)
        assert messages[name] in str(info.value) and str(tmp_path / name) in str(info.value)
    (tmp_path / "empty").mkdir()
    (tmp_path / "code.pt").write_bytes(b"not a torch file")
    for path, message in [
        (tmp_path / "none", "no such file or folder"),
        (tmp_path / "empty", "expected model.safetensors or model.safetensors.index.json"),
        (tmp_path / "code.pt", "cannot load as a state_dict"),
    ]:
        with pytest.raises(HetplanError) as info:
            open_weights(path)
        assert message in str(info.value) and "\n" not in str(info.value)


def test_profile_plan_launch_init_from_consolidate_equals_plain_pytorch(
    tmp_path, user_module, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    torch.manual_seed(99)
    weights = user_module.plain().state_dict()
    torch.save(weights, "start.pt")
    clusters = Path(__file__).resolve().parents[2] / "profiles" / "clusters"
    steps, batch = 3, 8
    commands = [
        ["profile", "init_models:plain", "--input-shape", "8", "--micro-batches", "2", "--repeat", "1",
         "--warmup", "0", "-o", "mine.yaml"],
        ["plan", "mine.yaml", str(clusters / "local-2.yaml"), "--batch", str(batch), "-o", "plan.yaml"],
        ["launch", "plan.yaml", "--steps", str(steps), "--init-from", "start.pt", "--save", "ckpt",
         "--log", "run.jsonl", "--optimizer", "sgd", "--lr", "0.05"],
        ["consolidate", "ckpt", "-o", "out"],
    ]  # fmt: skip
    for args in commands:
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 0, (args[0], capsys.readouterr().err)
    records = [json.loads(line) for line in Path("run.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in sorted(records, key=lambda r: r["step"]) if r["rank"] == 0]

    # plain PyTorch: the user's model from the same weights, the same batches, SGD at launch's rate
    from safetensors.torch import load_file

    model = user_module.plain()
    model.load_state_dict(weights)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    zoo = resolve_model({"factory": "init_models:plain", "input_shape": [8]})
    samples = open_samples(zoo.model, zoo, global_batch=batch, seed=0)
    plain = []
    for step in range(steps):
        x, y = samples.step(step).rows(0, batch)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        plain.append(float(loss.detach()))
    assert losses == pytest.approx(plain, abs=1e-5)
    trained = user_module.plain()
    trained.load_state_dict(load_file("out/model.safetensors"), strict=True)
    for key, value in trained.state_dict().items():
        torch.testing.assert_close(value, model.state_dict()[key], atol=1e-5, rtol=0, msg=key)

    with pytest.raises(SystemExit) as info:  # a file that does not fit: one line, before any rank starts
        main(["launch", "plan.yaml", "--steps", "1", "--init-from", "mine.yaml"])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and "\n" not in err and "mine.yaml" in err and "--init-from" in err


def test_a_llama_save_pretrained_folder_gives_the_transformers_model(tmp_path) -> None:
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    pytest.importorskip("safetensors", reason="needs safetensors")
    config = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 32}  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()  # an untied head
    hf.save_pretrained(tmp_path / "llama")
    zoo = resolve_model({"hf": "llama", "config": config, "seq": 16})
    blocks = build_rank_blocks(zoo, 0, zoo.n_blocks, seed=0, init_from=str(tmp_path / "llama"))
    ids = torch.randint(0, 64, (2, 16))
    h = ids
    for block in blocks:
        h = block.eval()(h)
    torch.testing.assert_close(h, hf(ids).logits, atol=1e-6, rtol=0)
