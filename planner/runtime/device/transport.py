"""How a rank's tensors travel, set up once at start-up: staged or not, and the p2p group warmed.

    staging = start_transport(choice)            # host-staged under gloo on a GPU; None otherwise
    check_transport(config, staged=choice.staged)  # what the staged transport cannot carry, refused
    groups = p2p_groups(config, backend)          # the groups batched send/receive use, and who
    validate_p2p_groups(actions, groups, ...)     #   initialises them (runtime/validate.py checks)
    warm_p2p_group(executor.transfer_group, device)   # every member, before the first step

NCCL creates a communicator on a group's first collective, and ``batch_isend_irecv`` says: "if this
API is the first collective call in the group passed to dist.P2POp, all ranks of the group must
participate in this API call". The pipelines' transfers share one group (the default group, or
under a central process every device's group); a device that never sends nor receives (a one-device
pipeline of wsp or sdpipe) never joins the first batch, so the others would hang in it. So every
device rank runs one all-reduce on that group before the first step, and the validator refuses a
description where a member would not (:func:`hetplan.runtime.validate.validate_p2p_groups`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hetplan.errors import HetplanError
from hetplan.runtime.comm import use_device, wait
from hetplan.runtime.device.ops import make_ops
from hetplan.runtime.device.rank_device import DeviceChoice
from hetplan.runtime.device.staged import Staging, install_staging
from hetplan.runtime.validate import P2PGroup

__all__ = ["TRANSFER_GROUP", "check_transport", "p2p_groups", "start_transport", "warm_p2p_group"]

#: The name the pipelines' transfer group goes by in the validator's one-line errors.
TRANSFER_GROUP = "the pipelines' transfer group"


def start_transport(choice: DeviceChoice) -> Staging | None:
    """Settle waits on the rank's device (:func:`hetplan.runtime.comm.use_device`), and stage its
    tensors through host memory when gloo carries a GPU rank's traffic (or in the CPU stand-in)."""
    use_device(make_ops(choice.device).settle)
    if not choice.staged:
        return None
    return install_staging(everything=choice.device.type == "cpu")


def check_transport(config: Any, *, staged: bool) -> None:
    """Refuse, in one line, what the host-staged transport does not carry: tensor-parallel stages
    (DTensor's collectives do not go through the staged functions)."""
    if not staged:
        return
    for i, pipe in enumerate(config.plan.pipelines):
        for j, stage in enumerate(pipe.stages):
            if getattr(stage, "tensor_parallel", 1) > 1:
                raise HetplanError(
                    "tensor-parallel stages need NCCL (or the CPU): the host-staged transport (gloo on a GPU) "
                    "does not carry their collectives",
                    file=config.file,
                    field=f"pipelines[{i}].stages[{j}].tensor_parallel",
                )


def p2p_groups(config: Any, backend: str) -> list[P2PGroup]:
    """The groups the runtime's batched send/receive use, with the ranks that initialise each at
    start-up (every device rank under NCCL: :func:`warm_p2p_group`; none under gloo, which needs
    no communicator)."""
    members = frozenset(config.devices)
    if backend != "nccl" and config.central_node is not None:
        members = members | {"central"}  # gloo: the transfers run on the default group
    return [P2PGroup(TRANSFER_GROUP, members, frozenset(config.devices) if backend == "nccl" else frozenset())]


def warm_p2p_group(group: Any, device: torch.device, *, timeout_s: float, what: str) -> None:
    """One all-reduce on ``group`` (None: the default group): every member must call this, before
    any batched send/receive on it."""
    one = torch.ones(1, device=device)
    wait(dist.all_reduce(one, group=group, async_op=True), timeout_s=timeout_s, what=what)
