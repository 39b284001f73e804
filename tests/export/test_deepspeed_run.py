"""The DeepSpeed export trains through DeepSpeed itself: its ``PipelineModule`` and pipeline engine,
under torchrun on gloo, 2 stages x 2 replicas with ZeRO-1 and activation checkpointing, 3 steps with
the same losses as plain single-process PyTorch on the same model, data and optimizer.

Skipped where DeepSpeed does not import (it is the ``export`` extra: ``pip install 'hetplan[export]'``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from builders import run_cli as run

from hetplan.contracts.model_profile import Block, ModelProfile, Timing
from hetplan.contracts.yamlio import sha256_of

HERE = Path(__file__).parent
STEPS = 3

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="DeepSpeed is not installed (pip install 'hetplan[export]'): the export is checked by its keys only",
)


def _train_script():
    """``deepspeed_train.py`` as a module: the model and data the ranks use, for the reference."""
    spec = importlib.util.spec_from_file_location("deepspeed_train", HERE / "deepspeed_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _profile(layers: list[torch.nn.Module]) -> ModelProfile:
    """A profile whose blocks are the script's layers (their parameter counts: DeepSpeed's
    ``partition_method="parameters"`` balances those), equally fast on the cluster's GPUs."""
    blocks = []
    for i, layer in enumerate(layers):
        params = sum(p.numel() for p in layer.parameters())
        blocks.append(
            Block(
                name=f"layer{i}",
                kind="test",
                params=params,
                param_bytes=4.0 * params,
                activation_bytes=256.0,
                output_bytes=128.0,
                flops_fwd=2.0 * params,
                times={"A100-80GB": {1: Timing(fwd=1e-3, bwd=2e-3, source="estimated")}},
            )
        )
    return ModelProfile(model={"name": "deepspeed-train"}, dtype="fp32", blocks=blocks)


CLUSTER = """\
schema: hetplan/cluster/v1
name: two-by-two
nodes:
  - {name: n0, devices: [{type: A100-80GB, count: 2}], link: {bandwidth: 600GB/s, latency: 2us}}
  - {name: n1, devices: [{type: A100-80GB, count: 2}], link: {bandwidth: 600GB/s, latency: 2us}}
network: {bandwidth: 100Gbps, latency: 10us}
"""


def _reference_losses(script, config: dict) -> list[float]:
    """Plain PyTorch, one process: the whole batch, the optimizer as ds_config.json says."""
    model = torch.nn.Sequential(*script.build_layers())
    params = config["optimizer"]["params"]
    assert config["optimizer"]["type"] == "Adam" and params["adam_w_mode"] is False
    optimizer = torch.optim.Adam(
        model.parameters(),
        lr=params["lr"],
        betas=tuple(params["betas"]),
        eps=params["eps"],
        weight_decay=params["weight_decay"],
    )
    losses = []
    for x, y in script.batches(config["train_batch_size"], STEPS):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_a_two_stage_two_replica_export_trains_through_deepspeeds_pipeline_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _train_script()
    from hetplan.export.partition import deepspeed_parameters

    profile = _profile(script.build_layers())
    profile.save(tmp_path / "model.yaml")
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    cut = deepspeed_parameters([float(b.params) for b in profile.blocks], 2)[1]
    n = len(profile.blocks)
    stages = [
        [
            {"blocks": [0, cut], "devices": [f"n0/{d}"], "recompute": "full"},
            {"blocks": [cut, n], "devices": [f"n1/{d}"], "recompute": "full"},
        ]
        for d in range(2)
    ]
    plan = {
        "schema": "hetplan/plan/v1",
        "inputs": {
            "profile": {"path": "model.yaml", "sha256": sha256_of(tmp_path / "model.yaml")},
            "cluster": {"path": "cluster.yaml", "sha256": sha256_of(tmp_path / "cluster.yaml")},
        },
        "global_batch": 16,
        "optimizer": "adam",
        "zero": 1,
        "pipelines": [{"batch": 8, "micro_batches": [2, 2, 2, 2], "stages": s} for s in stages],
    }
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan, sort_keys=False))
    folder = tmp_path / "ds"
    code, out, err = run(["export", "deepspeed", str(tmp_path / "plan.yaml"), "-o", str(folder)], capsys)
    assert (code, err) == (0, "") and "dropped: nothing" in out, out + err
    config = json.loads((folder / "ds_config.json").read_text())
    pipeline = json.loads((folder / "pipeline.json").read_text())
    assert pipeline["PipeDataParallelTopology"] == {"num_pp": 2, "num_dp": 2}
    assert (
        pipeline["PipelineModule"]["activation_checkpoint_interval"] == 1 and config["zero_optimization"]["stage"] == 1
    )

    out_file = tmp_path / "ranks.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
        str(HERE / "deepspeed_train.py"), str(folder), str(STEPS), str(out_file),
    ]  # fmt: skip
    # its own session, so a timeout ends torchrun and its four workers together (no process left over)
    proc = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        _, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"the DeepSpeed run did not finish in 300 s: {stderr[-3000:]}")
    assert proc.returncode == 0, stderr[-4000:]
    records = [json.loads(Path(f"{out_file}.{r}").read_text()) for r in range(4)]
    # DeepSpeed's grid is the export's: rank r runs stage r // 2 of replica r % 2, with pipeline.json's parts
    assert [(r["stage"], r["replica"]) for r in records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["parts"] == pipeline["parts"] == [0, cut, n] for r in records)
    assert all(r["zero_stage"] == 1 and r["checkpoint_interval"] == 1 for r in records)
    assert all(r["optimizer"] == "DeepSpeedZeroOptimizer" and r["basic_optimizer"] == "Adam" for r in records)
    # deepspeed.initialize read ds_config.json through its DeepSpeedConfig, with the real data-parallel size
    assert all(r["batch"] == [16, 2, 4] and r["gradient_clipping"] == 0.0 for r in records)
    # the same training as plain PyTorch on the whole batch
    reference = _reference_losses(script, config)
    for r in records:
        assert r["losses"] == pytest.approx(reference, rel=1e-5, abs=1e-6)
    assert reference[0] != pytest.approx(reference[-1])  # it trained
