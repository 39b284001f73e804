"""Check per-device action lists before the first step: a schedule that would hang is refused.

Rules: each forward precedes its backward on a device; every send has exactly one matching receive
(same micro-batch, kind, sample range, peer); and executing the lists with blocking receives and
non-blocking sends finishes (no deadlock). The last is checked by running the lists abstractly.
"""

from __future__ import annotations

from collections import Counter

from planner.errors import HetplanError
from planner.schedule.actions import Action, Kind

__all__ = ["validate_programs"]


def _key(src: str, dst: str, a: Action) -> tuple:
    grad = a.kind in (Kind.SEND_GRAD, Kind.RECV_GRAD)
    return (src, dst, grad, a.micro, a.lo, a.hi)


def validate_programs(actions: dict[str, list[Action]]) -> None:
    """Raise a one-line error naming the device and action of the first problem found."""
    sends: Counter = Counter()
    recvs: Counter = Counter()
    for device, acts in actions.items():
        seen_forward: set[int] = set()
        for a in acts:
            if a.kind is Kind.FORWARD:
                seen_forward.add(a.micro)
            elif a.kind is Kind.BACKWARD and a.micro not in seen_forward:
                raise HetplanError(f"device {device}: backward of micro-batch {a.micro} comes before its forward")
            if a.kind.is_send:
                sends[_key(device, a.peer, a)] += 1
            elif a.kind.is_recv:
                recvs[_key(a.peer, device, a)] += 1
    for key in sends.keys() | recvs.keys():
        if sends[key] != recvs[key]:
            src, dst, grad, micro, lo, hi = key
            what = "gradients" if grad else "activations"
            raise HetplanError(
                f"{src} -> {dst}: {sends[key]} send(s) but {recvs[key]} receive(s) of {what} of "
                f"micro-batch {micro} samples [{lo}, {hi})"
            )
    # abstract run: sends post a message, receives block until it is there, collectives need every member
    position = dict.fromkeys(actions, 0)
    posted: Counter = Counter()
    waiting_collective: dict[int, set[str]] = {}
    members: dict[int, set[str]] = {}
    for device, acts in actions.items():
        for a in acts:
            if a.kind is Kind.ALLREDUCE:
                members.setdefault(a.group, set()).add(device)
    while True:
        progressed = False
        for device, acts in actions.items():
            while position[device] < len(acts):
                a = acts[position[device]]
                if a.kind.is_send:
                    posted[_key(device, a.peer, a)] += 1
                elif a.kind.is_recv:
                    key = _key(a.peer, device, a)
                    if posted[key] == 0:
                        break
                    posted[key] -= 1
                elif a.kind is Kind.ALLREDUCE:
                    arrived = waiting_collective.setdefault(a.group, set())
                    arrived.add(device)
                    if arrived != members[a.group]:
                        break
                position[device] += 1
                progressed = True
        # a collective completes for the others once every member has arrived
        for group, arrived in waiting_collective.items():
            if arrived == members[group]:
                for device in arrived:
                    acts = actions[device]
                    if (
                        position[device] < len(acts)
                        and acts[position[device]].kind is Kind.ALLREDUCE
                        and acts[position[device]].group == group
                    ):
                        position[device] += 1
                        progressed = True
        if all(position[d] == len(a) for d, a in actions.items()):
            return
        if not progressed:
            stuck = [f"{d} at {actions[d][position[d]]}" for d in actions if position[d] < len(actions[d])]
            raise HetplanError("the schedule would deadlock: " + ", ".join(stuck[:4]))
