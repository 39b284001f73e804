"""Tables of a simulated iteration: per device, per stage, and the critical path."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from hetplan.simulate.simulator import SimResult
from hetplan.units import format_bytes, format_time

__all__ = ["central_line", "simulation_renderables"]


_CENTRAL_KEYS = ("role", "node", "tensor_bytes", "weights_bytes", "optimizer_bytes", "open_clocks", "clock_sums_bytes")


def central_line(central: Any) -> str:
    """The parameter server's host memory (a plan file's ``predicted.central``) in one line; empty
    where there is none (or a hand-edited entry lacks a figure)."""
    if not isinstance(central, dict) or any(k not in central for k in _CENTRAL_KEYS):
        return ""
    return (
        f"{central['role']} on {central['node']} (host memory, no device): "
        f"{format_bytes(central['tensor_bytes'])} of tensors (weights {format_bytes(central['weights_bytes'])}, "
        f"optimizer {format_bytes(central['optimizer_bytes'])}, {central['open_clocks']} open clock sum(s) "
        f"{format_bytes(central['clock_sums_bytes'])}), beside the interpreter's own"
    )


def simulation_renderables(result: SimResult, *, emulated: bool = False) -> list[Any]:
    """Summary line, device table, stage table, critical path."""
    head = Text()
    head.append(f"iteration {format_time(result.iteration_s)}", style="bold")
    head.append(f"   {result.samples_per_s:,.1f} samples/s   bubble {result.bubble_fraction:.1%}   ")
    head.append(f"bottleneck: {result.bottleneck}", style="bold red")
    out: list[Any] = [head]
    if emulated:
        out.append(Text("device speeds are EMULATED on this machine (slowdown factors)", style="bold yellow"))
    over = [d for d in result.devices.values() if not d.memory.fits]
    if over:
        out.append(
            Text(
                f"memory check ignored: {len(over)} of {len(result.devices)} devices over capacity "
                "(times as if they fit; the table says by how much)",
                style="bold red",
            )
        )

    devices = Table(title="Devices", title_justify="left")
    for col in ("device", "type", "pipe/stage"):
        devices.add_column(col)
    for col in ("compute", "optimizer", "comm", "idle", "busy", "peak memory", "capacity", "fits"):
        devices.add_column(col, justify="right")
    for d in result.devices.values():
        busy = (d.compute_s + d.optimizer_s) / result.iteration_s if result.iteration_s else 0.0
        over = format_bytes(d.memory.total - d.memory.capacity)
        fits = Text("yes", style="green") if d.memory.fits else Text(f"NO: {over} over", style="bold red")
        devices.add_row(
            d.address,
            d.type,
            f"{d.pipeline}/{d.stage}",
            format_time(d.compute_s),
            format_time(d.optimizer_s),
            format_time(d.comm_s),
            format_time(d.idle_s),
            f"{busy:.0%}",
            format_bytes(d.memory.total),
            format_bytes(d.memory.capacity),
            fits,
        )
    out.append(devices)
    if result.central is not None:
        out.append(Text(central_line(result.central.to_dict())))

    stages = Table(title="Stages (per iteration, slowest replica)", title_justify="left")
    for col in ("pipe/stage", "blocks", "devices"):
        stages.add_column(col)
    for col in ("forward", "backward", "sends"):
        stages.add_column(col, justify="right")
    for s in result.stages:
        stages.add_row(
            f"{s.pipeline}/{s.stage}",
            f"[{s.blocks[0]}, {s.blocks[1]})",
            ", ".join(s.devices),
            format_time(s.fwd_s),
            format_time(s.bwd_s),
            format_time(s.send_s),
        )
    out.append(stages)

    path = Table(title="Critical path (what the iteration waited on)", title_justify="left")
    path.add_column("resource")
    path.add_column("time on path", justify="right")
    path.add_column("share", justify="right")
    for what, seconds in result.critical_path[:8]:
        path.add_row(what, format_time(seconds), f"{seconds / result.iteration_s:.0%}" if result.iteration_s else "-")
    out.append(path)
    return out
