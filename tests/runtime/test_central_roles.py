"""The sync modes' central roles over gloo, all in one spawn of five processes (four workers and the
central one): the WSP parameter server (staleness 0 is synchronous training exactly; with a bound D
no worker starts a wave with weights missing more than D waves of updates) and SDPipe's group
scheduler (every device of a pipeline learns the same group, each ready step is grouped once)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from spawn_ranks import spawn_ranks

from hetplan.runtime.optim import make_optimizer
from hetplan.runtime.sync.group_scheduler import GroupClient, GroupScheduler
from hetplan.runtime.sync.param_server import ParamServer, PsClient
from hetplan.runtime.sync.wave_sync import GroupAverage, WaveSync

SHAPES = {"a": (4,), "b": (3,)}
WAVES = 5


def _grad(rank: int, clock: int, weights: torch.Tensor) -> torch.Tensor:
    """A gradient that depends on the weights the worker holds (so stale weights would show)."""
    return weights * (rank + 1) + 0.1 * (clock + 1) - 0.05 * rank


#: (staleness, optimizer, the worker that sleeps each wave): every scenario in one spawn of 3 processes
SCENARIOS = [(0, "sgd", -1), (0, "adam", -1), (1, "adam", 1)]


WORKERS = 4  # ranks 0-3; rank 4 is the central process
#: the scheduler's pipelines (device ranks) and the per-step sleep of each pipeline (pipeline 2 lags)
PIPELINES = {0: [0], 1: [1], 2: [2, 3]}
SLEEP = {0: 0.0, 1: 0.0, 2: 0.2}
SCHEDULER_STEPS = 4


def _run(rank: int, world: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        for i, (staleness, optimizer, slow) in enumerate(SCENARIOS):
            _ps_scenario(rank, world, Path(out) / f"server-{i}.pt", staleness, optimizer, slow)
            dist.barrier()  # a server serves one scenario: none of the next one's messages may reach it
        _scheduler_scenario(rank, world, Path(out))
        dist.barrier()
        _wave_scenario(rank, world, Path(out))
        dist.barrier()
        _average_scenario(rank, world, Path(out))
    finally:
        dist.destroy_process_group()


def _scheduler_scenario(rank: int, world: int, out: Path) -> None:
    central = world - 1
    if rank == central:
        scheduler = GroupScheduler(PIPELINES, group_size=2)
        scheduler.serve()
        torch.save(scheduler.log.groups, out / "groups.pt")
        return
    pipeline = next(p for p, ranks in PIPELINES.items() if rank in ranks)
    client = GroupClient(central, pipeline=pipeline, rank=rank, n_pipelines=len(PIPELINES))
    got = []
    for step in range(SCHEDULER_STEPS):
        time.sleep(SLEEP[pipeline])
        got.append(client.ready(step))
    client.stop()
    torch.save(got, out / f"groups-{rank}.pt")


WAVE, WAVE_STEPS = 2, 4
LOCAL_LR, TO_MEAN = 0.1, 2.0  # the workers' local SGD step and their batch share's inverse
AVERAGE_BATCHES = {0: 1, 1: 3, 2: 2, 3: 2}
AVERAGE_STEPS = 3


def _wave_scenario(rank: int, world: int, out: Path) -> None:
    """WaveSync (wave 2, staleness 0, SGD) on two workers: the server's weights at the end, and per
    step each worker's weights before, its gradient there, and what WaveSync gave back."""
    central = world - 1
    numel = sum(torch.Size(s).numel() for s in SHAPES.values())
    if rank == central:
        torch.manual_seed(0)
        params = {n: torch.nn.Parameter(torch.randn(s)) for n, s in SHAPES.items()}
        opt = make_optimizer("sgd", list(params.values()), lr=0.05)
        ps = ParamServer(params, {r: list(SHAPES) for r in range(2)}, optimizer=opt)
        ps.serve()
        torch.save(torch.cat([p.detach().flatten() for p in params.values()]), out / "wave.pt")
        return
    if rank >= 2:
        return
    sync = WaveSync(PsClient(central, numel, rank=rank), wave=WAVE, staleness=0)
    weights = sync.start()
    steps = []
    for step in range(WAVE_STEPS):
        grad = _grad(rank, step, weights)
        got = sync.after_step(step, weights, grad, lr=LOCAL_LR, to_mean=TO_MEAN)
        steps.append((weights, grad, got.weights, got.pulled))
        weights = got.weights
    sync.stop()
    torch.save({"log": sync.log, "steps": steps}, out / f"wave-log-{rank}.pt")


