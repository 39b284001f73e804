"""Activation recomputation and the tensor-parallel blocks, in one process and on two gloo ranks.

Recomputation must not change a number: a recomputed block (``full``) or attention core
(``selective``) gives the same output and gradients as the plain one, a dropout included (its RNG
state is replayed). The tensor-parallel blocks, cut from the full block, give the full block's output
and gradients, and the replicated parameters (LayerNorm, row-parallel bias) get the same gradient on
every member, which is what lets the per-shard gradient all-reduce keep them in sync.
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
from spawn_ranks import spawn_ranks
from torch import nn

from hetplan.errors import HetplanError
from hetplan.models import resolve_model
from hetplan.models.gpt_tp import ShardSpec, TpGroup, shard_block, shard_specs
from hetplan.runtime.parallel.recompute import recomputed

GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 4, "seq": 8, "vocab": 31}}


def _grads(run, blocks, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    x = x.clone().requires_grad_(True)
    y = x
    for b in run:
        y = b(y)
    (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
    return y.detach(), [p.grad.clone() for b in blocks for p in b.parameters()], x.grad


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recomputation_gives_the_same_output_and_gradients(mode: str) -> None:
    zoo = resolve_model(GPT)
    plain, again = zoo.build_blocks(1, 5, 7), zoo.build_blocks(1, 5, 7)
    x = torch.randn(3, 8, 32, generator=torch.Generator().manual_seed(0))
    y0, g0, dx0 = _grads(recomputed(plain, "none"), plain, x)
    saved: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        y1, g1, dx1 = _grads(recomputed(again, mode), again, x)
    torch.testing.assert_close(y1, y0, atol=0, rtol=0)
    torch.testing.assert_close(dx1, dx0, atol=1e-6, rtol=0)
    for a, b in zip(g1, g0, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(-t.numel()) or t, lambda t: t):
        _grads(recomputed(plain, "none"), plain, x)
    kept = sum(n for n in saved if n > 0)
    assert 0 < kept < -sum(n for n in saved if n < 0)  # it keeps less (the forward is recorded again)


def test_full_recomputation_replays_a_dropout_mask() -> None:
    """A block with dropout: recomputed, it draws the same mask in backward as in forward."""

    def block() -> nn.Module:
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5), nn.Linear(16, 16)).train()

    plain, again = block(), block()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(3)
    y0, g0, _ = _grads([plain], [plain], x)
    torch.manual_seed(3)
    y1, g1, _ = _grads(recomputed([again], "full"), [again], x)
    torch.testing.assert_close(y1, y0, atol=0, rtol=0)
    for a, b in zip(g1, g0, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(HetplanError, match="recompute"):
        recomputed([], "most")


def test_a_shard_spec_cuts_and_joins_back() -> None:
    full = torch.arange(2 * 96 * 5, dtype=torch.float32).reshape(2, 96, 5)
    spec = ShardSpec(1, 3)
    parts = [spec.cut(full, 4, r) for r in range(4)]
    assert parts[1].shape == (2, 24, 5)
    assert torch.equal(parts[1][:, :8], full[:, 8:16]) and torch.equal(parts[1][:, 8:16], full[:, 40:48])
    assert torch.equal(spec.join(parts), full)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _member(rank: int, size: int, port: int, folder: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    torch.set_num_threads(1)
    zoo = resolve_model(GPT)
    full = zoo.build_blocks(1, 3, 7)  # layer0.attn, layer0.mlp
    group = TpGroup(dist.group.WORLD, size, rank, tuple(range(size)))
    mine = [shard_block(b, group) for b in zoo.build_blocks(1, 3, 7)]
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(5))
    y_full, _, dx_full = _grads(full, full, x)
    y, g, dx = _grads(mine, mine, x)
    result = {"y": float((y - y_full).abs().max()), "dx": float((dx - dx_full).abs().max()), "grads": 0.0, "same": 0.0}
    names = [(i, n) for i, b in enumerate(mine) for n, _ in b.named_parameters()]
    full_grads = {(i, n): p.grad for i, b in enumerate(full) for n, p in b.named_parameters()}
    for (i, name), grad in zip(names, g, strict=True):
        spec = shard_specs(mine[i]).get(name)
        parts = group.gather(grad)
        whole = spec.join(parts) if spec else grad
        result["grads"] = max(result["grads"], float((whole - full_grads[(i, name)]).abs().max()))
        if spec is None:  # replicated: every member's gradient is the same, bit for bit
            result["same"] = max(result["same"], max(float((p - grad).abs().max()) for p in parts))
    torch.save(result, f"{folder}/rank-{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("size", [2])
def test_tensor_parallel_blocks_equal_the_full_blocks_and_keep_replicated_gradients_equal(tmp_path, size: int) -> None:
    spawn_ranks(_member, args=(size, _free_port(), str(tmp_path)), nprocs=size)
    for rank in range(size):
        r = torch.load(tmp_path / f"rank-{rank}.pt")
        assert r["y"] < 1e-6 and r["dx"] < 1e-6 and r["grads"] < 1e-6, r
        assert r["same"] == 0.0, r
