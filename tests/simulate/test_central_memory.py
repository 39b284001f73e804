"""WSP's parameter server priced as its own row (``simulate.central``): each term on exact inputs,
where the figures appear (the plan file's ``predicted.central``, ``simulate``, ``show``, ``report``),
and the modes without a server. Against a measured allocator peak:
tests/runtime/test_memory_terms.py::test_the_parameter_servers_memory_matches_the_run."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from builders import make_cluster, make_profile

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.runlog import RUNLOG_SCHEMA, central_record, load_central_records, load_run_log
from hetplan.errors import HetplanError
from hetplan.simulate import simulate
from hetplan.simulate.central import central_memory
from hetplan.views.report import report_rows
from hetplan.views.simulation import central_line

A100 = "A100-80GB"


def _profile():
    profile = make_profile(4, times={A100: (1.0, 2.0)}, params=1000, activation_bytes=1e3, output_bytes=1e3)
    # unequal blocks: the largest block (3000) and the largest device's share (1000 + 3000) differ
    profile.blocks[1] = replace(profile.blocks[1], params=3000, param_bytes=12000.0)
    return profile


def _plan(sync: str, optimizer: str = "adam", staleness: int = 0) -> Plan:
    pipelines = [
        Pipeline(2, (1, 1), (Stage(0, 2, (f"n1/{2 * k}",), (1.0,)), Stage(2, 4, (f"n1/{2 * k + 1}",), (1.0,))))
        for k in range(2)
    ]
    options = {"staleness": staleness, "wave": 1} if sync == "wsp" else {}
    return Plan(4, pipelines, optimizer=optimizer, sync=sync, sync_options=options)


def _cluster():
    return make_cluster([("n0", [(A100, 2)]), ("n1", [(A100, 4)])])


@pytest.mark.parametrize(
    ("optimizer", "staleness", "state", "temporaries"),
    [("adam", 0, 8, 2), ("adamw", 2, 8, 2), ("momentum", 1, 4, 0), ("sgd", 0, 0, 0)],
)
def test_each_term_on_exact_inputs(optimizer: str, staleness: int, state: int, temporaries: int) -> None:
    profile, cluster = _profile(), _cluster()
    use = central_memory(_plan("wsp", optimizer, staleness), profile, cluster, optimizer=optimizer)
    params = 1000 + 3000 + 1000 + 1000
    assert use is not None and use.node == "n1"  # the first node holding a device of the plan
    assert use.weights == 4 * params and use.optimizer == state * params
    assert use.open_clocks == staleness + 1 and use.clock_sums == (staleness + 1) * 4 * params
    message, step = 4 * (1000 + 3000), temporaries * 4 * 3000
    assert use.transient == max(message, step)
    assert use.tensor_bytes == use.weights + use.optimizer + use.clock_sums + use.transient


@pytest.mark.parametrize("sync", ["allreduce", "sdpipe", "adasum", "topk"])
def test_only_wsp_has_a_server_that_holds_tensors(sync: str) -> None:
    plan = _plan(sync)
    if sync == "topk":
        plan.sync_options = {"ratio": 0.01}
    assert central_memory(plan, _profile(), _cluster(), optimizer="adam") is None
    assert "central" not in simulate(plan, _profile(), _cluster()).predicted()


def test_the_row_reaches_the_plan_file_simulate_show_and_report(tmp_path) -> None:
    plan, profile, cluster = _plan("wsp"), _profile(), _cluster()
    sim = simulate(plan, profile, cluster)
    entry = sim.predicted()["central"]
    assert entry["tensor_bytes"] == round(sim.central.tensor_bytes) and entry["open_clocks"] == 1
    assert sim.to_json()["central"] == entry
    assert central_line(entry).startswith("wsp parameter server on n1 (host memory, no device)")
    assert central_line({"role": "wsp parameter server"}) == ""  # a hand-edited entry short of figures
    plan.predicted = sim.predicted()
    lines = [
        {"schema": RUNLOG_SCHEMA, "step": 0, "rank": r, "pipeline": r // 2, "stage": r % 2, "device": a}
        | {"iteration_s": 1.0, "compute_s": 0.5, "wait_s": 0.0, "comm_s": 0.0, "loss": 1.0}
        for r, a in enumerate(plan.all_devices())
    ]
    lines.append(central_record(4, "wsp", 1.1 * entry["tensor_bytes"]))
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    steps = load_run_log(log)  # the server's line is checked and left out of the steps
    assert len(steps) == 4
    rows = report_rows(steps, plan, central=load_central_records(log))["memory"]
    assert rows[-1]["device"] == "wsp parameter server (host)" and rows[-1]["error"] == pytest.approx(0.1)
    bad = dict(lines[-1], peak_memory_bytes=-1)
    log.write_text("".join(json.dumps(x) + "\n" for x in [*lines[:-1], bad]))
    with pytest.raises(HetplanError, match="peak_memory_bytes"):
        load_run_log(log)
