"""The device one rank computes on, chosen and checked at start-up.

    choice = choose_device(config, address, backend="gloo", compute="cuda", accept_mismatch=False)
    choice.device, choice.staged     # cuda:1, True: gloo carries its traffic through host memory

A rank computes on CUDA under NCCL, or under gloo when the run asks for it (``--compute-device
cuda``, the rank config's ``training.compute_device``): the host-staged transport
(:mod:`hetplan.runtime.device.staged`), with which several ranks may share one GPU. The GPU is the
rank's local rank among the visible ones (:mod:`hetplan.runtime.device.select`), and its name and
memory must match the plan's device type unless the run accepts a mismatch
(``--accept-device-mismatch``): otherwise the rank stops with one line before it joins the job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from hetplan.errors import HetplanError
from hetplan.runtime.device.select import device_mismatch, gpu_index, pci_order

__all__ = ["COMPUTE_DEVICES", "DeviceChoice", "choose_device", "stand_in_staging"]

#: What a rank may compute on.
COMPUTE_DEVICES = ("cpu", "cuda")

#: Set (to 1) to run CPU ranks through the host-staged transport's CPU stand-in (tests).
STAND_IN_ENV = "HETPLAN_STAGE_ON_CPU"


@dataclass(frozen=True)
class DeviceChoice:
    device: torch.device
    #: gloo carries this rank's device tensors through host memory
    staged: bool
    #: the GPU as the driver reports it ("" on CPU), for the run log
    name: str = ""


def stand_in_staging() -> bool:
    """Whether this process stages CPU tensors too (the stand-in of the GPU path, for tests)."""
    return os.environ.get(STAND_IN_ENV, "") == "1"


def _local_rank(config: Any, address: str) -> int:
    """``LOCAL_RANK`` under torchrun; else the address's place among its node's devices."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    node = config.devices[address].node
    return config.nodes[node].index(address)


def choose_device(
    config: Any,
    address: str | None,
    *,
    backend: str,
    compute: str | None,
    accept_mismatch: bool,
    cuda: Any = None,
) -> DeviceChoice:
    """The device of the rank at ``address`` (None: the central process, which holds none).

    Args:
        compute: ``cpu`` or ``cuda``; None: CUDA under NCCL, the CPU under gloo.
        accept_mismatch: go on when the GPU is not the plan's type (one line on stderr says so).
        cuda: the ``torch.cuda`` namespace (a stand-in in tests).
    """
    pci_order()  # before CUDA initialises: it reads the order once
    cuda = cuda if cuda is not None else torch.cuda
    kind = compute or ("cuda" if backend == "nccl" else "cpu")
    if kind not in COMPUTE_DEVICES:
        raise HetplanError(f"expected one of {', '.join(COMPUTE_DEVICES)}, got {kind!r}", field="--compute-device")
    if address is None:
        return DeviceChoice(torch.device("cpu"), staged=False)
    if backend == "nccl" and kind != "cuda":
        raise HetplanError("backend nccl moves CUDA tensors only; use --backend gloo on the CPU", field="--backend")
    if kind == "cpu":
        return DeviceChoice(torch.device("cpu"), staged=stand_in_staging())
    if not cuda.is_available():
        if backend == "nccl":
            raise HetplanError(
                "backend nccl needs CUDA, and this machine has none; use --backend gloo", field="--backend"
            )
        raise HetplanError(
            "--compute-device cuda needs a GPU, and this machine has none; leave it out to compute on the CPU",
            field="--compute-device",
        )
    staged = backend == "gloo"
    local = _local_rank(config, address)
    count = int(cuda.device_count())
    # host-staged ranks may share a GPU (NCCL refuses two ranks on one): the local ranks wrap around
    index = gpu_index(local % count if staged and count else local, cuda=cuda)
    props = cuda.get_device_properties(index)
    name = str(props.name)
    entry = config.devices[address]
    mismatch = device_mismatch(name, float(props.total_memory), entry.type, getattr(entry, "memory", None))
    if mismatch is not None:
        where = f"rank at {address} (cuda:{index})"
        if not accept_mismatch:
            raise HetplanError(
                f"{where}: {mismatch}; the plan is for its type (--accept-device-mismatch runs it anyway)",
                file=getattr(config, "file", None),
                field=f"devices[{address}].type",
            )
        import sys

        print(f"warning: {where}: {mismatch}; accepted (--accept-device-mismatch)", file=sys.stderr, flush=True)
    return DeviceChoice(torch.device("cuda", index), staged=staged, name=name)
