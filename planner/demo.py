"""The main job end to end on bundled defaults (``hetplan demo``): what the README's first command runs.

Steps, each writing a file a user can open, on this machine:

1. profile: measure the zoo GPT block by block here (torch, one thread: what each rank gets);
2. plan it for the bundled local cluster ``local-2`` (2 ranks, one a core: one at full speed, one emulated 3x slower);
3. simulate the plan and draw its timeline;
4. launch: train it for real, one process per device (gloo), each rank emulating its device type;
5. report: what the run measured beside what the plan predicted.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.rule import Rule

from hetplan.contracts.cluster import load_cluster
from hetplan.contracts.paths import bundled_profiles_dir
from hetplan.contracts.plan import load_plan, load_plan_inputs
from hetplan.contracts.runlog import load_run_log
from hetplan.contracts.yamlio import write_yaml
from hetplan.errors import HetplanError
from hetplan.simulate import simulate
from hetplan.simulate.timeline import write_timeline
from hetplan.solve import PlanOptions, finalize_plan, plan_training
from hetplan.views import plan_is_emulated, print_all
from hetplan.views.plan import compare_table, plan_summary_renderables
from hetplan.views.report import report_renderables, report_rows
from hetplan.views.simulation import simulation_renderables

__all__ = ["DEMO_CLUSTER", "DEMO_MODEL", "run_demo"]

DEMO_CLUSTER = "local-2.yaml"
DEMO_MODEL = {"family": "gpt", "config": {"layers": 4, "hidden": 128, "heads": 4, "seq": 64, "vocab": 512}}
DEMO_BATCH = 32
DEMO_STEPS = 12


def run_demo(out: Path, *, console: Console, steps: int = DEMO_STEPS) -> None:
    """Run every step into ``out`` and print what each produced."""
    try:
        import torch

        from hetplan.emit import build_rank_config
        from hetplan.profile.measure import measure_profile
        from hetplan.runtime.launcher import launch_local
    except ImportError:
        raise HetplanError(
            "the demo measures and trains a real model: install torch (pip install torch==2.13.0)", field="demo"
        ) from None
    out.mkdir(parents=True, exist_ok=True)
    cluster_path = bundled_profiles_dir() / "clusters" / DEMO_CLUSTER
    cluster = load_cluster(cluster_path)

    console.print(Rule("1. profile: measure the zoo GPT here, block by block (one thread, as each rank runs)"))
    torch.set_num_threads(1)
    profile = measure_profile(DEMO_MODEL, micro_batches=(1, 2, 4, 8), device="cpu", warmup=2, repeat=5)
    profile_path = out / "gpt.profile.yaml"
    profile.save(profile_path)
    console.print(
        f"wrote {profile_path}: {len(profile.blocks)} blocks, {profile.total_params:,} parameters, measured on this CPU"
    )

    console.print(Rule(f"2. plan for {cluster.name} (global batch {DEMO_BATCH}, 1F1B, Adam)"))
    result = plan_training(profile, cluster, PlanOptions(global_batch=DEMO_BATCH))
    plan_path = out / "plan.yaml"
    plan = finalize_plan(
        result,
        profile_path=profile_path,
        cluster_path=cluster_path,
        output=plan_path,
        cluster=cluster,
        dtype=profile.dtype,
    )
    plan.save(plan_path)
    print_all(console, plan_summary_renderables(plan, cluster, profile))
    console.print(f"wrote {plan_path}")

    console.print(Rule("3. simulate the plan, with a timeline"))
    reloaded = load_plan(plan_path)
    sim_profile, sim_cluster = load_plan_inputs(reloaded)
    sim = simulate(reloaded, sim_profile, sim_cluster, timeline=True)
    timeline_path = out / "timeline.svg"
    write_timeline(sim, timeline_path, title=f"demo plan on {cluster.name}")
    print_all(console, simulation_renderables(sim, emulated=plan_is_emulated(reloaded, cluster)))
    console.print(f"wrote {timeline_path}")

    console.print(Rule(f"4. launch: train it here for {steps} steps, one process per device (EMULATED speeds)"))
    config_path = out / "launch" / "rank-config.yaml"
    write_yaml(build_rank_config(reloaded, sim_profile, sim_cluster, backend="gloo"), config_path)
    log_path = out / "run.jsonl"
    run = launch_local(config_path, steps=steps, log=log_path, emulate=True)
    losses = [r["loss"] for r in run.records if r["rank"] == 0]
    console.print(
        f"trained {len(losses)} steps on {len(reloaded.all_devices())} ranks in {run.wall_s:.1f} s: "
        f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; run log {log_path}"
    )

    console.print(Rule("5. report: measured beside predicted"))
    print_all(console, report_renderables(report_rows(load_run_log(log_path), reloaded)))
    console.print(
        compare_table(
            [{"name": "hetplan", "iteration_s": plan.predicted["iteration_s"], "speedup": 1.0}]
            + [
                {"name": k, "iteration_s": v.get("iteration_s"), "speedup": v.get("plan_speedup")}
                for k, v in plan.baselines.items()
            ]
        )
    )
