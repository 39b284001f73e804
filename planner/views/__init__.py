"""What people and machines see: rich tables and JSON summaries of every contract and result."""

from typing import Any

from rich.console import Console


def print_all(console: Console, items: list[Any]) -> None:
    """Each renderable on its own line (``console.print(*items)`` would join texts with spaces)."""
    for item in items:
        console.print(item)


def plan_is_emulated(plan: Any, cluster: Any) -> bool:
    """True when a device the plan uses runs an emulated type (so every output must say so)."""
    return any(cluster.device(a).type.emulated for a in plan.all_devices())