def _average_scenario(rank: int, world: int, out: Path) -> None:
    """GroupAverage on four one-device pipelines: inputs and outputs of every step."""
    central = world - 1
    pipelines = {p: [p] for p in range(WORKERS)}
    if rank == central:
        scheduler = GroupScheduler(pipelines, group_size=2)
        scheduler.serve()
        torch.save(scheduler.log.groups, out / "average-groups.pt")
        return
    client = GroupClient(central, pipeline=rank, rank=rank, n_pipelines=WORKERS)
    avg = GroupAverage(client, pipeline=rank, peers={q: q for q in range(WORKERS)}, batches=AVERAGE_BATCHES)
    weights = torch.full((5,), float(rank + 1)) + torch.arange(5.0)
    record = []
    for step in range(AVERAGE_STEPS):
        new = avg.after_step(step, weights)
        record.append((avg.log[-1], weights.clone(), new.clone()))
        weights = new * 1.5 + rank  # each pipeline's local step makes them differ again
    avg.stop()
    torch.save(record, out / f"average-{rank}.pt")


def _ps_scenario(rank: int, world: int, out: Path, staleness: int, optimizer: str, slow: int) -> None:
    if rank >= 2 and rank != world - 1:
        return  # the parameter-server scenarios use two workers
    server = world - 1
    numel = sum(torch.Size(s).numel() for s in SHAPES.values())
    if rank == server:
        torch.manual_seed(0)
        params = {n: torch.nn.Parameter(torch.randn(s)) for n, s in SHAPES.items()}
        ps = ParamServer(
            params,
            {r: list(SHAPES) for r in range(2)},
            optimizer=make_optimizer(optimizer, list(params.values()), lr=0.05),
        )
        ps.serve()
        weights = torch.cat([p.detach().flatten() for p in params.values()])
        torch.save({"weights": weights, "pulls": ps.log.pulls, "steps": ps.log.steps}, out)
        return
    client = PsClient(server, numel, rank=rank)
    weights = client.pull(0).flat
    for clock in range(WAVES):
        if rank == slow:
            time.sleep(0.15)
        client.push(clock, _grad(rank, clock, weights))
        weights = client.pull(clock + 1 - staleness).flat
    client.stop()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Four workers and the central process, every scenario, in one spawn (start-up dominates)."""
    tmp = tmp_path_factory.mktemp("ps")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    spawn_ranks(_run, args=(WORKERS + 1, f"file://{tmp / 'store'}", str(tmp)), nprocs=WORKERS + 1)
    out = [torch.load(tmp / f"server-{i}.pt") for i in range(len(SCENARIOS))]
    out.append({"log": torch.load(tmp / "groups.pt"), **{r: torch.load(tmp / f"groups-{r}.pt") for r in range(4)}})
    out.append({"weights": torch.load(tmp / "wave.pt"), **{r: torch.load(tmp / f"wave-log-{r}.pt") for r in range(2)}})
    out.append(
        {
            "log": torch.load(tmp / "average-groups.pt"),
            **{r: torch.load(tmp / f"average-{r}.pt") for r in range(WORKERS)},
        }
    )
    return out


@pytest.mark.parametrize(("index", "optimizer"), [(0, "sgd"), (1, "adam")])
def test_staleness_zero_is_synchronous_training(results: list[dict], index: int, optimizer: str) -> None:
    assert SCENARIOS[index][:2] == (0, optimizer)
    result = results[index]
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES.values()]
    opt = make_optimizer(optimizer, params, lr=0.05)
    for clock in range(WAVES):
        weights = torch.cat([p.detach().flatten() for p in params])
        total = sum(_grad(r, clock, weights) for r in range(2))
        offset = 0
        for p in params:
            p.grad = total[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        opt.step()
    expect = torch.cat([p.detach().flatten() for p in params])
    assert result["steps"] == list(range(WAVES))
    assert torch.allclose(result["weights"], expect, atol=1e-6, rtol=0)


def test_no_worker_runs_more_than_d_waves_ahead(results: list[dict]) -> None:
    staleness, _, _ = SCENARIOS[2]
    result = results[2]
    ahead = []
    for _rank, asked, given, latest in result["pulls"]:
        assert given >= asked  # never answered below the bound
        if latest >= 0:  # the pull after pushing clock ``latest``: the next wave is latest + 1
            ahead.append(latest + 1 - given)
    assert max(ahead) <= staleness
    assert max(ahead) == staleness  # the fast worker did use its slack (the slow one sleeps each wave)


def test_every_device_of_a_pipeline_learns_the_same_groups(results: list[dict]) -> None:
    sched = results[len(SCENARIOS)]
    for ranks in PIPELINES.values():
        assert all(sched[r] == sched[ranks[0]] for r in ranks)
    for p, ranks in PIPELINES.items():
        assert len(sched[ranks[0]]) == SCHEDULER_STEPS and all(p in g for g in sched[ranks[0]])


def test_each_ready_step_is_grouped_once_in_step_order(results: list[dict]) -> None:
    log = results[len(SCENARIOS)]["log"]
    seen = [(p, s) for group, steps in log for p, s in zip(group, steps, strict=True)]
    assert sorted(seen) == sorted((p, s) for p in PIPELINES for s in range(SCHEDULER_STEPS))
    for p in PIPELINES:
        assert [s for q, s in seen if q == p] == list(range(SCHEDULER_STEPS))
    assert all(1 <= len(group) <= 2 for group, _ in log)
    # a group of one only once no partner can come: the first groups are pairs (three pipelines run)
    assert len(log[0][0]) == 2


def test_wave_sync_updates_locally_inside_a_wave(results: list[dict]) -> None:
    """Wave 2, staleness 0: inside a wave each worker's second step starts from its own first
    step's local update (and sees no other worker's); at the wave's end it gets the pulled weights."""
    wave = results[len(SCENARIOS) + 1]
    for r in range(2):
        steps = wave[r]["steps"]
        for s in range(0, WAVE_STEPS, WAVE):
            before, grad, after, pulled = steps[s]
            assert not pulled
            assert not torch.equal(after, before)  # it moved, by exactly its own local SGD step
            torch.testing.assert_close(after - before, -LOCAL_LR * TO_MEAN * grad, atol=1e-6, rtol=0)
            assert torch.equal(steps[s + 1][0], after)  # and the next step computes there
            assert steps[s + 1][3]  # the wave's end pulls
        # the other worker's first step is not in this one's weights inside the wave
        assert not torch.equal(wave[0]["steps"][0][2], wave[1]["steps"][0][2])


