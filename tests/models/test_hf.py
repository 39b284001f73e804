"""Hugging Face models as blocks: the same function as the transformers model, its keys, its ties,
its TP plan, built without the whole model (also on the meta device), and one-line refusals."""

from __future__ import annotations

import json

import pytest
import torch

from hetplan.errors import HetplanError
from hetplan.models import resolve_model

transformers = pytest.importorskip("transformers", reason="Hugging Face models need transformers (pip install '.[hf]')")

GPT2 = {"hf": "gpt2", "config": {"n_layer": 2, "n_embd": 16, "n_head": 2, "vocab_size": 50, "n_positions": 16,
                                 "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}, "seq": 8}  # fmt: skip
LLAMA = {
    "hf": "llama",
    "config": {"num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 2,
               "intermediate_size": 32, "vocab_size": 50},
    "seq": 8,
}  # fmt: skip

BERT = {
    "hf": "bert",
    "config": {"num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32,
               "vocab_size": 50, "max_position_embeddings": 32, "hidden_dropout_prob": 0.0,
               "attention_probs_dropout_prob": 0.0},
    "seq": 8,
}  # fmt: skip


@pytest.mark.parametrize("model", [GPT2, LLAMA, BERT], ids=["gpt2", "llama", "bert"])
def test_the_blocks_are_the_transformers_model_with_its_keys_and_loss(model: dict) -> None:
    zoo = resolve_model(model)
    assert zoo.block_names() == ["embedding", "layer0.attn", "layer0.mlp", "layer1.attn", "layer1.mlp", "head"]
    blocks = zoo.build_blocks(0, zoo.n_blocks, seed=0)
    masked = model is BERT
    auto = transformers.AutoModelForMaskedLM if masked else transformers.AutoModelForCausalLM
    full = auto.from_config(zoo.hf_config()).train()
    weights = {zoo.state_dict_keys(i)[k]: v for i, b in enumerate(blocks) for k, v in b.state_dict().items()}
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"} if masked else {"lm_head.weight"}
    assert set(weights) | tied == set(full.state_dict())  # every key; a tied one under its canonical name
    full.load_state_dict(weights, strict=False)
    x, y = zoo.sample_batch(3, seed=0, step=0)
    assert x.dtype == torch.long
    if masked:  # one position of 8 masked per sample, labelled; -100 elsewhere
        assert ((y != -100).sum(dim=1) == 1).all() and (x[y != -100] == 49).all()
    else:
        assert torch.equal(x, y)  # labels = the ids; the loss shifts
    h = x
    for b in blocks:
        h = b(h)
    out = full(input_ids=x, labels=y)
    torch.testing.assert_close(h, out.logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(zoo.loss(h, y) / 3, out.loss, atol=1e-6, rtol=0)


def test_gpt2_ties_its_head_to_the_embedding() -> None:
    zoo = resolve_model(GPT2)
    assert zoo.tied_parameters() == [((0, "wte.weight"), (5, "lm_head.weight"))]
    blocks = zoo.build_blocks(0, 6, seed=0)
    assert blocks[5].lm_head.weight is blocks[0].wte.weight
    assert torch.equal(zoo.build_block(5, seed=0).lm_head.weight, blocks[0].wte.weight)  # a rank with the head alone
    assert zoo.state_dict_keys(5)["lm_head.weight"] == "transformer.wte.weight"
    assert resolve_model(LLAMA).tied_parameters() == []  # Llama's default: untied


def test_blocks_build_on_the_meta_device_without_memory() -> None:
    zoo = resolve_model(LLAMA)
    with torch.device("meta"):
        blocks = zoo.build_blocks(0, zoo.n_blocks, seed=0)
    assert all(p.is_meta for b in blocks for p in b.parameters())
    real = zoo.build_block(1, seed=0).to_empty(device="cpu")  # materialised, then the rotary table is computed
    assert real(torch.zeros(1, 8, 16)).shape == (1, 8, 16)


def test_llama_declares_its_tp_plan_per_block() -> None:
    zoo = resolve_model(LLAMA)
    assert zoo.tp_plan(1) == {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise",
                              "self_attn.v_proj": "colwise", "self_attn.o_proj": "rowwise"}  # fmt: skip
    assert zoo.tp_plan(2) == {"mlp.gate_proj": "colwise", "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise"}
    assert zoo.tp_plan(0) == {} and resolve_model(GPT2).tp_plan(1) is None


def test_a_config_json_gives_the_same_model(tmp_path) -> None:
    zoo = resolve_model(LLAMA)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **LLAMA["config"]}))
    for source in (str(tmp_path), str(tmp_path / "config.json")):
        again = resolve_model({"hf": source, "seq": 8})
        assert again.model == zoo.model  # normalised: the type and the whole config, no path
        assert torch.equal(
            again.build_block(2, seed=4).mlp.up_proj.weight, zoo.build_block(2, seed=4).mlp.up_proj.weight
        )


@pytest.mark.parametrize(
    ("model", "field", "message"),
    [
        ({"hf": "t5"}, "model.hf", "cannot split a 't5' model into blocks"),
        ({"hf": "no-such-type"}, "model.hf", "cannot make a 'no-such-type' config"),
        ({"hf": "/nowhere/config.json"}, "model.hf", "cannot read /nowhere/config.json"),
        ({**LLAMA, "seq": 1}, "model.seq", "expected a sequence length in [2, 2048]"),
        ({**LLAMA, "layers": 2}, "model.layers", "unknown field"),
    ],
)
def test_a_model_hetplan_cannot_take_is_one_line(model: dict, field: str, message: str) -> None:
    with pytest.raises(HetplanError) as info:
        resolve_model(model)
    assert info.value.field == field and message in str(info.value) and "\n" not in str(info.value)


def test_the_command_line_names_an_hf_model_with_its_kwargs_and_seq() -> None:
    from hetplan.profile.request import model_section

    section = model_section("hf:llama", {"seq": 8}, factory_kwargs=dict(LLAMA["config"]), input_shape=None)
    assert resolve_model(section).model == resolve_model(LLAMA).model
    with pytest.raises(HetplanError) as info:
        model_section("hf:llama", {"layers": 2}, factory_kwargs={}, input_shape=None)
    assert info.value.field == "--layers" and "give its config in --kwargs" in str(info.value)
