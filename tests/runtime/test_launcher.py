"""The local launcher: torchrun's standalone mode, with hetplan's fault messages and stall detection.

Each test runs real ranks under one torchrun agent, and checks what a user sees (one line naming
the rank, step and action) and what must not remain (no process of the job outlives the launch).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builders import make_cluster, zoo_profile

from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.errors import HetplanError
from hetplan.runtime.launcher import RANK_START_ENV, _torchrun_args, _worker_args, launch_local
from hetplan.runtime.reference import train_reference

GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}}
ROOT = Path(__file__).resolve().parents[2]
TWO_STAGES = Plan(
    global_batch=8,
    pipelines=[Pipeline(8, (4, 4), (Stage(0, 3, ("n0/0",), (1.0,)), Stage(3, 6, ("n0/1",), (1.0,))))],
)


def _profile() -> ModelProfile:
    return zoo_profile(GPT)


def _config(tmp_path: Path, plan: Plan, cluster=None, *, timeout: float = 30) -> tuple[Path, dict]:
    cluster = cluster or make_cluster([("n0", [("cpu", 2)])])
    config = build_rank_config(plan, _profile(), cluster, seed=7, timeout_s=timeout)
    path = tmp_path / "rank-config.yaml"
    write_yaml(config, path)
    return path, config


def _alive(pid: int) -> bool:
    """Running (a zombie, or no such process, is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _worker_pids(run: Path) -> list[int]:
    return [json.loads(p.read_text())["pid"] for p in sorted((run / "ranks").glob("rank-*.json"))]


def _rank_logs(run: Path) -> str:
    """Every rank's stderr and the agent's last lines: what a failed assertion should show."""
    texts = [
        f"{p.relative_to(run)}: {p.read_text(errors='replace')!r}"
        for p in sorted(run.glob("torchrun/*/*/*/stderr.log"))
    ]
    agent = run / "agent.log"
    tail = agent.read_text(errors="replace").splitlines()[-6:] if agent.is_file() else []
    return "\n".join([*texts, "agent.log:", *tail])


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")


def test_the_worker_arguments_reach_the_worker_through_torchrun_parser_intact(tmp_path) -> None:
    from torch.distributed.run import parse_args

    worker = _worker_args(tmp_path / "c.yaml", ["n0", "n1"], steps=3, work=tmp_path, threads=1)
    worker += ["--save", "ckpt", "--save-every", "2", "--resume", "old", "--resume-step", "4", "--keep-last", "2"]
    args = parse_args(_torchrun_args(3, tmp_path, worker))
    assert args.standalone and args.max_restarts == 0 and args.nproc_per_node == "3" and args.module
    assert [args.training_script, *args.training_script_args] == worker[1:]
    # the older spellings would be refused by torchrun's parser (prefixes of --node-rank, --log-dir)
    for old in ("--node", "--log"):
        with pytest.raises(SystemExit):
            parse_args(["--standalone", "-m", "hetplan.runtime.worker", "c.yaml", old, "x"])


@needs_proc
@pytest.mark.parametrize("rank_start", ["forkserver", "spawn"])
def test_a_killed_rank_gives_one_line_within_seconds_and_no_process_remains(tmp_path, monkeypatch, rank_start) -> None:
    # spawned, torchrun's subprocess context names every failed rank; forked, its multiprocessing
    # context names only the first failure it polls (the survivor's, as often as not), and the
    # launcher names the rank it killed itself: the same line either way
    monkeypatch.setenv(RANK_START_ENV, rank_start)
    path, _ = _config(tmp_path, TWO_STAGES, timeout=15)
    first_step: list[float] = []
    start = time.time()
    with pytest.raises(HetplanError) as info:
        launch_local(
            path,
            steps=100_000,
            kill_rank_after=(1, 2.0),
            run_dir=tmp_path / "run",
            progress=lambda done, _: first_step.append(time.time()) if done and not first_step else None,
        )
    message = str(info.value)
    # the kill came no earlier than 2 s after the start, nor before the first step
    latency = time.time() - max(first_step[0], start + 2.0)
    assert latency < 8.0, latency
    assert "\n" not in message
    seen = _rank_logs(tmp_path / "run")  # what the ranks wrote, should the line below not hold
    assert message.startswith("the run stopped: rank 1 (n0/1) died (SIGKILL); rank 0 (n0/0) step "), seen
    assert "waiting on" in message, seen  # the survivor's action
    assert not [pid for pid in _worker_pids(tmp_path / "run") if _alive(pid)]


class _SeenError(Exception):
    """Raised from a step callback once the live ranks have been looked at: ends the run there."""


@needs_proc
@pytest.mark.parametrize("rank_start", ["forkserver", "spawn"])
def test_ranks_lead_sessions_of_their_own_whether_forked_from_a_server_or_spawned(
    tmp_path, monkeypatch, rank_start
) -> None:
    """A forked rank looks to the launcher like one torchrun spawned (its own session, ended by
    process group); only what it was started from differs: the fork server (itself a fork of the
    agent, so the rank is the agent's grandchild; the agent is forked from this process's fork
    server, whose command line they all show), or a fresh worker (the agent's child)."""
    monkeypatch.setenv(RANK_START_ENV, rank_start)
    path, _ = _config(tmp_path, TWO_STAGES)
    seen: dict[int, tuple[list[str], str, list[int]]] = {}

    def stat_of(pid: int) -> list[str]:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()

    def look(_line) -> None:
        for pid in _worker_pids(tmp_path / "run"):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            ancestors, up = [], pid
            while up not in (os.getpid(), 1) and len(ancestors) < 4:
                up = int(stat_of(up)[1])
                ancestors.append(up)
            seen[pid] = (stat_of(pid), cmdline, ancestors)
        raise _SeenError

    with pytest.raises(_SeenError):
        launch_local(path, steps=100_000, run_dir=tmp_path / "run", on_step=look)
    assert len(seen) == 2
    agent = int((tmp_path / "run" / "agent.pid").read_text())
    for pid, (stat, cmdline, ancestors) in seen.items():
        assert int(stat[3]) == pid and int(stat[2]) == pid  # session and process group leader
        if rank_start == "forkserver":  # rank <- the agent's fork server <- agent <- this one's <- this
            assert len(ancestors) == 4 and ancestors[1] == agent and ancestors[-1] == os.getpid(), ancestors
            assert "multiprocessing.forkserver" in cmdline, cmdline
        else:  # rank <- agent <- this process
            assert ancestors == [agent, os.getpid()], ancestors
            assert "hetplan.runtime.worker" in cmdline, cmdline
    assert not [pid for pid in seen if _alive(pid)]
    with pytest.raises(HetplanError, match="HETPLAN_RANK_START"):
        monkeypatch.setenv(RANK_START_ENV, "fork")  # from the agent, which runs threads: refused
        launch_local(path, steps=1)


def test_a_preloading_agent_is_asked_for_torchruns_forkserver_start_and_the_forked_rank_script(tmp_path) -> None:
    from torch.distributed.run import parse_args

    worker = _worker_args(tmp_path / "c.yaml", ["n0"], steps=3, work=tmp_path, threads=1)
    args = parse_args(_torchrun_args(2, tmp_path, worker, preload=True))
    assert args.start_method == "forkserver" and args.run_path and not args.module
    assert args.training_script == str(ROOT / "planner" / "runtime" / "processes" / "forked_rank.py")
    assert args.training_script_args == worker[2:]


@needs_proc
def test_a_stalled_job_is_stopped_with_one_line_and_no_process_remains(tmp_path) -> None:
    path, _ = _config(tmp_path, TWO_STAGES, timeout=120)  # the ranks would wait 2 minutes on their own
    last_step: list[float] = []
    with pytest.raises(HetplanError) as info:
        launch_local(
            path,
            steps=100_000,
            kill_rank_after=(1, 0.0),
            kill_signal=signal.SIGSTOP,  # rank 1 freezes: alive, silent
            stall_s=3.0,
            run_dir=tmp_path / "run",
            progress=lambda done, _: last_step.append(time.time()) if done else None,
        )
    message = str(info.value)
    # stopped soon after the last finished step (3 s of silence, then the stop), well before the ranks'
    # own 120 s timeout; the start (imports, rendezvous) is not counted: on a busy machine it varies
    assert "\n" not in message and time.time() - last_step[-1] < 30, time.time() - last_step[-1]
    assert message.startswith("no step finished for 3 s; stopped every rank (finished steps per rank: n0/0 ")
    pids = _worker_pids(tmp_path / "run")
    assert len(pids) == 2 and not [pid for pid in pids if _alive(pid)]


def test_a_plan_over_two_nodes_runs_under_one_standalone_torchrun_and_merges_the_logs(tmp_path) -> None:
    cluster = make_cluster([("a", [("cpu", 1)]), ("b", [("cpu", 1)])])
    plan = Plan(
        global_batch=8,
        pipelines=[Pipeline(8, (4, 4), (Stage(0, 3, ("b/0",), (1.0,)), Stage(3, 6, ("a/0",), (1.0,))))],
    )
    path, config = _config(tmp_path, plan, cluster)
    seen: list[int] = []
    result = launch_local(
        path, steps=2, log=tmp_path / "run.jsonl", run_dir=tmp_path / "run", progress=lambda d, _: seen.append(d)
    )
    losses, _ = train_reference(GPT, global_batch=8, optimizer="adam", lr=config["training"]["lr"], seed=7, steps=2)
    # LOCAL_RANK r runs the r-th device in rank-config order (a/0, then b/0), whatever the stage order
    assert {(r["rank"], r["device"]) for r in result.records} == {(0, "a/0"), (1, "b/0")}
    assert [r["loss"] for r in result.records if r["rank"] == 0] == pytest.approx(losses, abs=1e-5)
    merged = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert [(r["step"], r["rank"]) for r in merged] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert seen[-1] == 2
    assert sorted(p.parent.name for p in (tmp_path / "run" / "torchrun").glob("*/attempt_0/*/stderr.log")) == ["0", "1"]


def test_a_worker_on_an_unknown_node_says_so_in_one_line(tmp_path) -> None:
    path, _ = _config(tmp_path, TWO_STAGES)
    env = dict(os.environ, LOCAL_RANK="0", RANK="0", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "hetplan.runtime.worker", str(path), "--node-name", "n9"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 3
    assert done.stderr.strip().splitlines() == [
        f"error: {path}: nodes: node 'n9' is not in the rank config (nodes: n0)"
    ]


def test_checkpoint_options_without_a_folder_are_refused(tmp_path) -> None:
    path, _ = _config(tmp_path, TWO_STAGES)
    with pytest.raises(HetplanError, match=r"--save-every: needs a checkpoint folder"):
        launch_local(path, steps=1, save_every=2)
    with pytest.raises(HetplanError, match=r"--resume-step: needs a checkpoint folder"):
        launch_local(path, steps=1, resume_step=2)


def test_a_gloo_error_reaches_the_message_whole() -> None:
    """gloo's text as torch 2.13 raises it (a peer that crashed, a receive that timed out): it used to
    be cut at 120 characters ("... Check the logs of the (rank logs: ...")."""
    from hetplan.runtime.comm import RankFailureError, wait

    class Failing:
        def __init__(self, text: str) -> None:
            self.text = text

        def wait(self, timeout) -> None:
            raise RuntimeError(self.text)

    crashed = (
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:53452. This is typically caused by a remote worker crashing. Check the logs of the remote "
        "worker before reporting an error. GLHF! \U0001f3d6\ufe0f"
    )
    timed_out = (
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
        "2000ms for recv operation to complete"
    )
    what = "rank 0 (n0/0) step 12: waiting on RA3<n0/1 (the activation of micro-batch 3 from n0/1)"
    with pytest.raises(RankFailureError) as info:
        wait(Failing(crashed), timeout_s=1.0, what=what)
    assert str(info.value) == (
        f"{what}: Connection closed by peer [127.0.0.1]:53452. This is typically caused by a remote worker crashing."
    )
    with pytest.raises(RankFailureError) as info:
        wait(Failing(timed_out), timeout_s=1.0, what=what)
    assert str(info.value) == f"{what}: Timed out waiting 2000ms for recv operation to complete"


def test_ranks_on_a_gpu_are_never_forked() -> None:
    """CUDA does not survive a fork (on an H100: "Cannot re-initialize CUDA in forked subprocess"):
    ranks computing on a GPU start fresh whatever HETPLAN_RANK_START says."""
    from types import SimpleNamespace

    from hetplan.runtime.launcher import _on_cuda

    assert _on_cuda(SimpleNamespace(compute_device=None, backend="nccl"))
    assert _on_cuda(SimpleNamespace(compute_device="cuda", backend="gloo"))  # host-staged
    assert not _on_cuda(SimpleNamespace(compute_device=None, backend="gloo"))
    assert not _on_cuda(SimpleNamespace(compute_device="cpu", backend="gloo"))


def test_the_fork_server_preloads_modules_that_exist(monkeypatch) -> None:
    """Python's fork server skips a preload module that does not import, silently: every name the
    launcher gives it must resolve, and a Hugging Face config adds its model family's modules."""
    import importlib.util
    from types import SimpleNamespace

    from hetplan.runtime import launcher

    names = launcher.rank_module_names()
    assert "torch" in names and "hetplan.runtime.worker" in names
    assert all(importlib.util.find_spec(name) is not None for name in names), names
    monkeypatch.setattr(launcher, "load_rank_config", lambda _path: SimpleNamespace(model={"hf": "gpt2-small"}))
    hf = launcher.rank_module_names("any.yaml")
    assert hf[len(names) :] == ["hetplan.models.hf", "transformers.models.gpt2.modeling_gpt2"]
    pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")
    assert all(importlib.util.find_spec(name) is not None for name in hf)
