"""Hugging Face ``transformers`` language models (GPT-2, Llama, BERT) as zoo models, in blocks.

    zoo = resolve_model({"hf": "gpt2", "config": {"n_layer": 2, "n_embd": 64, "n_head": 4}, "seq": 32})
    zoo = resolve_model({"hf": "path/to/config.json", "seq": 128})     # or a save_pretrained directory
    zoo.block_names()          # ['embedding', 'layer0.attn', 'layer0.mlp', ..., 'head']
    zoo.state_dict_keys(1)     # {'ln_1.weight': 'transformer.h.0.ln_1.weight', ...}

Each block is made from the config with the library's own layer classes (``GPT2Attention``,
``LlamaAttention``, ``LlamaMLP``, ...), one at a time, never the whole model: an embedding block, an
attention and an MLP sub-block per decoder layer (each with its norm and residual, as the zoo's GPT
splits), and a head (final norm + LM head). Attention runs through the library's SDPA interface with
no mask, which is causal; padding masks are not carried between blocks (one tensor per boundary).
So a rank can build its blocks alone, also under ``with torch.device("meta")``: rotary tables are
computed in the forward, not kept in buffers that a meta build would leave empty.

Recognised layouts: ``gpt2``, ``llama`` (causal LMs) and ``bert`` (a masked LM: embeddings, per layer
``BertAttention`` and ``BertIntermediate`` + ``BertOutput``, the MLM head; bidirectional attention, a
single segment); any other ``model_type`` is refused with one line.
Parameters are drawn as the libraries' ``_init_weights`` draw them (normal with the config's
``initializer_range`` for linear, Conv1D and embedding weights, zero biases, unit norms), seeded per
block. A tied LM head (``tie_word_embeddings``, GPT-2's default) is one parameter with the embedding
(:meth:`HfModel.tied_parameters`), and its state-dict key is the embedding's.

The loss is the library's for a causal LM: the target is the labels (``labels = input_ids``, ``-100``
ignored), shifted inside the loss, cross-entropy per token; hetplan's SUM convention takes each
sample's mean over its counted tokens, which equals ``transformers``' mean over the batch's tokens
when every sample counts the same number (fixed length, no ``-100``). BERT's masked-LM loss is the
same cross-entropy at the labelled (masked) positions, without the shift; its synthetic task masks
the same number of positions in every sample.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from hetplan.errors import HetplanError
from hetplan.models.base import ZooModel, _check_batch_size, derive_seed

__all__ = ["IGNORE_INDEX", "LAYOUTS", "HfModel"]

#: Labels with this value are not counted by the loss (the libraries' convention).
IGNORE_INDEX = -100
#: The ``model_type`` values whose module layout hetplan knows how to split.
LAYOUTS = ("gpt2", "llama", "bert")
#: The synthetic task's tokens follow a random chain: each token has this many possible successors.
_SUCCESSORS = 4
_FIELD = "model.hf"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' config warnings (token ids outside a tiny vocabulary) off while loading."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise HetplanError("a Hugging Face model needs transformers: pip install 'hetplan[hf]'", field=_FIELD) from None
    return transformers


def load_config(source: str, overrides: Mapping[str, Any] | None) -> Any:
    """A transformers config from a ``model_type`` name, a ``config.json`` or a directory holding one,
    with ``overrides`` applied; SDPA attention set (causal without a mask)."""
    transformers = _transformers()
    overrides = dict(overrides or {})
    path = Path(source)
    try:
        with _quiet():
            if path.is_dir() or path.suffix == ".json":
                file = path / "config.json" if path.is_dir() else path
                try:
                    data = json.loads(file.read_text())
                except (OSError, ValueError) as exc:
                    raise HetplanError(f"cannot read {file} as a config.json ({exc})", field=_FIELD) from None
                if not isinstance(data, dict) or "model_type" not in data:
                    raise HetplanError(f"{file} has no model_type; is it a transformers config.json?", field=_FIELD)
                kind = data.pop("model_type")
                config = transformers.AutoConfig.for_model(kind, **{**data, **overrides})
            else:
                config = transformers.AutoConfig.for_model(source, **overrides)
    except HetplanError:
        raise
    except Exception as exc:  # transformers refuses the type or a setting
        text = str(exc).strip().splitlines()
        raise HetplanError(f"cannot make a {source!r} config ({text[0] if text else type(exc).__name__})",
                           field=_FIELD) from None  # fmt: skip
    if config.model_type not in LAYOUTS:
        raise HetplanError(
            f"hetplan cannot split a {config.model_type!r} model into blocks (it knows: {', '.join(LAYOUTS)}); "
            "write a factory returning its blocks (docs/train-your-own-model.md)",
            field=_FIELD,
        )
    config._attn_implementation = "sdpa"
    return config


def _init_like_hf(module: nn.Module, std: float) -> None:
    """The libraries' ``_init_weights`` for these layers: weights ~ N(0, std), biases 0 (norms keep
    their constructor's ones and zeros)."""
    from transformers.pytorch_utils import Conv1D

    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.Linear, nn.Embedding, Conv1D)):
                m.weight.normal_(0.0, std)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()


