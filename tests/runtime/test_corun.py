"""Two jobs co-run on the same devices (crossover scheduling): each trains as it would alone, the
device's turn is exclusive, and a failure in one job stops both with one line each.

Real jobs: gloo on this CPU, the bundled emulated ``local-2`` cluster (``local/1`` 3x slower), job
``a`` a two-stage GPT pipeline (Adam), job ``b`` an MLP trained data-parallel on both devices (SGD).
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import re
import shutil
import statistics
import time
from pathlib import Path

import pytest
from builders import zoo_profile

from hetplan.contracts.cluster import load_cluster, parse_cluster
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.rank_config import Crossover, load_rank_config
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.emit.rank_config import DEFAULT_LR
from hetplan.errors import HetplanError
from hetplan.local_job import CoRun, TrainingOptions, train_here, train_together
from hetplan.runtime.processes.crossover import DeviceTurn
from hetplan.runtime.reference import train_reference

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = load_cluster(ROOT / "profiles" / "clusters" / "local-2.yaml")
GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}}
MLP = {"family": "mlp", "config": {"layers": 3, "width": 64, "input": 32, "classes": 10}}
PIPE = Plan(
    global_batch=8,
    pipelines=[Pipeline(8, (4, 4), (Stage(0, 3, ("local/0",), (1.0,)), Stage(3, 6, ("local/1",), (1.0,))))],
    optimizer="adam",
)
N_MLP = len(zoo_profile(MLP).blocks)
DP = Plan(
    global_batch=8,
    pipelines=[
        Pipeline(4, (2, 2), (Stage(0, N_MLP, ("local/0",), (1.0,)),)),
        Pipeline(4, (2, 2), (Stage(0, N_MLP, ("local/1",), (1.0,)),)),
    ],
    optimizer="sgd",
)
JOBS = [(PIPE, zoo_profile(GPT), CLUSTER), (DP, zoo_profile(MLP), CLUSTER)]
OPTIONS = TrainingOptions(seed=5)
STEPS = 3


@pytest.fixture(scope="module")
def corun() -> CoRun:
    return train_together(JOBS, steps=STEPS, options=OPTIONS, emulate=True)


def _losses(records: list[dict]) -> dict[tuple[int, int], float]:
    return {(r["step"], r["rank"]): r["loss"] for r in records if r["loss"] is not None}


def test_each_job_of_a_corun_trains_exactly_as_alone(corun: CoRun) -> None:
    # job a against its solo run (hetplan launch of the plan alone) ...
    plan, profile, cluster = JOBS[0]
    alone = _losses(train_here(plan, profile, cluster, steps=STEPS, options=OPTIONS, emulate=True).records)
    co = _losses(corun.jobs[0].records)
    assert sorted(co) == sorted(alone) and len({s for s, _ in co}) == STEPS
    for key, loss in alone.items():
        assert co[key] == pytest.approx(loss, abs=1e-5), key
    # ... and both jobs against the one-process reference, which a solo run equals within 1e-5
    # (tests/runtime/test_runtime.py); a second solo launch would add 10-20 s on this machine
    for (plan, profile, _), job in zip(JOBS, corun.jobs, strict=True):
        lr = DEFAULT_LR[plan.optimizer]
        expected, _ = train_reference(
            profile.model, global_batch=plan.global_batch, optimizer=plan.optimizer, lr=lr, seed=5, steps=STEPS
        )
        co = _losses(job.records)
        for (step, _rank), loss in co.items():
            assert loss == pytest.approx(expected[step], abs=1e-5), (step, _rank)
    # the two jobs are different models: their losses differ (the comparisons above are not vacuous)
    assert _losses(corun.jobs[0].records)[(0, 1)] != pytest.approx(_losses(corun.jobs[1].records)[(0, 0)])


def _clashes(rows: list[tuple[str, float, float]]) -> list[tuple]:
    """Pairs of held intervals of different jobs that overlap in time."""
    return [
        (x, y) for i, x in enumerate(rows) for y in rows[i + 1 :] if x[0] != y[0] and max(x[1], y[1]) < min(x[2], y[2])
    ]


def test_the_clash_check_finds_an_overlap() -> None:
    assert _clashes([("a", 0.0, 1.0), ("b", 0.5, 1.5)]) and not _clashes([("a", 0.0, 1.0), ("b", 1.0, 1.5)])


def test_a_device_turn_is_held_by_one_job_at_a_time_and_covers_its_compute(corun: CoRun) -> None:
    assert sorted(corun.turns) == ["local/0", "local/1"]
    for device, rows in corun.turns.items():
        assert not _clashes(rows), device
        # both jobs used the device during the same stretch of time, taking turns at it
        spans = {j: (min(r[1] for r in rows if r[0] == j), max(r[2] for r in rows if r[0] == j)) for j in "ab"}
        assert max(s[0] for s in spans.values()) < min(s[1] for s in spans.values()), spans
        switches = sum(1 for x, y in itertools.pairwise(rows) if x[0] != y[0])
        assert switches >= 2, [r[0] for r in rows]
        # every forward and backward (compute_s, emulation sleep included) ran inside the job's turn
        for name, job in zip("ab", corun.jobs, strict=True):
            held = sum(b - a for j, a, b in rows if j == name)
            computed = sum(r["compute_s"] for r in job.records if r["device"] == device)
            assert computed > 0 and held >= computed - 1e-4, (device, name, held, computed)
    assert "together:" in corun.summary and "local/1 a " in corun.summary


def _hog(turns: str, started, stop) -> None:
    """Compute for 20 ms at a time, asking for the turn again at once, until told to stop."""
    turn = DeviceTurn(Crossover(turns=turns, job="hog"), "n0/0")
    while not stop.is_set():
        turn.acquire()
        started.set()
        time.sleep(0.02)
        turn.release()
    turn.close()


def test_a_rank_that_lets_go_does_not_take_the_turn_straight_back(tmp_path) -> None:
    # a rank of another job that asks while the device is busy gets it after the current compute, not
    # after however many the holder would take back (flock alone favours the rank that lets go)
    ctx = multiprocessing.get_context("fork")
    started, stop = ctx.Event(), ctx.Event()
    hog = ctx.Process(target=_hog, args=(str(tmp_path), started, stop))
    hog.start()
    try:
        assert started.wait(30)
        turn = DeviceTurn(Crossover(turns=str(tmp_path), job="other"), "n0/0")
        waits = []
        for _ in range(20):
            waits.append(turn.acquire())
            turn.release()
            time.sleep(0.002)  # let the hog take it again
        turn.close()
    finally:
        stop.set()
        hog.join(10)
    # asking 2 ms into the hog's compute, each wait is the rest of that one compute, 18 ms (without the
    # queue: 38 ms, the hog took the device back once more as a rule); the median, for scheduling noise
    assert statistics.median(waits) < 0.02 + 0.005, waits


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_a_killed_rank_in_one_job_stops_both_with_one_line_each() -> None:
    start = time.time()
    with pytest.raises(HetplanError) as info:
        train_together(JOBS, steps=100_000, options=OPTIONS, emulate=True, kill_rank_after=(0, 1, 1.0), stall_s=60)
    lines = str(info.value).splitlines()
    assert time.time() - start < 90
    assert len(lines) == 2, lines
    assert lines[0].startswith("job a: the run stopped: rank 1 (local/1) died (SIGKILL)"), lines[0]
    assert re.match(r"job b: stopped after \d+ of 100000 steps because job a failed \(rank logs: .+\)$", lines[1])
    # no process of either job remains; both run folders were kept (the messages name them)
    for line in lines:
        folder = Path(re.search(r"\(rank logs: ([^)]+)\)$", line).group(1))
        pids = [json.loads(p.read_text())["pid"] for p in (folder / "ranks").glob("rank-*.json")]
        assert len(pids) == 2 and not [p for p in pids if _alive(p)], (folder, pids)
        shutil.rmtree(folder)


def test_plans_on_different_devices_at_one_address_are_refused() -> None:
    other = parse_cluster(
        {
            "schema": "hetplan/cluster/v1",
            "name": "other",
            "nodes": [
                {
                    "name": "local",
                    "devices": [{"type": "cpu", "count": 2}],
                    "link": {"bandwidth": "1GB/s", "latency": "1us"},
                }
            ],
            "network": {"bandwidth": "1GB/s", "latency": "1us"},
        },
        file="other.yaml",
    )
    words = r"devices: device local/0 is a cpu-fast \(slowdown 1\) in job a's cluster and a cpu \(slowdown 1\) in job b"
    with pytest.raises(HetplanError, match=words):
        train_together([JOBS[0], (DP, zoo_profile(MLP), other)], steps=1, options=OPTIONS)


def test_tensor_parallel_stages_are_refused_before_anything_starts() -> None:
    tp = Plan(global_batch=8, pipelines=[Pipeline(8, (4, 4), (Stage(0, 6, ("local/0", "local/1"), (1.0,), 2),))])
    with pytest.raises(HetplanError, match=r"pipelines\[0\]\.stages\[0\]\.tensor_parallel: co-running a tensor"):
        train_together([JOBS[0], (tp, zoo_profile(GPT), CLUSTER)], steps=1, options=OPTIONS)


@pytest.mark.parametrize(
    ("crossover", "words"),
    [
        ({"turns": "t", "job": "a/b"}, r"crossover\.job: expected letters, digits"),
        ({"turns": "t", "job": "a", "ranks": 0}, r"crossover\.ranks: expected an integer >= 1"),
        ({"turns": "t", "job": "a", "turn": 1}, r"crossover\.turn: unknown field"),
        ({"job": "a"}, r"crossover\.turns: missing required field"),
    ],
)
def test_a_bad_crossover_section_is_one_line_naming_file_and_field(tmp_path, crossover: dict, words: str) -> None:
    config = build_rank_config(PIPE, zoo_profile(GPT), CLUSTER)
    config["crossover"] = crossover
    write_yaml(config, tmp_path / "rc.yaml")
    with pytest.raises(HetplanError, match=rf"^{re.escape(str(tmp_path / 'rc.yaml'))}: {words}"):
        load_rank_config(tmp_path / "rc.yaml")


def test_the_crossover_section_reads_back_with_its_folder_relative_to_the_file(tmp_path) -> None:
    config = build_rank_config(PIPE, zoo_profile(GPT), CLUSTER)
    assert load_rank_config(_written(tmp_path, config)).crossover is None
    config["crossover"] = {"turns": "turns", "job": "job-1", "ranks": 4}
    read = load_rank_config(_written(tmp_path, config)).crossover
    assert (read.turns, read.job, read.ranks) == (str(tmp_path / "turns"), "job-1", 4)


def _written(tmp_path: Path, config: dict) -> Path:
    write_yaml(config, tmp_path / "rc.yaml")
    return tmp_path / "rc.yaml"
