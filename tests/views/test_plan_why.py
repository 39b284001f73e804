"""``show`` renders the search's reasons for each stage's TP degree and recomputation and for ZeRO,
from the plan file's ``details`` (no search is run again), and TP stages by replica."""

from __future__ import annotations

import sys
from pathlib import Path

from builders import make_cluster
from rich.console import Console

from hetplan.contracts.plan import parse_plan
from hetplan.solve import PlanOptions, plan_training
from hetplan.solve.search import plan_details
from hetplan.views.plan import plan_summary_renderables

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "solve"))
from test_optimality import tp_profile

V100 = "V100-16GB"


def _text(renderables) -> str:
    console = Console(width=400, record=True)
    for r in renderables:
        console.print(r)
    return console.export_text()


def test_show_explains_tp_recompute_and_zero_from_the_file() -> None:
    per_block = {t: [(1.0, 2.0)] * 4 for t in ("A100-80GB", V100, "T4")}
    profile = tp_profile(
        per_block,
        n_blocks=4,
        params=500_000_000,  # 16 GB of fp32 weights and gradients: one V100 cannot hold them
        activation_bytes=0.0,
        output_bytes=0.0,
        tp_speedup=1.9,
        allreduce_bytes=1e6,
        pair=2.0,
    )
    cluster = make_cluster([("n0", [(V100, 2)])])
    result = plan_training(
        profile, cluster, PlanOptions(global_batch=2, optimizer="sgd", micro_batch_sizes=(1,), baselines=False)
    )
    plan = result.plan
    plan.predicted = result.sim.predicted()
    plan.details = plan_details(result, cluster)
    # what show reads: the file's mapping, parsed again
    reread = parse_plan({**plan.to_dict(), "inputs": {"profile": {"path": "p"}, "cluster": {"path": "c"}}})
    text = _text(plan_summary_renderables(reread, cluster))
    assert "Why each stage runs as it does" in text
    assert "TP 2: degree 1 does not fit V100-16GB (needs " in text
    assert "ZeRO-1 off: every block has one holder" in text
    assert "TP 2" in text.split("Why each stage")[0]  # the stage table marks the TP stage
