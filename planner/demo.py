"""The main job end to end on bundled defaults (``hetplan demo``): what the README's first command runs.

Steps, each writing a file a user can open: analytic profile of a small GPT for the device types of
a bundled heterogeneous cluster -> validate -> plan -> simulate (with a timeline) -> show.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.rule import Rule

from planner.contracts.catalog import load_catalog
from planner.contracts.cluster import load_cluster
from planner.contracts.model_profile import load_profile
from planner.contracts.paths import bundled_profiles_dir
from planner.profile.analytic import analytic_profile
from planner.views.contracts import renderables

__all__ = ["DEMO_CLUSTER", "DEMO_MODEL", "run_demo"]

DEMO_CLUSTER = "mixed-small.yaml"
DEMO_MODEL = {"layers": 8, "hidden": 1024, "heads": 16, "seq": 512, "vocab": 32000}


def run_demo(out: Path, *, console: Console) -> None:
    """Run every step into ``out`` and print what each produced."""
    out.mkdir(parents=True, exist_ok=True)
    cluster_path = bundled_profiles_dir() / "clusters" / DEMO_CLUSTER
    cluster = load_cluster(cluster_path)
    catalog = load_catalog()
    types = [catalog.get(name) for name in cluster.device_types]

    console.print(Rule("1. profile (analytic: FLOPs and bytes against the device catalog)"))
    profile_path = out / "gpt.profile.yaml"
    analytic_profile("gpt", DEMO_MODEL, devices=types, dtype="fp16", micro_batches=(1, 2, 4, 8)).save(profile_path)
    console.print(f"wrote {profile_path}")

    console.print(Rule("2. validate"))
    profile = load_profile(profile_path)
    console.print(f"ok  {profile_path}: {len(profile.blocks)} blocks, times for {', '.join(profile.device_types())}")
    console.print(f"ok  {cluster_path}: {len(cluster.devices)} devices on {len(cluster.nodes)} nodes")

    console.print(Rule("3. show"))
    console.print(*renderables("cluster", cluster))
    console.print(*renderables("profile", profile))
