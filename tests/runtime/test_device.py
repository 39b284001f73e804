"""The GPU path on CPU: which GPU a rank takes, the type check, the event bookkeeping, the p2p group.

A stand-in ``torch.cuda`` numbers its GPUs as the CUDA driver does (fastest first unless
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` was set when it initialised; ``CUDA_VISIBLE_DEVICES`` then picks
and orders them), so the tests check the rank's choice against the driver's rules rather than
against hetplan's own arithmetic.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from builders import make_cluster, zoo_profile

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.rank_config import load_rank_config
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.errors import HetplanError
from hetplan.runtime.device.ops import CpuOps, CudaOps
from hetplan.runtime.device.rank_device import choose_device
from hetplan.runtime.device.transport import check_transport, p2p_groups
from hetplan.runtime.validate import P2PGroup, validate_p2p_groups
from hetplan.schedule.compile import compile_plan

GIB = 2**30


@dataclass
class _Props:
    name: str
    total_memory: int
    pci: str
    speed: int


class _StubCuda:
    """The CUDA driver's numbering of a node's GPUs, read from the environment at initialisation."""

    def __init__(self, gpus: list[_Props]) -> None:
        self.gpus = gpus
        self.order: list[_Props] | None = None
        self.calls: list[str] = []

    def _init(self) -> list[_Props]:
        if self.order is None:
            if os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
                ranked = sorted(self.gpus, key=lambda g: g.pci)
            else:  # FASTEST_FIRST, CUDA's default
                ranked = sorted(self.gpus, key=lambda g: -g.speed)
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            self.order = [ranked[int(i)] for i in visible.split(",")] if visible is not None else ranked
        return self.order

    def is_available(self) -> bool:
        return bool(self._init())

    def device_count(self) -> int:
        return len(self._init())

    def get_device_properties(self, index: int) -> _Props:
        return self._init()[index]


# docs/clusters.md's node of four V100s and one A100, the A100 in the last PCI slot
_NODE = [_Props("Tesla V100-SXM2-16GB", 16 * GIB, f"0000:{i:02x}:00.0", 1) for i in range(4)]
_NODE.append(_Props("NVIDIA A100-SXM4-80GB", 80 * GIB, "0000:04:00.0", 3))


def _config(tmp_path, used: list[int], *, sync: str = "allreduce"):
    types = [("V100-16GB", 4), ("A100-80GB", 1)]
    cluster = make_cluster([("node2", types)])
    model = {"family": "mlp", "config": {"layers": 4, "width": 8}}
    stages = tuple(Stage(i, i + 1, (f"node2/{d}",), (1.0,)) for i, d in enumerate(used))
    plan = Plan(global_batch=4, pipelines=[Pipeline(4, (4,), stages)], sync=sync)
    path = tmp_path / "rank-config.yaml"
    write_yaml(build_rank_config(plan, zoo_profile(model), cluster, backend="nccl"), path)
    return load_rank_config(path)


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_ranks_map_to_gpus_by_pci_order_within_cuda_visible_devices(tmp_path, clean_env) -> None:
    config = _config(tmp_path, [0, 1, 2, 3])
    config_all = _config(tmp_path, [0, 4, 1, 2])  # the A100 (node2/4) is the second stage
    # every GPU visible: local rank k takes PCI slot k (CUDA alone would make the A100 cuda:0)
    clean_env.setenv("LOCAL_RANK", "0")
    cuda = _StubCuda(_NODE)
    got = choose_device(config, "node2/0", backend="nccl", compute=None, accept_mismatch=False, cuda=cuda)
    assert got.device == torch.device("cuda", 0) and cuda.get_device_properties(0).pci == "0000:00:00.0"
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    # the scheduler shows two GPUs, slots 4 and 1: local ranks 0 and 1 take them, in that order
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "4,1")
    for local, address, pci in ((0, "node2/4", "0000:04:00.0"), (1, "node2/0", "0000:01:00.0")):
        clean_env.setenv("LOCAL_RANK", str(local))
        cuda = _StubCuda(_NODE)
        got = choose_device(config_all, address, backend="nccl", compute=None, accept_mismatch=True, cuda=cuda)
        assert cuda.get_device_properties(got.device.index).pci == pci
    # a local rank beyond the visible GPUs: one line
    clean_env.setenv("LOCAL_RANK", "2")
    with pytest.raises(HetplanError, match=r"local rank 2 needs GPU 2, and 2 are visible \(CUDA_VISIBLE_DEVICES=4,1\)"):
        choose_device(config_all, "node2/1", backend="nccl", compute=None, accept_mismatch=True, cuda=_StubCuda(_NODE))


def test_another_device_order_chosen_by_the_user_is_refused(tmp_path, clean_env) -> None:
    clean_env.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    with pytest.raises(HetplanError, match="PCI order"):
        choose_device(_config(tmp_path, [0]), "node2/0", backend="nccl", compute=None, accept_mismatch=False,
                      cuda=_StubCuda(_NODE))  # fmt: skip


def test_a_rank_on_a_gpu_of_another_type_stops_with_one_line(tmp_path, clean_env, capsys) -> None:
    # the plan puts the A100 (node2/4) at local rank 1, but only slots 0 and 1 (V100s) are visible
    config = _config(tmp_path, [0, 4])
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    clean_env.setenv("LOCAL_RANK", "1")
    with pytest.raises(HetplanError) as info:
        choose_device(config, "node2/4", backend="nccl", compute=None, accept_mismatch=False, cuda=_StubCuda(_NODE))
    text = str(info.value)
    assert "\n" not in text
    assert "rank at node2/4 (cuda:1)" in text and "'Tesla V100-SXM2-16GB', not a A100-80GB" in text
    assert info.value.field == "devices[node2/4].type"
    # memory alone differs (an A100 40GB where the plan says 80GB)
    small = [_Props("NVIDIA A100-SXM4-40GB", 40 * GIB, f"0000:{i:02x}:00.0", 1) for i in range(2)]
    with pytest.raises(HetplanError, match=r"has 40\.0 GiB, and a A100-80GB 80\.0 GiB"):
        choose_device(config, "node2/4", backend="nccl", compute=None, accept_mismatch=False, cuda=_StubCuda(small))
    # accepted: a warning, and the rank goes on
    got = choose_device(config, "node2/4", backend="nccl", compute=None, accept_mismatch=True, cuda=_StubCuda(_NODE))
    assert got.device == torch.device("cuda", 1)
    assert "accepted (--accept-device-mismatch)" in capsys.readouterr().err


def test_host_staged_ranks_share_a_gpu_and_nccl_ranks_do_not(tmp_path, clean_env) -> None:
    config = _config(tmp_path, [0, 1])
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "0")
    clean_env.setenv("LOCAL_RANK", "1")
    got = choose_device(config, "node2/1", backend="gloo", compute="cuda", accept_mismatch=False, cuda=_StubCuda(_NODE))
    assert got.device == torch.device("cuda", 0) and got.staged
    with pytest.raises(HetplanError, match="local rank 1 needs GPU 1"):
        choose_device(config, "node2/1", backend="nccl", compute=None, accept_mismatch=False, cuda=_StubCuda(_NODE))
    cpu = choose_device(config, "node2/1", backend="gloo", compute=None, accept_mismatch=False, cuda=_StubCuda(_NODE))
    assert cpu.device == torch.device("cpu") and not cpu.staged


class _Event:
    def __init__(self, log: list[str], clock: list[float], enable_timing: bool) -> None:
        assert enable_timing
        self.log, self.clock, self.at = log, clock, None

    def record(self, stream) -> None:
        self.log.append(f"record on {stream}")
        self.at = self.clock[0]

    def synchronize(self) -> None:
        self.log.append("event.synchronize")

    def elapsed_time(self, end: _Event) -> float:  # milliseconds, as torch.cuda.Event's
        return (end.at - self.at) * 1e3


class _TimingCuda:
    """Events on streams, a fake clock, and a synchronize that must never be called."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.clock = [0.0]

    def Event(self, enable_timing: bool = False) -> _Event:  # noqa: N802 - torch.cuda's name
        return _Event(self.log, self.clock, enable_timing)

    def current_stream(self, device) -> str:
        return f"compute stream of {device}"

    def synchronize(self, device=None) -> None:
        raise AssertionError("a device-wide synchronize")

    def reset_peak_memory_stats(self, device) -> None:
        self.log.append("reset peak")

    def max_memory_allocated(self, device) -> int:
        return 1234