def test_wave_sync_is_synchronous_training_over_waves(results: list[dict]) -> None:
    """Wave 2, staleness 0: each wave's gradient summed over its steps and workers, each step's at
    the worker's locally updated weights, one SGD step per wave on the server."""
    wave = results[len(SCENARIOS) + 1]
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES.values()]
    opt = make_optimizer("sgd", params, lr=0.05)
    for clock in range(WAVE_STEPS // WAVE):
        weights = torch.cat([p.detach().flatten() for p in params])
        total = torch.zeros_like(weights)
        for r in range(2):  # written out here: local SGD steps from the wave's starting weights
            local = weights.clone()
            for s in range(clock * WAVE, (clock + 1) * WAVE):
                grad = _grad(r, s, local)
                total += grad
                local = local - LOCAL_LR * TO_MEAN * grad
        offset = 0
        for p in params:
            p.grad = total[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        opt.step()
    assert torch.allclose(wave["weights"], torch.cat([p.detach().flatten() for p in params]), atol=1e-6)
    for r in range(2):
        assert [e["waves_ahead"] for e in wave[r]["log"]] == [0] * (WAVE_STEPS // WAVE)


def test_group_average_is_the_share_weighted_mean_of_the_group(results: list[dict]) -> None:
    records = results[len(SCENARIOS) + 2]
    assert len(records["log"]) >= AVERAGE_STEPS * WORKERS // 2
    for group, steps in records["log"]:  # members may be at different steps: SDPipe groups by arrival
        member = {q: records[q][s] for q, s in zip(group, steps, strict=True)}
        assert all(rec[0] == group for rec in member.values())
        total = sum(AVERAGE_BATCHES[q] for q in group)
        expect = sum(member[q][1].double() * AVERAGE_BATCHES[q] / total for q in group).float()
        for q in group:
            assert torch.equal(member[q][2], member[group[0]][2])  # the same bits on every member
            assert torch.allclose(member[q][2], expect, atol=1e-6)
