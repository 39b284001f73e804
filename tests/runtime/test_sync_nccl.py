"""wsp and sdpipe under NCCL: the default group maps CPU tensors to gloo and CUDA tensors to NCCL,
and every exchange with the central process (and SDPipe's weight swap) moves CPU tensors.

This machine has a CPU-only torch, so no test here runs NCCL: they check the backend choice and that
the exchange code copies a tensor of another device to the CPU before torch.distributed sees it and
back to that device after. A stand-in tensor reports the ``meta`` device (torch refuses to copy out
of a real meta tensor, so the stand-in hands over its CPU data when ``.cpu()`` is called).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from hetplan.runtime.sync.central import device_transfer_group, process_group_backend
from hetplan.runtime.sync.param_server import PsClient
from hetplan.runtime.sync.wave_sync import GroupAverage


class OnDevice:
    """A tensor on a non-CPU device, as far as the exchange code can tell: ``.cpu()`` is the copy."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data
        self.device = torch.device("meta")
        self.dtype = data.dtype
        self.copied = 0

    def detach(self) -> OnDevice:
        return self

    def float(self) -> OnDevice:
        return self

    def numel(self) -> int:
        return self.data.numel()

    def cpu(self) -> torch.Tensor:
        self.copied += 1
        return self.data.clone()


@pytest.mark.parametrize(
    ("backend", "central", "expected"),
    [("nccl", True, "cpu:gloo,cuda:nccl"), ("nccl", False, "nccl"), ("gloo", True, "gloo"), ("gloo", False, "gloo")],
)
def test_the_backend_map_only_for_nccl_with_a_central_process(backend: str, central: bool, expected: str) -> None:
    assert process_group_backend(backend, central=central) == expected


def test_the_transfer_group_leaves_the_central_rank_out_under_the_map(monkeypatch) -> None:
    created: list[list[int]] = []
    monkeypatch.setattr(dist, "new_group", lambda ranks: created.append(ranks) or "group")
    monkeypatch.setattr(dist, "get_backend", lambda: "cpu:gloo,cuda:nccl")
    assert device_transfer_group({"a/0": 0, "a/1": 1, "b/0": 3}) == "group"  # rank 2: the central process
    assert created == [[0, 1, 3]]
    monkeypatch.setattr(dist, "get_backend", lambda: "gloo")
    assert device_transfer_group({"a/0": 0}) is None
    assert created == [[0, 1, 3]]


def test_a_wsp_push_sends_a_cpu_copy(monkeypatch) -> None:
    sent: list[torch.Tensor] = []

    def send(tensor, dst, tag):
        assert isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu"
        sent.append(tensor)

    monkeypatch.setattr(dist, "send", send)
    grad = OnDevice(torch.arange(5, dtype=torch.float32))
    PsClient(9, 5, rank=0).push(3, grad)  # type: ignore[arg-type]
    assert grad.copied == 1
    assert sent[0].tolist() == [1, 3, 0, 5, 0]  # the header: push, clock 3, rank 0, 5 elements, no overflow
    assert sent[1].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_the_sdpipe_swap_moves_cpu_tensors_and_returns_to_the_device(monkeypatch) -> None:
    handed: list[torch.Tensor] = []

    class Op:
        def __init__(self, op, tensor, peer, tag):
            assert isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu"
            handed.append(tensor)

    monkeypatch.setattr(dist, "P2POp", Op)
    monkeypatch.setattr(dist, "batch_isend_irecv", lambda ops: [])
    client = SimpleNamespace(ready=lambda step: (0, 1), width=3)
    average = GroupAverage(client, 0, peers={0: 0, 1: 1}, batches={0: 1, 1: 1})  # type: ignore[arg-type]
    weights = OnDevice(torch.ones(4))
    out = average.after_step(0, weights)  # type: ignore[arg-type]
    assert weights.copied == 1 and len(handed) == 2  # this device's weights out, its partner's in
    assert out.device.type == "meta" and out.dtype == torch.float32  # back on the device it came from
