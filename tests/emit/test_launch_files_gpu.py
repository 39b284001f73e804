"""Launch files as a GPU cluster runs them: SLURM's GPUs, spool copy and failures; node scripts
from any directory, with the user's modules, in PCI order; the master and the backend checked.

``srun`` and ``torchrun`` are stand-ins on PATH that record what they were given and check that the
files they were pointed at exist, so the scripts themselves run here, as bash runs them on a node.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml
from builders import make_cluster, make_profile

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.rank_config import load_rank_config
from hetplan.emit import emit_launch
from hetplan.errors import HetplanError

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="the launch scripts are bash scripts")


def _inputs(types=(("A100-80GB", 2), ("V100-16GB", 1))):
    profile = make_profile(4, times={t: (1.0, 1.0) for t, _ in types})
    profile.model = {"family": "mlp", "config": {"layers": 4}}
    cluster = make_cluster([("gpu-a", [types[0]]), ("gpu-b", [types[1]])])
    plan = Plan(
        global_batch=8,
        pipelines=[
            Pipeline(6, (2, 4), (Stage(0, 2, ("gpu-a/0",), (1.0,)), Stage(2, 4, ("gpu-b/0",), (1.0,)))),
            Pipeline(2, (2,), (Stage(0, 4, ("gpu-a/1",), (1.0,)),)),
        ],
    )
    return profile, cluster, plan


def _stand_in(folder, name: str, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(body, encoding="utf-8")
    path.chmod(0o755)


_SRUN = """#!/usr/bin/env bash
# srun stand-in: record the call, check the node script exists, fail for $FAIL_NODE, else sleep
node=""
for a in "$@"; do case "$a" in --nodelist=*) node="${a#--nodelist=}";; esac; done
echo "$node $*" >> "$SRUN_LOG"
file="${@: -1}"
[ -f "$file" ] || { echo "no such file: $file" >&2; exit 9; }
[ "$node" = "${FAIL_NODE:-}" ] && exit 7
exec sleep "${SRUN_SLEEP:-0}"
"""


def _sbatch(tmp_path, out, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run slurm.sbatch as slurmd does: a spool copy, started elsewhere, SLURM_SUBMIT_DIR set."""
    spool = tmp_path / "spool"
    spool.mkdir(exist_ok=True)
    shutil.copy(out / "slurm.sbatch", spool / "slurm_script")
    _stand_in(tmp_path / "bin", "srun", _SRUN)
    full = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", **env}
    full["SRUN_LOG"] = str(tmp_path / "srun.log")
    start = time.monotonic()
    done = subprocess.run(
        ["bash", str(spool / "slurm_script")], cwd=spool, env=full, capture_output=True, text=True, timeout=60
    )
    return done, time.monotonic() - start


