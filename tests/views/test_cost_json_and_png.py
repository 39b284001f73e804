"""Issue 25's last pieces: $/step and $/sample in ``show --json`` and ``compare --json`` where the
cluster is priced (the same figures the tables print), and the Pareto front as a PNG with the
optional matplotlib (same bytes for the same summary)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import run_cli, write_what_if_inputs

from hetplan.views.cost import step_cost, with_costs


@pytest.fixture
def what_if_out(tmp_path: Path, capsys) -> Path:
    """A priced what-if run's folder: plan.yaml (on a V100 node at the catalog's $2.80/h) and
    summary.json."""
    files = write_what_if_inputs(tmp_path)
    out = tmp_path / "wi"
    argv = ["what-if", str(files["profile"]), str(files["cluster"]), "--pool", str(files["pool"])]
    argv += ["--batch", "8", "--micro-batch-sizes", "1,2", "--no-marginals", "-o", str(out)]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    return out


def test_show_json_of_a_priced_plan_carries_its_cost(what_if_out: Path, capsys) -> None:
    summary = json.loads((what_if_out / "summary.json").read_text())
    code, out, err = run_cli(["show", "--json", str(what_if_out / "plan.yaml")], capsys)
    assert code == 0, err
    cost = json.loads(out)["cost"]
    chosen = summary["chosen"]
    assert cost["usd_per_hour"] == pytest.approx(chosen["usd_per_hour"])
    assert cost["usd_per_step"] == pytest.approx(chosen["usd_per_step"])
    assert cost["usd_per_sample"] == pytest.approx(chosen["usd_per_step"] / 8)


def test_compare_json_rows_carry_cost_per_step_and_sample(what_if_out: Path, capsys) -> None:
    code, out, err = run_cli(["compare", "--json", str(what_if_out / "plan.yaml")], capsys)
    assert code == 0, err
    rows = json.loads(out)
    price = json.loads((what_if_out / "summary.json").read_text())["chosen"]["usd_per_hour"]
    timed = [r for r in rows if r["iteration_s"] is not None]
    assert timed
    for r in timed:
        assert r["usd_per_step"] == pytest.approx(price * r["iteration_s"] / 3600)
        assert r["usd_per_sample"] == pytest.approx(r["usd_per_step"] / (r.get("global_batch") or 8))


def test_unpriced_or_untimed_plans_have_no_cost_rather_than_zero() -> None:
    assert step_cost(1.0, 8, None) == {"usd_per_hour": None, "usd_per_step": None, "usd_per_sample": None}
    assert step_cost(None, 8, 3.6)["usd_per_step"] is None
    assert step_cost(2.0, 8, 3.6) == pytest.approx(
        {"usd_per_hour": 3.6, "usd_per_step": 0.002, "usd_per_sample": 0.00025}
    )
    [row] = with_costs([{"name": "x", "iteration_s": 1.0, "global_batch": 4}], 8, 36.0)
    assert row["usd_per_sample"] == pytest.approx(0.01 / 4)  # its own global batch


def test_pareto_front_as_png(what_if_out: Path) -> None:
    pytest.importorskip("matplotlib", reason="the PNG Pareto front needs the optional matplotlib ('.[png]')")
    from matplotlib.image import imread

    from hetplan.views.whatif import pareto_png

    summary = json.loads((what_if_out / "summary.json").read_text())
    first, second = pareto_png(summary), pareto_png(summary)
    assert first[:8] == b"\x89PNG\r\n\x1a\n" and first == second
    (what_if_out / "front.png").write_bytes(first)
    pixels = imread(what_if_out / "front.png")
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert (pixels[..., 0] > pixels[..., 1] + 0.3).any()  # the front is drawn in red
