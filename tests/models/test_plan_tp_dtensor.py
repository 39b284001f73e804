"""A declared tensor-parallel plan runs through torch.distributed.tensor.parallel (parallelize_module
with ColwiseParallel / RowwiseParallel over a DeviceMesh) on two gloo processes: each member holds
its plain local shards, and the block's output and input gradient equal the whole block's."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
from spawn_ranks import spawn_ranks

pytest.importorskip("transformers", reason="the Llama block needs transformers (pip install '.[hf]')")

LLAMA = {
    "hf": "llama",
    "config": {"num_hidden_layers": 1, "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
               "intermediate_size": 32, "vocab_size": 64, "max_position_embeddings": 16, "mlp_bias": True},
    "seq": 8,
}  # fmt: skip


def _member(rank: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from hetplan.models import resolve_model
        from hetplan.models.gpt_tp import TpGroup
        from hetplan.models.plan_tp import DTensorShardLinear, shard_model_block

        zoo = resolve_model(LLAMA)
        pg = dist.new_group([0, 1])
        shard = 1 - rank  # the plan's order need not be the group's
        out: dict[str, object] = {}
        for index in (1, 2):  # attention (q, k, v colwise, o rowwise), MLP (gate, up colwise, down rowwise)
            full = zoo.build_block(index, 0)
            part = shard_model_block(zoo, index, zoo.build_block(index, 0), TpGroup(pg, 2, shard, (1, 0)))
            kinds = {type(part.get_submodule(p)).__name__ for p in zoo.tp_plan(index)}
            x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(index))
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            ya, yb = full(xa), part(xb)
            (ya * ya).sum().backward()
            (yb * yb).sum().backward()
            grads = {}
            for name, p in part.named_parameters():
                whole = full.get_parameter(name).grad
                spec = part.tp_specs.get(name)
                grads[name] = float((p.grad - (spec.cut(whole, 2, shard) if spec else whole)).abs().max())
            out[str(index)] = {
                "kinds": sorted(kinds),
                "plain": all(type(p) is torch.nn.Parameter for p in part.parameters()),
                "out": float((ya - yb).abs().max()),
                "grad_in": float((xa.grad - xb.grad).abs().max()),
                "grads": max(grads.values()),
            }
        torch.save(out, os.path.join(folder, f"{rank}.pt"))
        assert DTensorShardLinear  # imported: the class the plan's layers become
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_declared_plan_runs_through_parallelize_module_with_local_shards(tmp_path) -> None:
    spawn_ranks(_member, args=(_free_port(), str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        result = torch.load(tmp_path / f"{rank}.pt")
        for index, got in result.items():
            assert got["kinds"] == ["DTensorShardLinear"], index
            assert got["plain"]  # the runtime sees plain local shards, not DTensors
            assert got["out"] < 1e-5 and got["grad_in"] < 1e-5 and got["grads"] < 1e-5, (index, got)