def test_cuda_compute_is_timed_by_events_on_the_compute_stream_only() -> None:
    cuda = _TimingCuda()
    ops = CudaOps(torch.device("cuda", 0), cuda=cuda)
    mark = ops.mark()
    cuda.clock[0] = 0.25  # the compute stream reached its end event 250 ms later
    assert ops.since(mark) == pytest.approx(0.25)
    ops.settle()
    ops.reset_peak()
    assert ops.peak_bytes() == 1234.0
    assert cuda.log == [
        "record on compute stream of cuda:0",
        "record on compute stream of cuda:0",
        "event.synchronize",  # the end event alone: NCCL's streams go on
        "record on compute stream of cuda:0",
        "event.synchronize",
        "reset peak",
    ]
    cpu = CpuOps(torch.device("cpu"))  # the stand-in: the host clock, the same calls
    assert cpu.since(cpu.mark()) >= 0.0 and cpu.peak_bytes() is None


def test_no_runtime_module_calls_a_device_wide_synchronize() -> None:
    """``torch.cuda.synchronize`` waits for every stream, NCCL's included: nowhere in the runtime."""
    root = Path(__file__).resolve().parents[2] / "planner" / "runtime"
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "synchronize":
                target = ast.unparse(node.func.value)
                if target.endswith("cuda") or target.endswith("torch.cuda"):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}: {target}.synchronize()")
    assert offenders == []
    assert len(list(root.rglob("*.py"))) > 20  # the scan saw the runtime


