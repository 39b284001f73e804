"""The Chrome trace: valid for Perfetto's JSON importer, one event per task (all-reduces on every
member), times equal to the simulation's, rows named and grouped by node, written by the CLI."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from builders import make_cluster, make_profile

from hetplan.cli import main
from hetplan.contracts.cluster import load_cluster
from hetplan.contracts.paths import bundled_profiles_dir
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.schedule.compile import compile_plan
from hetplan.simulate import simulate
from hetplan.simulate.costs import CostModel
from hetplan.simulate.simulator import TaskInfo, _build
from hetplan.simulate.trace import CATEGORIES, chrome_trace, parse_label, write_trace

A100, V100 = "A100-80GB", "V100-16GB"

# The Trace Event Format (Google's "Trace Event Format" document, the JSON Object Format and the
# Complete and Metadata events) as Perfetto's JSON importer reads it
# (src/trace_processor/importers/json): required keys and their JSON types per phase.
NUMBER = (int, float)
REQUIRED = {
    "X": {"name": str, "cat": str, "ph": str, "ts": NUMBER, "dur": NUMBER, "pid": int, "tid": int, "args": dict},
    "M": {"name": str, "ph": str, "pid": int, "tid": int, "args": dict},
}
METADATA_ARGS = {"process_name": ("name", str), "thread_name": ("name", str)}
METADATA_ARGS |= {"process_sort_index": ("sort_index", int), "thread_sort_index": ("sort_index", int)}
TOP_LEVEL = {"traceEvents", "otherData"}  # Perfetto stops reading at a top-level key it does not know


def _inputs():
    profile = make_profile(4, times={A100: (0.01, 0.02), V100: (0.02, 0.04)}, params=1_000_000, output_bytes=1e6)
    cluster = make_cluster([("n0", [(A100, 3)]), ("n1", [(V100, 2)])], inter="10GB/s", inter_latency="10us")
    plan = Plan(
        global_batch=12,
        pipelines=[  # a replicated last stage: two transfers out of n0/0 at once (overlapping rows)
            Pipeline(6, (2, 2, 2), (Stage(0, 2, ("n0/0",), (1.0,)), Stage(2, 4, ("n1/0", "n0/2"), (0.5, 0.5)))),
            Pipeline(6, (2, 2, 2), (Stage(0, 2, ("n1/1",), (1.0,)), Stage(2, 4, ("n0/1",), (1.0,)))),
        ],
        optimizer="adam",
    )
    return plan, profile, cluster


def _engine(plan, profile, cluster):
    """The simulator's own task graph, run: the independent count and times a trace must match."""
    compiled = compile_plan(plan, len(profile.blocks))
    engine, _, capacity = _build(compiled, CostModel(profile, cluster, optimizer=plan.optimizer), cluster)
    engine.run(capacity)
    return engine, compiled