def _positions(x: torch.Tensor) -> torch.Tensor:
    return torch.arange(x.shape[1], device=x.device).unsqueeze(0)


# -- GPT-2 --------------------------------------------------------------------------------------------
class Gpt2Embedding(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.wte(ids) + self.wpe(_positions(ids)))


class Gpt2AttentionBlock(nn.Module):
    def __init__(self, config: Any, layer: int) -> None:
        from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = GPT2Attention(config, layer_idx=layer)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.attn(self.ln_1(h))[0]


class Gpt2MlpBlock(nn.Module):
    def __init__(self, config: Any) -> None:
        from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

        super().__init__()
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = GPT2MLP(config.n_inner or 4 * config.n_embd, config)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mlp(self.ln_2(h))


class Gpt2Head(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(h))


# -- Llama --------------------------------------------------------------------------------------------
class LlamaEmbedding(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)


class LlamaAttentionBlock(nn.Module):
    """``input_layernorm`` + ``self_attn`` + residual; the rotary cos/sin computed per forward (cached
    per device, dtype and length, outside the state dict, so a meta build has nothing to fill in)."""

    def __init__(self, config: Any, layer: int) -> None:
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRMSNorm

        super().__init__()
        self.config = config
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_idx=layer)
        self._rope: dict[tuple[str, torch.dtype, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def rope(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        key = (str(x.device), x.dtype, x.shape[1])
        if key not in self._rope:
            with torch.device("cpu"):
                rotary = LlamaRotaryEmbedding(self.config)
            cos, sin = rotary(x.detach().to("cpu"), _positions(x).to("cpu"))
            self._rope[key] = (cos.to(x.device), sin.to(x.device))
        return self._rope[key]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out, _ = self.self_attn(self.input_layernorm(h), position_embeddings=self.rope(h), attention_mask=None)
        return h + out


class LlamaMlpBlock(nn.Module):
    def __init__(self, config: Any) -> None:
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        super().__init__()
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaHead(nn.Module):
    def __init__(self, config: Any) -> None:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        super().__init__()
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))


# -- BERT (masked LM) ------------------------------------------------------------------------------
class BertEmbeddingBlock(nn.Module):
    def __init__(self, config: Any) -> None:
        from transformers.models.bert.modeling_bert import BertEmbeddings

        super().__init__()
        self.embeddings = BertEmbeddings(config)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        types = torch.zeros_like(ids)  # one segment (the buffer a meta build leaves empty is not used)
        return self.embeddings(input_ids=ids, token_type_ids=types, position_ids=_positions(ids))


class BertAttentionBlock(nn.Module):
    """``BertAttention``: self-attention (bidirectional: no mask, not causal), output dense, residual, norm."""

    def __init__(self, config: Any, layer: int) -> None:
        from transformers.models.bert.modeling_bert import BertAttention

        super().__init__()
        self.attention = BertAttention(config, is_causal=False, layer_idx=layer)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.attention(h)[0]


class BertMlpBlock(nn.Module):
    def __init__(self, config: Any) -> None:
        from transformers.models.bert.modeling_bert import BertIntermediate, BertOutput

        super().__init__()
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.output(self.intermediate(h), h)


class BertHead(nn.Module):
    def __init__(self, config: Any) -> None:
        from transformers.models.bert.modeling_bert import BertOnlyMLMHead

        super().__init__()
        self.cls = BertOnlyMLMHead(config)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.cls(h)


#: Per layout: the base model's prefix in the full state dict, the layer count's config key, the block
#: classes, and each block's child modules -> their path in the full model ({i}: the layer).
_LAYOUT: dict[str, dict[str, Any]] = {
    "gpt2": {
        "base": "transformer.",
        "layers": "n_layer",
        "positions": "n_positions",
        "blocks": (Gpt2Embedding, Gpt2AttentionBlock, Gpt2MlpBlock, Gpt2Head),
        "paths": (
            {"wte": "transformer.wte", "wpe": "transformer.wpe"},
            {"ln_1": "transformer.h.{i}.ln_1", "attn": "transformer.h.{i}.attn"},
            {"ln_2": "transformer.h.{i}.ln_2", "mlp": "transformer.h.{i}.mlp"},
            {"ln_f": "transformer.ln_f", "lm_head": "lm_head"},
        ),
        "embedding": "wte.weight",
    },
    "llama": {
        "base": "model.",
        "layers": "num_hidden_layers",
        "positions": "max_position_embeddings",
        "blocks": (LlamaEmbedding, LlamaAttentionBlock, LlamaMlpBlock, LlamaHead),
        "paths": (
            {"embed_tokens": "model.embed_tokens"},
            {"input_layernorm": "model.layers.{i}.input_layernorm", "self_attn": "model.layers.{i}.self_attn"},
            {"post_attention_layernorm": "model.layers.{i}.post_attention_layernorm", "mlp": "model.layers.{i}.mlp"},
            {"norm": "model.norm", "lm_head": "lm_head"},
        ),
        "embedding": "embed_tokens.weight",
    },
    "bert": {
        "base": "bert.",
        "layers": "num_hidden_layers",
        "positions": "max_position_embeddings",
        "blocks": (BertEmbeddingBlock, BertAttentionBlock, BertMlpBlock, BertHead),
        "paths": (
            {"embeddings": "bert.embeddings"},
            {"attention": "bert.encoder.layer.{i}.attention"},
            {"intermediate": "bert.encoder.layer.{i}.intermediate", "output": "bert.encoder.layer.{i}.output"},
            {"cls": "cls"},
        ),
        "embedding": "embeddings.word_embeddings.weight",
        "head": "cls.predictions.decoder.weight",
        "masked": True,
    },
}


class HfModel(ZooModel):
    """A ``transformers`` causal LM as blocks; see the module docstring.

    Args:
        source: a ``model_type`` (``"gpt2"``, ``"llama"``), a ``config.json`` or a directory with one.
        config: config settings over the source's (``{"n_layer": 2}``).
        seq: tokens per sample (default: 128, or the model's longest position if shorter).
    """

    def __init__(self, source: str, config: Mapping[str, Any] | None, seq: Any = None) -> None:
        if not isinstance(source, str) or not source:
            raise HetplanError(f"expected a model type or a config.json path, got {source!r}", field=_FIELD)
        if config is not None and not isinstance(config, Mapping):
            raise HetplanError(f"expected a mapping of config settings, got {config!r}", field="model.config")
        self.hf = load_config(source, config)
        self.layout = _LAYOUT[self.hf.model_type]
        self.layers = int(getattr(self.hf, self.layout["layers"]))
        longest = int(getattr(self.hf, self.layout["positions"]))
        if seq is None:
            seq = min(128, longest)
        if isinstance(seq, bool) or not isinstance(seq, int) or not 2 <= seq <= longest:
            raise HetplanError(f"expected a sequence length in [2, {longest}], got {seq!r}", field="model.seq")
        self.seq = seq
        self.vocab = int(self.hf.vocab_size)
        self.masked = bool(self.layout.get("masked", False))  # BERT: masked-LM loss, no shift
        settings = {k: v for k, v in self.hf.to_diff_dict().items() if k not in ("transformers_version", "model_type")}
        self._tables: dict[int, np.ndarray] = {}
        super().__init__({"hf": self.hf.model_type, "config": settings, "seq": seq})

    # -- blocks -------------------------------------------------------------------------------------
    def block_names(self) -> list[str]:
        names = ["embedding"]
        for i in range(self.layers):
            names += [f"layer{i}.attn", f"layer{i}.mlp"]
        return [*names, "head"]

    def block_kinds(self) -> list[str]:
        return ["embedding"] + ["attention", "mlp"] * self.layers + ["head"]

    def _role(self, index: int) -> tuple[int, int]:
        """(which of embedding, attention, MLP, head; the decoder layer or -1)."""
        if index == 0:
            return 0, -1
        if index == self.n_blocks - 1:
            return 3, -1
        return (1 if index % 2 == 1 else 2), (index - 1) // 2

    def _new_block(self, index: int) -> nn.Module:
        role, layer = self._role(index)
        cls = self.layout["blocks"][role]
        block = cls(self.hf, layer) if role == 1 else cls(self.hf)
        _init_like_hf(block, float(self.hf.initializer_range))
        return block

    def tied_parameters(self) -> list[tuple[tuple[int, str], ...]]:
        """The LM head tied to the token embedding, when the config ties them."""
        last = self.n_blocks - 1
        groups = []
        if getattr(self.hf, "tie_word_embeddings", False):
            groups.append(((0, self.layout["embedding"]), (last, self.layout.get("head", "lm_head.weight"))))
        if self.masked:  # BERT's decoder bias is the prediction head's bias (one block)
            groups.append(((last, "cls.predictions.bias"), (last, "cls.predictions.decoder.bias")))
        return groups

    def _paths(self, index: int) -> dict[str, str]:
        role, layer = self._role(index)
        return {k: v.format(i=layer) for k, v in self.layout["paths"][role].items()}

    def state_dict_keys(self, index: int) -> dict[str, str]:
        """Block ``index``'s state-dict keys -> the ``transformers`` model's (``from_pretrained`` names);
        a tied head's weight -> the embedding's key."""
        self._check_index(index)
        with torch.device("meta"):
            keys = list(self.layout["blocks"][self._role(index)[0]](
                *((self.hf, 0) if self._role(index)[0] == 1 else (self.hf,))
            ).state_dict())  # fmt: skip
        paths = self._paths(index)
        out = {}
        for key in keys:
            child, _, rest = key.partition(".")
            out[key] = f"{paths[child]}.{rest}"
        return self._canonical_keys(index, out)

    def hf_config(self) -> Any:
        return self.hf

    def tp_plan(self, index: int) -> dict[str, str] | None:
        """Block ``index``'s part of the config's own ``base_model_tp_plan`` (paths in the block)."""
        plan = getattr(self.hf, "base_model_tp_plan", None)
        if not plan:
            return None
        base = self.layout["base"]
        out: dict[str, str] = {}
        with torch.device("meta"):
            block = self._new_block(index)
        paths = self._paths(index)
        for name, _ in block.named_modules():
            if not name:
                continue
            child, _, rest = name.partition(".")
            full = paths[child] + (f".{rest}" if rest else "")
            if not full.startswith(base):
                continue
            for pattern, style in plan.items():
                if fnmatch.fnmatchcase(full[len(base) :], pattern):
                    out[name] = style
        return out

    # -- the task: token chains, labels = the inputs ---------------------------------------------------
    def teacher(self, seed: int) -> np.ndarray:
        if seed not in self._tables:
            rng = np.random.default_rng(derive_seed("hf-teacher", seed))
            self._tables[seed] = rng.integers(0, self.vocab, size=(self.vocab, _SUCCESSORS))
        return self._tables[seed]

    def sample_batch(self, batch_size: int, *, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids walking a fixed random chain; the target is the same ids (the loss shifts)."""
        _check_batch_size(batch_size)
        table = self.teacher(seed)
        tokens = np.empty((batch_size, self.seq), dtype=np.int64)
        for i in range(batch_size):
            rng = np.random.default_rng(derive_seed("sample", seed, step, i))
            tokens[i, 0] = rng.integers(self.vocab)
            picks = rng.integers(_SUCCESSORS, size=self.seq - 1)
            for j in range(self.seq - 1):
                tokens[i, j + 1] = table[tokens[i, j], picks[j]]
        ids = torch.from_numpy(tokens)
        if not self.masked:
            return ids, ids.clone()
        # BERT: the same number of positions masked in every sample (15 %, at least one), each
        # replaced by the last id of the vocabulary; labels only there, -100 elsewhere
        n = max(1, round(0.15 * self.seq))
        labels = torch.full_like(ids, IGNORE_INDEX)
        masked = ids.clone()
        for i in range(batch_size):
            g = torch.Generator().manual_seed(derive_seed("mask", seed, step, i))
            where = torch.randperm(self.seq, generator=g)[:n]
            labels[i, where] = ids[i, where]
            masked[i, where] = self.vocab - 1
        return masked, labels

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Shifted next-token cross-entropy (BERT: at the masked positions, not shifted), each
        sample's mean over its counted tokens, summed over samples."""
        logits = output.float() if self.masked else output[:, :-1].float()
        labels = targets if self.masked else targets[:, 1:]
        per_token = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
        ).reshape(labels.shape)
        counted = (labels != IGNORE_INDEX).sum(dim=1).clamp(min=1)
        return (per_token.sum(dim=1) / counted).sum()

    def input_dtype(self) -> torch.dtype:
        return torch.long

    def sample_shape(self) -> tuple[int, ...]:
        return (self.seq,)

    def id_bounds(self) -> tuple[int, int, int]:
        """(input ids below, target ids below, the target value that is ignored)."""
        return self.vocab, self.vocab, IGNORE_INDEX