def _wsp_config(tmp_path):
    """wsp with a one-device pipeline (it never sends nor receives) beside a two-stage one."""
    plan = Plan(
        global_batch=8,
        pipelines=[
            Pipeline(4, (2, 2), (Stage(0, 2, ("n0/0",), (1.0,)), Stage(2, 4, ("n0/1",), (1.0,)))),
            Pipeline(4, (4,), (Stage(0, 4, ("n0/2",), (1.0,)),)),
        ],
        optimizer="adam",
        sync="wsp",
        sync_options={"staleness": 0},
    )
    model = {"family": "mlp", "config": {"layers": 4, "width": 8}}
    path = tmp_path / "wsp.yaml"
    write_yaml(build_rank_config(plan, zoo_profile(model), make_cluster([("n0", [("cpu", 3)])]), backend="nccl"), path)
    config = load_rank_config(path)
    programs = {a: p.actions for a, p in compile_plan(config.plan, config.n_blocks).programs.items()}
    return config, programs


def test_validator_refuses_a_batched_p2p_group_not_initialised_on_all_members(tmp_path) -> None:
    config, programs = _wsp_config(tmp_path)
    members = frozenset(config.devices)
    # the group as it was: initialised by its first batch, which the one-device pipeline never joins
    lazy = [P2PGroup("the transfer group", members, frozenset({"n0/0", "n0/1"}))]
    with pytest.raises(HetplanError, match=r"the transfer group, which n0/2 never initialise at start-up"):
        validate_p2p_groups(programs, lazy)
    validate_p2p_groups(programs, lazy, semantics="gloo")  # gloo needs no communicator
    # a transfer outside every group
    with pytest.raises(HetplanError, match="has no process group holding both"):
        validate_p2p_groups(programs, [P2PGroup("g", frozenset({"n0/0", "n0/2"}), frozenset({"n0/0", "n0/2"}))])
    # what the runtime sets up: every device rank warms the group before the first step
    validate_p2p_groups(programs, p2p_groups(config, "nccl"))
    validate_p2p_groups(programs, p2p_groups(config, "gloo"), semantics="gloo")


def test_what_the_host_staged_transport_cannot_carry_is_refused_in_one_line() -> None:
    stage = SimpleNamespace(tensor_parallel=2)
    config = SimpleNamespace(plan=SimpleNamespace(pipelines=[SimpleNamespace(stages=[stage])]), file="rc.yaml")
    with pytest.raises(HetplanError, match="tensor-parallel stages need NCCL") as info:
        check_transport(config, staged=True)
    assert info.value.field == "pipelines[0].stages[0].tensor_parallel"
    check_transport(config, staged=False)  # NCCL carries them


def test_cuda_compute_without_a_gpu_is_one_line(tmp_path, clean_env) -> None:
    config = _config(tmp_path, [0])
    no_gpu = _StubCuda([])
    with pytest.raises(HetplanError, match="--compute-device cuda needs a GPU"):
        choose_device(config, "node2/0", backend="gloo", compute="cuda", accept_mismatch=False, cuda=no_gpu)
    with pytest.raises(HetplanError, match="backend nccl needs CUDA"):
        choose_device(config, "node2/0", backend="nccl", compute=None, accept_mismatch=False, cuda=no_gpu)
