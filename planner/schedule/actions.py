"""One action of one device: a tiny value that prints as ``F3`` / ``SA3>node0/2`` / ``AR1``.

Kinds: ``F`` forward and ``B`` backward of micro-batch *j* on the device's share of it; ``SA``/``RA``
send/receive of activations and ``SG``/``RG`` of gradients with one peer, for a sample range of
micro-batch *j*; ``AR`` the all-reduce of gradient group *g*; ``OPT`` the optimizer step.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

__all__ = ["Action", "Kind"]


class Kind(str, Enum):
    FORWARD = "F"
    BACKWARD = "B"
    SEND_ACT = "SA"
    RECV_ACT = "RA"
    SEND_GRAD = "SG"
    RECV_GRAD = "RG"
    ALLREDUCE = "AR"
    STEP = "OPT"

    @property
    def is_send(self) -> bool:
        return self in (Kind.SEND_ACT, Kind.SEND_GRAD)

    @property
    def is_recv(self) -> bool:
        return self in (Kind.RECV_ACT, Kind.RECV_GRAD)


class Action(NamedTuple):
    """``kind`` on micro-batch ``micro`` (or gradient group ``group``), with ``peer`` for transfers.

    ``lo, hi`` is the sample range inside the micro-batch this action moves or computes (a
    replicated stage computes only its share; a transfer carries the overlap of two shares).
    """

    kind: Kind
    micro: int = -1
    peer: str = ""
    lo: int = 0
    hi: int = 0
    group: int = -1

    @property
    def samples(self) -> int:
        return self.hi - self.lo

    def __str__(self) -> str:
        if self.kind is Kind.ALLREDUCE:
            return f"AR{self.group}"
        if self.kind is Kind.STEP:
            return "OPT"
        text = f"{self.kind.value}{self.micro}"
        if self.kind.is_send:
            text += f">{self.peer}"
        elif self.kind.is_recv:
            text += f"<{self.peer}"
        return text
