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
from planner.contracts.plan import load_plan, load_plan_inputs
from planner.profile.analytic import analytic_profile
from planner.simulate import simulate
from planner.simulate.timeline import write_timeline
from planner.solve import PlanOptions, finalize_plan, plan_training
from planner.views import plan_is_emulated, print_all
from planner.views.contracts import renderables
from planner.views.plan import plan_summary_renderables
from planner.views.simulation import simulation_renderables

__all__ = ["DEMO_CLUSTER", "DEMO_MODEL", "run_demo"]

DEMO_CLUSTER = "mixed-small.yaml"
DEMO_MODEL = {"layers": 8, "hidden": 1024, "heads": 16, "seq": 512, "vocab": 32000}
DEMO_BATCH = 256


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

    print_all(console, renderables("cluster", cluster))

    console.print(Rule(f"3. plan (global batch {DEMO_BATCH}, 1F1B, Adam)"))
    result = plan_training(profile, cluster, PlanOptions(global_batch=DEMO_BATCH))
    plan_path = out / "plan.yaml"
    plan = finalize_plan(result, profile_path=profile_path, cluster_path=cluster_path, output=plan_path,
                         cluster=cluster, dtype=profile.dtype)
    plan.save(plan_path)
    print_all(console, plan_summary_renderables(plan, cluster))
    console.print(f"wrote {plan_path}")

    console.print(Rule("4. simulate the plan, with a timeline"))
    reloaded = load_plan(plan_path)
    sim_profile, sim_cluster = load_plan_inputs(reloaded)
    sim = simulate(reloaded, sim_profile, sim_cluster, timeline=True)
    timeline_path = out / "timeline.svg"
    write_timeline(sim, timeline_path, title=f"demo plan on {cluster.name}")
    print_all(console, simulation_renderables(sim, emulated=plan_is_emulated(reloaded, cluster)))
    console.print(f"wrote {timeline_path}")
    console.print(Rule("not built yet: emit, launch and report (the runtime)"))
