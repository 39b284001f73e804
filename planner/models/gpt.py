"""GPT (decoder-only, pre-LN, GPT-2 layout, LM head untied or, with ``head: tied``, tied) as torch blocks.

    zoo = GptModel({"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 97})
    zoo.block_names()            # ['embedding', 'layer0.attn', 'layer0.mlp', ..., 'head']
    ids, next_ids = zoo.sample_batch(4, seed=0, step=0)     # long [4, 16] each

Blocks as :mod:`hetplan.profile.analytic.gpt` lists them: ``embedding`` (token + position
lookups, summed), ``layerN.attn`` (LayerNorm, QKV, causal softmax attention written out as two
matmuls, output projection, residual add), ``layerN.mlp`` (LayerNorm, Linear h->4h, GELU, Linear
4h->h, residual add), ``head`` (final LayerNorm, Linear h->vocab without bias) returning logits
``[B, seq, vocab]``. No dropout: a pipeline must reproduce a single-process run bit for bit, and
dropout masks would depend on which rank drew them. Attention is written out (not
``scaled_dot_product_attention``) so that its FLOPs are counted the same on every backend and
match the analytic 4·s²·h; with the setting ``attention: fused`` the core is
``scaled_dot_product_attention`` instead (FlashAttention-style: no s² tensor kept for backward).
Initialisation as GPT-2: N(0, 0.02), residual projections scaled by 1/sqrt(2·layers), zero biases.

The synthetic task: token sequences drawn from a fixed random "teacher" Markov chain over the
vocabulary (each token has :data:`SUCCESSORS` possible next tokens, fixed by the seed), targets the
next tokens. The loss can fall from log(vocab) towards log(SUCCESSORS).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.utils.checkpoint import checkpoint

from hetplan.errors import HetplanError
from hetplan.models.base import ZooModel, _check_batch_size, derive_seed, uninitialised

__all__ = ["SUCCESSORS", "Attention", "Embedding", "GptModel", "Head", "Mlp", "attention_core"]

#: Possible next tokens of each token in the teacher chain.
SUCCESSORS = 4
INIT_STD = 0.02


def _init_linear(layer: nn.Linear, std: float) -> None:
    """GPT-2 initialisation of a layer made with ``uninitialised`` (so the weights are drawn once)."""
    nn.init.normal_(layer.weight, std=std)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


class Embedding(nn.Module):
    """Token + position embeddings: long ``[B, t]`` -> ``[B, t, hidden]``."""

    def __init__(self, vocab: int, seq: int, hidden: int) -> None:
        super().__init__()
        self.tokens = uninitialised(nn.Embedding, vocab, hidden)
        self.positions = uninitialised(nn.Embedding, seq, hidden)
        nn.init.normal_(self.tokens.weight, std=INIT_STD)
        nn.init.normal_(self.positions.weight, std=INIT_STD)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.tokens(ids) + self.positions(positions)


class Attention(nn.Module):
    """Pre-LN causal self-attention with its residual add; ``fused``: the core is
    ``scaled_dot_product_attention`` (no s² tensor kept), else written out."""

    def __init__(self, hidden: int, heads: int, seq: int, layers: int, *, fused: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.fused = fused
        self.norm = nn.LayerNorm(hidden)
        self.qkv = uninitialised(nn.Linear, hidden, 3 * hidden)
        self.proj = uninitialised(nn.Linear, hidden, hidden)
        _init_linear(self.qkv, INIT_STD)
        _init_linear(self.proj, INIT_STD / math.sqrt(2 * layers))
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1), persistent=False)

        #: selective recomputation: keep only q, k, v and recompute the core in backward
        self.recompute_core = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        if self.recompute_core or self.fused:
            q, k, v = self.qkv(self.norm(x)).split(h, dim=-1)
            y = attention_core(q, k, v, self.heads, self.mask[:t, :t], recompute=self.recompute_core, fused=self.fused)
            return x + self.proj(y)
        # written inline (not through attention_core) so the scores stay alive to the end of the
        # forward as they always have: the measured peaks the memory walk is checked against
        # (tests/runtime/test_memory_measured.py) include them
        a = self.heads
        q, k, v = self.qkv(self.norm(x)).split(h, dim=-1)
        q = q.reshape(b, t, a, h // a).transpose(1, 2)
        k = k.reshape(b, t, a, h // a).transpose(1, 2)
        v = v.reshape(b, t, a, h // a).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(h // a))
        scores = scores.masked_fill(self.mask[:t, :t], float("-inf"))
        y = scores.softmax(dim=-1) @ v
        return x + self.proj(y.transpose(1, 2).reshape(b, t, h))


def _core(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, mask: torch.Tensor, fused: bool = False
) -> torch.Tensor:
    b, t, h = q.shape
    d = h // heads
    q = q.reshape(b, t, heads, d).transpose(1, 2)
    k = k.reshape(b, t, heads, d).transpose(1, 2)
    v = v.reshape(b, t, heads, d).transpose(1, 2)
    if fused:  # FlashAttention-style kernel: keeps the logsumexp per row, recomputes the scores
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(b, t, h)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
    scores = scores.masked_fill(mask, float("-inf"))
    y = scores.softmax(dim=-1) @ v
    return y.transpose(1, 2).reshape(b, t, h)


def attention_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads: int,
    mask: torch.Tensor,
    *,
    recompute: bool = False,
    fused: bool = False,
) -> torch.Tensor:
    """Causal softmax attention of ``heads`` heads over ``[B, t, heads * d]`` inputs, written out.

    With ``recompute`` (selective recomputation, Megatron's): the scores, the softmax and their
    product with ``v`` are not kept for backward but recomputed from ``q, k, v`` there
    (``torch.utils.checkpoint``, non-reentrant, which replays the RNG state of a dropout too);
    they are the s²-sized activations, the largest per FLOP. With ``fused`` the core is
    ``scaled_dot_product_attention`` (causal), which keeps no s² tensor.
    """
    if recompute and torch.is_grad_enabled():
        return checkpoint(_core, q, k, v, heads, mask, fused, use_reentrant=False)
    return _core(q, k, v, heads, mask, fused)


class Mlp(nn.Module):
    """Pre-LN feed-forward (h -> 4h -> h, GELU) with its residual add."""

    def __init__(self, hidden: int, layers: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = uninitialised(nn.Linear, hidden, 4 * hidden)
        self.act = nn.GELU()
        self.down = uninitialised(nn.Linear, 4 * hidden, hidden)
        _init_linear(self.up, INIT_STD)
        _init_linear(self.down, INIT_STD / math.sqrt(2 * layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


class Head(nn.Module):
    """Final LayerNorm + untied LM head (no bias): ``[B, t, h]`` -> logits ``[B, t, vocab]``."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.lm = uninitialised(nn.Linear, hidden, vocab, bias=False)
        _init_linear(self.lm, INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(self.norm(x))


class GptModel(ZooModel):
    """The zoo GPT for a full, checked config (keys as the analytic ``gpt`` family)."""

    def __init__(self, config: dict) -> None:
        if config.get("dropout") == "on":  # none here: a pipeline must reproduce a one-process run
            raise HetplanError("the zoo GPT has no dropout; use dropout: off", field="config.dropout")
        self.config = dict(config)
        self._tables: dict[int, np.ndarray] = {}
        super().__init__({"family": "gpt", "config": dict(config)})

    def block_names(self) -> list[str]:
        names = ["embedding"]
        for i in range(self.config["layers"]):
            names += [f"layer{i}.attn", f"layer{i}.mlp"]
        return [*names, "head"]

    def block_kinds(self) -> list[str]:
        return ["embedding"] + ["attention", "mlp"] * self.config["layers"] + ["head"]

    def tied_parameters(self) -> list[tuple[tuple[int, str], ...]]:
        """With ``head: tied`` (GPT-2's), the LM head's weight is the token table."""
        if self.config.get("head") != "tied":
            return []
        return [((0, "tokens.weight"), (self.n_blocks - 1, "lm.weight"))]

    def _new_block(self, index: int) -> nn.Module:
        c = self.config
        if index == 0:
            return Embedding(c["vocab"], c["seq"], c["hidden"])
        if index == self.n_blocks - 1:
            return Head(c["hidden"], c["vocab"])
        if index % 2 == 1:
            return Attention(c["hidden"], c["heads"], c["seq"], c["layers"], fused=c.get("attention") == "fused")
        return Mlp(c["hidden"], c["layers"])

    def teacher(self, seed: int) -> np.ndarray:
        """The chain's successor table ``[vocab, SUCCESSORS]``, fixed by ``seed``."""
        if seed not in self._tables:
            rng = np.random.default_rng(derive_seed("gpt-teacher", seed))
            self._tables[seed] = rng.integers(0, self.config["vocab"], size=(self.config["vocab"], SUCCESSORS))
        return self._tables[seed]

    def sample_batch(self, batch_size: int, *, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        _check_batch_size(batch_size)
        table = self.teacher(seed)
        s, v = self.config["seq"], self.config["vocab"]
        tokens = np.empty((batch_size, s + 1), dtype=np.int64)
        picks = np.empty((batch_size, s), dtype=np.int64)
        for i in range(batch_size):  # each sample's draws from its own generator
            rng = np.random.default_rng(derive_seed("sample", seed, step, i))
            tokens[i, 0] = rng.integers(v)
            picks[i] = rng.integers(SUCCESSORS, size=s)
        for j in range(s):  # walk the chain, all samples at once
            tokens[:, j + 1] = table[tokens[:, j], picks[:, j]]
        out = torch.from_numpy(tokens)
        return out[:, :-1].contiguous(), out[:, 1:].contiguous()

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy, mean over a sample's tokens, summed over samples."""
        per_token = F.cross_entropy(output.float().reshape(-1, output.shape[-1]), targets.reshape(-1), reduction="none")
        return per_token.reshape(targets.shape[0], -1).mean(dim=1).sum()

    def input_dtype(self) -> torch.dtype:
        return torch.long

    def sample_shape(self) -> tuple[int, ...]:
        return (self.config["seq"],)
