"""The host-staged transport (gloo carrying a GPU rank's tensors through host memory), on CPU.

On CPU its stand-in stages every tensor (``HETPLAN_STAGE_ON_CPU=1``): each transfer and collective
runs on a host copy and its result is copied back where the runtime reads it. A copy-back missing
anywhere (a received activation, a summed gradient, the loss) changes the losses, so a staged run
must give exactly the plain gloo run's losses.
"""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist
from builders import make_cluster, zoo_profile

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.runtime.device.rank_device import STAND_IN_ENV
from hetplan.runtime.device.staged import install_staging
from hetplan.runtime.launcher import launch_local

GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 16, "heads": 2, "seq": 4, "vocab": 17}}


def _losses(tmp_path, name: str, *, staged: bool, monkeypatch, **mode) -> list[tuple[int, float, str | None]]:
    # two pipelines: one of two stages (transfers), one of one device (gradient all-reduces with both)
    plan = Plan(
        global_batch=8,
        pipelines=[
            Pipeline(4, (2, 2), (Stage(0, 3, ("n0/0",), (1.0,)), Stage(3, 6, ("n0/1",), (1.0,)))),
            Pipeline(4, (4,), (Stage(0, 6, ("n0/2",), (1.0,)),)),
        ],
        optimizer="adam",
        **mode,
    )
    config = build_rank_config(plan, zoo_profile(GPT), make_cluster([("n0", [("cpu", 3)])]), seed=3, backend="gloo")
    path = tmp_path / f"{name}.yaml"
    write_yaml(config, path)
    if staged:
        monkeypatch.setenv(STAND_IN_ENV, "1")
    else:
        monkeypatch.delenv(STAND_IN_ENV, raising=False)
    result = launch_local(path, steps=2)
    return [(r["step"], r["loss"], r.get("transport")) for r in result.records if r["rank"] == 0]


def test_host_staged_and_plain_gloo_give_identical_losses(tmp_path, monkeypatch) -> None:
    # ZeRO-1: the pipelines' transfers, the shared groups' reduce and weight gather (through an alias
    # zero.py took of torch.distributed's function at import), the loss all-reduce
    plain = _losses(tmp_path, "plain", staged=False, monkeypatch=monkeypatch, zero=1)
    staged = _losses(tmp_path, "staged", staged=True, monkeypatch=monkeypatch, zero=1)
    assert [t for _, _, t in plain] == [None] * 2
    assert [t for _, _, t in staged] == ["host-staged"] * 2
    assert [loss for _, loss, _ in staged] == [loss for _, loss, _ in plain]  # bit for bit


def test_staging_copies_results_back_into_the_tensors_the_caller_holds(tmp_path) -> None:
    """One process, a gloo group of one: each wrapped call runs on a host copy and writes back."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    staging = install_staging(everything=True)
    try:
        x = torch.tensor([1.0, 2.0])
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        assert x.tolist() == [1.0, 2.0]  # a sum over one rank: the same values, through the host
        out = [torch.zeros(2)]
        dist.all_gather(out, torch.tensor([5.0, 6.0]))
        assert out[0].tolist() == [5.0, 6.0]  # written through the host copy into the caller's list
        flat = torch.zeros(2)
        dist.all_gather_into_tensor(flat, torch.tensor([7.0, 8.0]))
        assert flat.tolist() == [7.0, 8.0]
        assert staging.staged >= 5
    finally:
        staging.uninstall()
        dist.destroy_process_group()
    assert dist.all_reduce.__module__.startswith("torch.distributed")  # put back
    assert os.environ.get(STAND_IN_ENV) is None


#: torch.distributed calls that carry no tensor of the caller's (nothing to stage).
_TENSORLESS = {
    "get_rank", "get_world_size", "get_backend", "get_process_group_ranks", "new_group", "init_process_group",
    "destroy_process_group", "is_initialized", "is_available", "barrier", "all_gather_object",
    "P2POp", "FileStore", "TCPStore", "ProcessGroup", "Work", "ReduceOp",
}  # fmt: skip


def test_every_tensor_call_the_runtime_makes_is_staged() -> None:
    """A torch.distributed call with a CUDA tensor that the transport does not wrap reaches gloo
    with a device pointer: on an H100 Adasum's isend/irecv ended in `gloo::IoException ... writev:
    Bad address` (benchmarks/results/gpu_check-H100-SXM.part5.md). Every call the runtime's source
    makes must be wrapped or carry no tensor."""
    import re
    from pathlib import Path

    from hetplan.runtime.device import staged

    root = Path(staged.__file__).resolve().parents[1]
    called = {m for f in root.rglob("*.py") for m in re.findall(r"\bdist\.([A-Za-z_]+)\(", f.read_text())}
    assert called - _TENSORLESS <= set(staged._WRAPPED), sorted(called - _TENSORLESS - set(staged._WRAPPED))
    assert {"isend", "irecv"} <= called  # the check sees what it should


@pytest.mark.parametrize("sync", ["adasum", "topk"])
def test_host_staged_sync_modes_give_the_plain_losses(tmp_path, monkeypatch, sync: str) -> None:
    """Adasum's tree (isend/irecv, broadcast) and top-k's (index, value) all-gathers, staged."""
    plain = _losses(tmp_path, f"plain-{sync}", staged=False, monkeypatch=monkeypatch, sync=sync)
    staged = _losses(tmp_path, f"staged-{sync}", staged=True, monkeypatch=monkeypatch, sync=sync)
    assert [t for _, _, t in staged] == ["host-staged"] * 2
    assert [loss for _, loss, _ in staged] == [loss for _, loss, _ in plain]