def _x(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_every_event_has_the_keys_and_types_perfetto_needs(tmp_path: Path) -> None:
    plan, profile, cluster = _inputs()
    write_trace(simulate(plan, profile, cluster, timeline=True), tmp_path / "t.json", cluster=cluster)
    text = (tmp_path / "t.json").read_text(encoding="utf-8")
    trace = json.loads(text)
    assert set(trace) == TOP_LEVEL and next(iter(trace)) == "traceEvents"
    assert "displayTimeUnit" not in text  # Perfetto would read ts in that unit
    assert "\\u" not in text  # Perfetto's tokenizer cannot read \uXXXX escapes
    for event in trace["traceEvents"]:
        schema = REQUIRED[event["ph"]]
        for key, kind in schema.items():
            assert isinstance(event[key], kind) and not isinstance(event[key], bool), (key, event)
        assert not any(isinstance(v, list) for v in event.values()), event  # lists only inside args
        assert event["pid"] >= 1 and event["tid"] >= 1
        if event["ph"] == "X":
            assert event["dur"] >= 0 and event["ts"] >= 0 and event["cat"] in CATEGORIES.values()
        else:
            key, kind = METADATA_ARGS[event["name"]]
            assert isinstance(event["args"][key], kind)
    tids = {(e["pid"], e["tid"]) for e in trace["traceEvents"]}
    assert len({tid for _, tid in tids}) == len(tids)  # a thread id belongs to one process only


def test_one_event_per_task_and_an_all_reduce_on_every_member() -> None:
    plan, profile, cluster = _inputs()
    result = simulate(plan, profile, cluster, timeline=True)
    engine, compiled = _engine(plan, profile, cluster)
    events = _x(chrome_trace(result, cluster=cluster))
    kinds = Counter(info.kind for info in engine.meta)
    assert set(kinds) == set(CATEGORIES)  # the fixture has every kind of task
    members = {g.id: set(g.devices) for g in compiled.groups if len(g.devices) > 1}
    expected = Counter({CATEGORIES[k]: n for k, n in kinds.items() if k != "allreduce"})
    expected["allreduce"] = sum(len(members[info.group]) for info in engine.meta if info.kind == "allreduce")
    assert Counter(e["cat"] for e in events) == expected
    assert {e["args"]["task"] for e in events} == set(range(len(engine))) == set(range(result.n_tasks))
    for t, info in enumerate(engine.meta):
        rows = sorted(e["args"]["device"] for e in events if e["args"]["task"] == t)
        if info.kind == "allreduce":
            assert rows == sorted(members[info.group])
        else:
            assert rows == [info.device]  # compute on its device, a transfer on its sender


def test_times_are_the_simulated_ones() -> None:
    plan, profile, cluster = _inputs()
    result = simulate(plan, profile, cluster, timeline=True)
    engine, _ = _engine(plan, profile, cluster)
    for e in _x(chrome_trace(result, cluster=cluster)):
        t = e["args"]["task"]
        assert e["ts"] == pytest.approx(engine.start[t] * 1e6, abs=1e-3)  # microseconds, to the nanosecond
        assert e["ts"] + e["dur"] == pytest.approx(engine.end[t] * 1e6, abs=1.5e-3)
    assert max(e["ts"] + e["dur"] for e in _x(chrome_trace(result))) == pytest.approx(result.iteration_s * 1e6)


def test_each_row_nests_and_each_device_is_a_named_row_of_its_node() -> None:
    plan, profile, cluster = _inputs()
    trace = chrome_trace(simulate(plan, profile, cluster, timeline=True), cluster=cluster)
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in _x(trace):
        by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():  # complete events on one thread must nest: here, never overlap
        spans.sort()
        assert all(a[1] <= b[0] + 1e-9 for a, b in itertools.pairwise(spans))
    assert any(len(s) > 1 for s in by_thread.values())
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert sorted(processes.values()) == ["n0", "n1"]
    for address in plan.all_devices():
        compute = [
            (pid, name) for (pid, _), name in threads.items() if name.startswith(f"{address} ") and "comm" not in name
        ]
        assert len(compute) == 1 and processes[compute[0][0]] == address.split("/")[0]
        assert cluster.device(address).type.name in compute[0][1]
    assert set(by_thread) <= set(threads)  # every event is on a named row
    assert any("comm 2" in name for name in threads.values())  # overlapping sends got a second row


def test_the_trace_is_deterministic(tmp_path: Path) -> None:
    plan, profile, cluster = _inputs()
    write_trace(simulate(plan, profile, cluster, timeline=True), tmp_path / "a.json", cluster=cluster, title="t")
    write_trace(simulate(plan, profile, cluster, timeline=True), tmp_path / "b.json", cluster=cluster, title="t")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


@pytest.mark.parametrize(
    "info",
    [
        TaskInfo("F", "n0/0", 1, 2, 7),
        TaskInfo("B", "n0/0", 1, 2, 7),
        TaskInfo("send", "n0/0", 1, 2, 7, peer="n1/3"),
        TaskInfo("allreduce", "n0/0", -1, -1, group=4),
        TaskInfo("step", "n0/0", 1, 2),
    ],
    ids=lambda i: i.kind,
)
def test_task_descriptions_are_read_back(info: TaskInfo) -> None:
    fields = parse_label(info.kind, str(info))
    expected = {
        "F": {"micro_batch": 7, "pipeline": 1, "stage": 2},
        "B": {"micro_batch": 7, "pipeline": 1, "stage": 2},
        "send": {"micro_batch": 7, "peer": "n1/3"},
        "allreduce": {"group": 4},
        "step": {"pipeline": 1, "stage": 2},
    }[info.kind]
    assert fields == expected
    assert parse_label("F", "something else") == {}


def _emulated_plan_file(tmp_path: Path) -> Path:
    """A plan on the bundled local-2 cluster (one device emulated 3x slower), with its files."""
    profile = make_profile(4, times={"cpu": (0.001, 0.002)}, params=1000, output_bytes=1000)
    profile.save(tmp_path / "profile.yaml")
    cluster = bundled_profiles_dir() / "clusters" / "local-2.yaml"
    plan = {
        "schema": "hetplan/plan/v1",
        "inputs": {"profile": {"path": "profile.yaml"}, "cluster": {"path": str(cluster)}},
        "global_batch": 4,
        "pipelines": [
            {
                "batch": 4,
                "micro_batches": [2, 2],
                "stages": [{"blocks": [0, 2], "devices": ["local/0"]}, {"blocks": [2, 4], "devices": ["local/1"]}],
            }
        ],
    }
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    return tmp_path / "plan.yaml"


def test_the_cli_writes_the_trace_with_emulated_devices_labelled(tmp_path: Path, capsys) -> None:
    plan_file = _emulated_plan_file(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["simulate", str(plan_file), "--trace", str(tmp_path / "out" / "plan.trace.json")])
    assert info.value.code == 0, capsys.readouterr().err
    assert "plan.trace.json" in capsys.readouterr().out
    trace = json.loads((tmp_path / "out" / "plan.trace.json").read_text(encoding="utf-8"))
    from hetplan.contracts.plan import load_plan, load_plan_inputs

    plan = load_plan(plan_file)
    profile, cluster = load_plan_inputs(plan)
    assert load_cluster(cluster.file).name == "local-2"
    result = simulate(plan, profile, cluster, timeline=True)
    assert len(_x(trace)) == len(result.timeline)
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] in ("thread_name", "process_name")]
    assert any("local/1 cpu-slow (emulated: cpu 3x slower)" in n for n in names)
    assert "EMULATED" in " ".join(names) and "emulated" in trace["otherData"]


def test_a_trace_that_is_not_json_fails_before_simulating(tmp_path: Path, capsys) -> None:
    plan_file = _emulated_plan_file(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["simulate", str(plan_file), "--trace", str(tmp_path / "t.txt")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: --trace: a Chrome trace is a .json file")
    assert not (tmp_path / "t.txt").exists()
