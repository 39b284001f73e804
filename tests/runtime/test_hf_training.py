"""Hugging Face models trained by the runtime equal a plain single-process transformers loop.

(BERT, 2 x 2, too: its masked-LM loss with every position labelled, the text's ids as labels.)

GPT-2 (its LM head tied to the token embedding) and Llama, built from tiny configs, train on a
character-level token dataset read from a text file, as a 2-stage pipeline and as 2 pipelines x 2
stages (gloo, one process per device). The reference is the transformers model itself
(``AutoModelForCausalLM.from_config``, its own loss with ``labels``, ``torch.optim.Adam``), started
from the blocks' initial weights through ``state_dict_keys``: the losses and every final weight agree
within 1e-5 (fp32). A tied head's gradient must be summed over the stages holding it, or the
weights drift apart from the reference.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import torch
from builders import make_cluster

from hetplan.contracts.model_profile import Block, ModelProfile, Timing
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.models import resolve_model
from hetplan.runtime.checkpoint import read_block
from hetplan.runtime.dataset import UserDataset
from hetplan.runtime.launcher import launch_local

transformers = pytest.importorskip(
    "transformers", reason="the Hugging Face tests need transformers (pip install '.[hf]')"
)

SEED = 3
STEPS = 3
GPT2 = {
    "hf": "gpt2",
    "config": {"n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": 128, "n_positions": 16,
               "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
    "seq": 8,
}  # fmt: skip
LLAMA = {
    "hf": "llama",
    "config": {"num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 2,
               "intermediate_size": 32, "vocab_size": 128, "max_position_embeddings": 16},
    "seq": 8,
}  # fmt: skip
BERT = {
    "hf": "bert",
    "config": {"num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32,
               "vocab_size": 128, "max_position_embeddings": 16, "hidden_dropout_prob": 0.0,
               "attention_probs_dropout_prob": 0.0},
    "seq": 8,
}  # fmt: skip

#: A user's token dataset: a text file's bytes as ids, cut in windows of ``seq``; labels = the ids.
TEXT_MODULE = """
import torch
from torch.utils.data import Dataset


class CharWindows(Dataset):
    def __init__(self, path, seq=8):
        data = open(path, "rb").read()
        self.ids = torch.tensor(list(data), dtype=torch.long)
        self.seq = seq

    def __len__(self):
        return len(self.ids) // self.seq

    def __getitem__(self, i):
        window = self.ids[i * self.seq : (i + 1) * self.seq]
        return window, window.clone()


def build(path, seq=8):
    return CharWindows(path, seq)
