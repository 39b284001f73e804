"""``show`` and ``compare`` print each predicted time with its band, and ``--json`` rows carry it."""

from __future__ import annotations

from builders import make_cluster, make_profile
from rich.console import Console

from hetplan.contracts.model_profile import Timing
from hetplan.profile.trust import ESTIMATED, ESTIMATED_UNVALIDATED, IMPORTED
from hetplan.solve import PlanOptions, plan_training
from hetplan.solve.compare import compare_rows
from hetplan.views.plan import compare_table, plan_band, plan_summary_renderables, with_bands

A100, T4 = "A100-80GB", "T4"


def _inputs(source: str = "estimated"):
    profile = make_profile(6, per_block={A100: [(1.0, 2.0)] * 6, T4: [(4.0, 8.0)] * 6})  # fp32
    for block in profile.blocks:
        for name, points in block.times.items():
            block.times[name] = {m: Timing(t.fwd, t.bwd, source) for m, t in points.items()}
    cluster = make_cluster([("n0", [(A100, 2)]), ("n1", [(T4, 1)])], inter="10GB/s")
    return profile, cluster


def _text(renderables) -> str:
    console = Console(width=200, record=True)
    for r in renderables:
        console.print(r)
    return console.export_text()


def test_compare_rows_keep_their_keys_and_add_the_band() -> None:
    profile, cluster = _inputs()
    plan = plan_training(profile, cluster, PlanOptions(global_batch=8, optimizer="sgd")).plan
    rows = with_bands(compare_rows(plan, profile, cluster), plan, profile, cluster)
    assert rows[0]["name"] == "hetplan" and len(rows) > 1
    for row in rows:
        assert {"name", "iteration_s", "speedup", "band"} <= set(row)
        assert row["band"]["reference"] == "docs/estimates.md"
    # the plan's band covers the types it uses (T4 has no validation data); baselines', the cluster's
    uses_t4 = any(cluster.device(a).type.name == T4 for a in plan.all_devices())
    ours = ESTIMATED_UNVALIDATED if uses_t4 else ESTIMATED
    assert (rows[0]["band"]["low"], rows[0]["band"]["high"]) == ours
    assert (rows[1]["band"]["low"], rows[1]["band"]["high"]) == ESTIMATED_UNVALIDATED
    text = _text([compare_table(rows)])
    low, high = ours
    assert f"estimated times: x{1 + low:.2f} to x{1 + high:.2f}, docs/estimates.md" in text


def test_show_prints_the_band_next_to_the_predicted_time() -> None:
    profile, cluster = _inputs("imported")
    result = plan_training(profile, cluster, PlanOptions(global_batch=8, optimizer="sgd"))
    plan = result.plan
    plan.predicted = result.sim.predicted()
    band = plan_band(plan, profile, cluster)
    assert (band.low, band.high) == IMPORTED and band.sources == ("imported",)
    text = _text(plan_summary_renderables(plan, cluster, profile))
    line = next(x for x in text.splitlines() if x.startswith("predicted iteration"))
    assert "(imported times: x0.81 to x1.19, docs/estimates.md)" in line
    # without the profile at hand and no readable input paths, the time stands alone
    assert "docs/estimates.md" not in _text(plan_summary_renderables(plan, cluster))
