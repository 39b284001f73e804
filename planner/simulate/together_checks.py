"""What must hold before jobs can share GPUs: one cluster, and memory for all of them on each device.

Both checks end in one located line (``FILE: FIELD: reason``) naming the plan that does not fit with
the first: a co-run of plans made for different machines, or of jobs that together overflow a GPU,
would be timed without meaning.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hetplan.errors import HetplanError
from hetplan.units import format_bytes

if TYPE_CHECKING:
    from hetplan.simulate.together import PreparedJob, TogetherJob

__all__ = ["check_memory_together", "check_same_cluster"]


def _where(job: TogetherJob) -> str:
    return job.plan.file or f"plan {job.label}"


def check_same_cluster(jobs: Sequence[TogetherJob]) -> None:
    """Every job's cluster has the first job's devices: the same addresses, of the same types (a plan
    may use a subset of them). Link figures are not compared: the first job's cluster gives the
    shared network interfaces' capacities."""
    if not jobs:
        raise HetplanError("no job to simulate")
    first = jobs[0]
    ref = {d.address: d.type.name for d in first.cluster.devices}
    for job in jobs[1:]:
        other = {d.address: d.type.name for d in job.cluster.devices}
        if other == ref:
            continue
        extra = [a for a in other if a not in ref]
        missing = [a for a in ref if a not in other]
        differ = [a for a in ref if a in other and other[a] != ref[a]]
        if extra:
            what = f"its device {extra[0]} is not in the other's"
        elif missing:
            what = f"it has no device {missing[0]}"
        else:
            a = differ[0]
            what = f"its {a} is a {other[a]}, the other's a {ref[a]}"
        raise HetplanError(
            f"plans for different clusters cannot share GPUs: this plan's cluster {job.cluster.name!r} "
            f"({len(other)} devices) is not {_where(first)}'s {first.cluster.name!r} ({len(ref)} devices): {what}",
            file=job.plan.file,
            field="inputs.cluster.path",
        )


def check_memory_together(prepared: Sequence[PreparedJob]) -> dict[str, tuple[float, tuple[float, ...]]]:
    """Each device several jobs use, with its capacity and each job's peak (its tensors, fragmentation
    and reserve: each job is a process with its own CUDA context and allocator); one line naming the
    later job's stage on the first device where the sum exceeds the capacity."""
    users: dict[str, list[int]] = {}
    for j, p in enumerate(prepared):
        for address in p.devices:
            users.setdefault(address, []).append(j)
    out: dict[str, tuple[float, tuple[float, ...]]] = {}
    for address, js in users.items():
        if len(js) < 2:
            continue
        uses = [prepared[j].sim.devices[address].memory for j in js]
        capacity = uses[0].capacity
        totals = tuple(u.total for u in uses)
        out[address] = (capacity, totals)
        if sum(totals) > capacity:
            last = prepared[js[-1]]
            d = last.sim.devices[address]
            needs = ", ".join(f"{prepared[j].job.label} {format_bytes(t)}" for j, t in zip(js, totals, strict=True))
            raise HetplanError(
                f"{address} ({d.type}) cannot hold the jobs together: {needs} is {format_bytes(sum(totals))} "
                f"of {format_bytes(capacity)} (each job's peak with its own reserve: separate processes); "
                "plan them together (hetplan co-plan) or on fewer shared devices",
                file=last.job.plan.file,
                field=f"pipelines[{d.pipeline}].stages[{d.stage}]",
            )
    return out