"""

TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light."
)


@pytest.fixture
def text_data(tmp_path, monkeypatch) -> tuple[str, dict]:
    """A uniquely named dataset module and a text file; importable here and by the ranks."""
    name = f"hf_text_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(TEXT_MODULE)
    (tmp_path / "book.txt").write_text(TEXT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    return f"{name}:build", {"path": str(tmp_path / "book.txt"), "seq": 8}


def _stage(start: int, end: int, device: str) -> Stage:
    return Stage(start, end, (device,), (1.0,))


def _launch(folder: Path, model: dict, pipelines: list[Pipeline], devices: int, dataset: tuple[str, dict]):
    zoo = resolve_model(model)
    timing = {"cpu": {1: Timing(1.0, 1.0)}}
    profile = ModelProfile(
        model=zoo.model,
        dtype="fp32",
        blocks=[Block(n, "zoo", 0, 0.0, 0.0, 0.0, 0.0, timing) for n in zoo.block_names()],
    )
    plan = Plan(global_batch=sum(p.batch for p in pipelines), pipelines=pipelines, optimizer="adam")
    cluster = make_cluster([("n0", [("cpu", devices)])])
    config = build_rank_config(
        plan, profile, cluster, seed=SEED, backend="gloo", timeout_s=60, dataset=dataset[0], dataset_kwargs=dataset[1]
    )
    write_yaml(config, folder / "rank-config.yaml")
    result = launch_local(folder / "rank-config.yaml", steps=STEPS, save=folder / "ckpt")
    return result, config, zoo


def _plain_loop(zoo, dataset: tuple[str, dict], global_batch: int, lr: float):
    """transformers' own model and loss, torch's Adam, the same batches: (losses, state dict)."""
    auto = transformers.AutoModelForMaskedLM if zoo.model["hf"] == "bert" else transformers.AutoModelForCausalLM
    model = auto.from_config(zoo.hf_config())
    start = {}
    for i, block in enumerate(zoo.build_blocks(0, zoo.n_blocks, SEED)):
        keys = zoo.state_dict_keys(i)
        start.update({keys[k]: v for k, v in block.state_dict().items()})
    missing, unexpected = model.load_state_dict(start, strict=False)
    tied = {"lm_head.weight", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    assert not unexpected and set(missing) <= tied  # GPT-2's and BERT's heads: the tied embedding (and bias)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
    data = UserDataset(dataset[0], dataset[1], zoo=zoo, global_batch=global_batch, seed=SEED)
    losses = []
    for step in range(STEPS):
        ids, labels = data.read(step, 0, global_batch)
        optimizer.zero_grad()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, model.state_dict()


TWO_STAGES = ([Pipeline(4, (2, 2), (_stage(0, 3, "n0/0"), _stage(3, 6, "n0/1")))], 2)
TWO_BY_TWO = (
    [
        Pipeline(3, (1, 2), (_stage(0, 2, "n0/0"), _stage(2, 6, "n0/1"))),
        Pipeline(3, (3,), (_stage(0, 4, "n0/2"), _stage(4, 6, "n0/3"))),
    ],
    4,
)


@pytest.mark.parametrize(
    ("model", "layout"),
    [(GPT2, TWO_STAGES), (GPT2, TWO_BY_TWO), (LLAMA, TWO_STAGES), (LLAMA, TWO_BY_TWO), (BERT, TWO_BY_TWO)],
    ids=["gpt2-2stages", "gpt2-2x2", "llama-2stages", "llama-2x2", "bert-2x2"],
)
def test_an_hf_model_trains_as_its_own_single_process_loop(tmp_path, text_data, model: dict, layout) -> None:
    pipelines, devices = layout
    result, config, zoo = _launch(tmp_path, model, pipelines, devices, text_data)
    losses, final = _plain_loop(zoo, text_data, config["training"]["global_batch"], config["training"]["lr"])
    assert [r["loss"] for r in result.records if r["rank"] == 0] == pytest.approx(losses, abs=1e-5)
    assert losses[-1] < losses[0]  # it learns
    for i in range(zoo.n_blocks):
        saved = read_block(tmp_path / "ckpt", i).params
        for key, name in zoo.state_dict_keys(i).items():
            torch.testing.assert_close(saved[key], final[name], atol=1e-5, rtol=0, msg=f"block {i} {key}")


def test_llama_at_tensor_parallel_2_equals_tensor_parallel_1(tmp_path, text_data) -> None:
    """Llama's own base_model_tp_plan (q, k, v, gate, up column-parallel; o, down row-parallel, run
    through parallelize_module) on both stages of a pipeline, against the same pipeline at degree 1:
    losses and the checkpoint's (joined) weights within 1e-5; and the TP 2 checkpoint consolidated
    is a folder from_pretrained loads, equal to transformers' own single-process loop."""
    from hetplan.runtime.weights.consolidate import consolidate

    def tp_stage(start: int, end: int, *devices: str) -> Stage:
        return Stage(start, end, devices, (1.0,), tensor_parallel=len(devices))

    (tmp_path / "tp1").mkdir()
    (tmp_path / "tp2").mkdir()
    one, _, zoo = _launch(tmp_path / "tp1", LLAMA, TWO_STAGES[0], 2, text_data)
    two_stages = [Pipeline(4, (2, 2), (tp_stage(0, 3, "n0/0", "n0/1"), tp_stage(3, 6, "n0/2", "n0/3")))]
    two, config, _ = _launch(tmp_path / "tp2", LLAMA, two_stages, 4, text_data)
    losses = [r["loss"] for r in one.records if r["rank"] == 0]
    assert [r["loss"] for r in two.records if r["rank"] == 0] == pytest.approx(losses, abs=1e-5)
    plain_losses, final = _plain_loop(zoo, text_data, config["training"]["global_batch"], config["training"]["lr"])
    assert losses == pytest.approx(plain_losses, abs=1e-5)
    consolidate(tmp_path / "tp2" / "ckpt", tmp_path / "out")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    assert set(loaded) == set(final)
    for key, value in final.items():
        torch.testing.assert_close(loaded[key], value, atol=1e-5, rtol=0, msg=key)
    for i in range(zoo.n_blocks):
        a, b = read_block(tmp_path / "tp1" / "ckpt", i).params, read_block(tmp_path / "tp2" / "ckpt", i).params
        assert set(a) == set(b)
        for key in a:
            torch.testing.assert_close(b[key], a[key], atol=1e-5, rtol=0, msg=f"block {i} {key}")


def test_tensor_parallel_without_a_plan_is_one_line(tmp_path, text_data) -> None:
    from hetplan.errors import HetplanError

    stages = [Pipeline(4, (4,), (Stage(0, 6, ("n0/0", "n0/1"), (1.0,), tensor_parallel=2),))]
    with pytest.raises(HetplanError) as info:
        _launch(tmp_path, GPT2, stages, 2, text_data)
    assert "gpt2 declares no tensor-parallel plan" in str(info.value) and "\n" not in str(info.value)