def test_slurm_script_requests_gpus_and_finds_its_files_from_the_submit_dir(tmp_path) -> None:
    profile, cluster, plan = _inputs()
    out = tmp_path / "launch"
    emit_launch(plan, profile, cluster, out, master="gpu-a:29500")
    text = (out / "slurm.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=2" in text
    # submitted from the launch folder's parent (sbatch launch/slurm.sbatch), and from the folder
    for submit in (tmp_path, out):
        (tmp_path / "srun.log").unlink(missing_ok=True)
        done, _ = _sbatch(tmp_path, out, SLURM_SUBMIT_DIR=str(submit))
        assert done.returncode == 0, done.stderr
        calls = (tmp_path / "srun.log").read_text().splitlines()
        assert sorted(c.split()[0] for c in calls) == ["gpu-a", "gpu-b"]
        assert all(str(out / f"node-{c.split()[0]}.sh") in c for c in calls)
        assert any("--gpus-per-node=2" in c for c in calls) and any("--gpus-per-node=1" in c for c in calls)


def test_slurm_script_fails_when_any_srun_fails_and_stops_the_others(tmp_path) -> None:
    profile, cluster, plan = _inputs()
    out = tmp_path / "launch"
    emit_launch(plan, profile, cluster, out, master="gpu-a:29500")
    done, elapsed = _sbatch(tmp_path, out, SLURM_SUBMIT_DIR=str(out), FAIL_NODE="gpu-b", SRUN_SLEEP="30")
    assert done.returncode == 7
    assert elapsed < 20  # the other node's srun (sleeping 30 s) was stopped, not waited for
    assert "an srun failed (exit 7)" in done.stderr
    # submitted from somewhere without the files: one line, exit 2
    done, _ = _sbatch(tmp_path, out, SLURM_SUBMIT_DIR=str(tmp_path / "spool"))
    assert done.returncode == 2 and done.stderr.strip().startswith("error: slurm.sbatch: no rank-config.yaml")


def test_emit_refuses_a_loopback_master_for_a_multi_node_cluster(tmp_path) -> None:
    profile, cluster, plan = _inputs()
    for master in ("localhost:29500", "127.0.0.1:29500", "[::1]:29500", "127.1.2.3:29500"):
        with pytest.raises(HetplanError, match="loopback") as info:
            emit_launch(plan, profile, cluster, tmp_path / "x", master=master)
        assert info.value.field == "--master"
    one_node = Plan(global_batch=8, pipelines=[Pipeline(8, (8,), (Stage(0, 4, ("gpu-a/0",), (1.0,)),))])
    emit_launch(one_node, profile, cluster, tmp_path / "one", master="localhost:29500")  # one node: fine


def test_emit_defaults_to_gloo_on_a_cpu_only_cluster_and_refuses_nccl_there(tmp_path) -> None:
    profile, cluster, plan = _inputs(types=(("cpu", 2), ("cpu", 1)))
    emit_launch(plan, profile, cluster, tmp_path / "cpu", master="gpu-a:29500")
    raw = yaml.safe_load((tmp_path / "cpu" / "rank-config.yaml").read_text())
    assert raw["training"]["backend"] == "gloo"
    text = (tmp_path / "cpu" / "slurm.sbatch").read_text()
    assert "gpus-per-node" not in text
    with pytest.raises(HetplanError, match="nccl needs GPUs"):
        emit_launch(plan, profile, cluster, tmp_path / "nccl", master="gpu-a:29500", backend="nccl")
    profile, cluster, plan = _inputs()
    emit_launch(plan, profile, cluster, tmp_path / "gpu", master="gpu-a:29500")
    assert load_rank_config(tmp_path / "gpu" / "rank-config.yaml").backend == "nccl"


_TORCHRUN = """#!/usr/bin/env python3
# torchrun stand-in: import the user's module as a rank would, check the rank config, record the rest
import json, os, sys
args = sys.argv[1:]
import my_models  # found through the node script's PYTHONPATH
config = args[args.index("hetplan.runtime.worker") + 1]
assert os.path.isfile(config), config
record = {k: os.environ.get(k) for k in ("CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES")}
record.update(args=args, cwd=os.getcwd(), model=my_models.__file__)
with open(os.environ["TORCHRUN_LOG"], "a") as f:
    f.write(json.dumps(record) + "\\n")
"""


def test_node_scripts_run_from_any_directory_with_the_users_modules(tmp_path, monkeypatch) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_models.py").write_text("def build():\n    return []\n", encoding="utf-8")
    profile, cluster, plan = _inputs()
    profile.model = {"factory": "my_models:build", "config": {}, "input_shape": [4]}
    monkeypatch.chdir(project)  # emit runs where the user's module is importable
    out = tmp_path / "launch"
    emit_launch(plan, profile, cluster, out, master="gpu-a:29500", save="ckpt", save_every=5, optimizer="adamw")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _stand_in(tmp_path / "bin", "torchrun", _TORCHRUN)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "PYTHONPATH")}
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{os.path.dirname(sys.executable)}{os.pathsep}{env['PATH']}"
    env["TORCHRUN_LOG"] = str(tmp_path / "torchrun.log")
    for node in ("gpu-a", "gpu-b"):
        done = subprocess.run(
            ["bash", str(out / f"node-{node}.sh")], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
    a, b = (json.loads(line) for line in (tmp_path / "torchrun.log").read_text().splitlines())
    assert a["CUDA_DEVICE_ORDER"] == b["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert a["CUDA_VISIBLE_DEVICES"] == "0,1" and b["CUDA_VISIBLE_DEVICES"] == "0"
    assert a["model"] == str(project / "my_models.py")
    assert "--save" in a["args"] and a["args"][a["args"].index("--save-every") + 1] == "5"
    assert a["args"][a["args"].index("--run-log") + 1] == str(out / "run-gpu-a.jsonl")
    # the scheduler's choice of GPUs is kept
    env["CUDA_VISIBLE_DEVICES"] = "3"
    subprocess.run(["bash", str(out / "node-gpu-b.sh")], cwd=elsewhere, env=env, check=True, timeout=60)
    last = json.loads((tmp_path / "torchrun.log").read_text().splitlines()[-1])
    assert last["CUDA_VISIBLE_DEVICES"] == "3"
    assert yaml.safe_load((out / "rank-config.yaml").read_text())["training"]["optimizer"] == "adamw"
