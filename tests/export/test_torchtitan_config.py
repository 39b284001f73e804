"""The torchtitan export of a pipeline plan is accepted by torchtitan 0.3.0's own config machinery:
``ConfigManager`` loads the written config registry as ``torchtrain.train`` would (``--module
hetplan_torchtitan --config hetplan_export``, with a tyro override on top), ``Trainer.Config``'s own
checks pass, ``ParallelDims`` accepts the degrees for the export's world size, and every module name
of ``module_fqns_per_model_part`` exists in the model torchtitan builds (llama3's debug model, on
the meta device: no GPU needed).

Skipped where torchtitan 0.3.0 does not import (the ``export`` extra; its models import triton).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
from builders import run_cli as run
from conftest import SCENARIOS
from test_export import titan_settings

from hetplan.contracts.plan import load_plan
from hetplan.export import torchtitan


def _titan_version() -> str | None:
    try:
        return importlib.metadata.version("torchtitan")
    except importlib.metadata.PackageNotFoundError:
        return None


pytestmark = pytest.mark.skipif(
    _titan_version() != torchtitan.VERSION or importlib.util.find_spec("triton") is None,
    reason=f"torchtitan {torchtitan.VERSION} with triton is not installed (pip install 'hetplan[export]'): "
    "the export is checked against its documented keys only",
)

#: Run in a child process (torchtitan's import registers models and logging handlers): load the
#: config as torchtitan.train does, then what its Trainer does first without a device.
PROBE = """
import json, sys
import torch
from torchtitan.config import ConfigManager
from torchtitan.distributed.parallel_dims import ParallelDims

args = ["--module", "hetplan_torchtitan", "--config", "hetplan_export", "--training.steps", "3"]
config = ConfigManager().parse_args(args)
dims = ParallelDims.from_config(config.parallelism, world_size=int(sys.argv[1]))
config.model_spec.model.update_from_config(config=config)
with torch.device("meta"):
    model = config.model_spec.model.build()
names = {name for name, _ in model.named_modules()}
parts = config.parallelism.module_fqns_per_model_part
group = config.optimizer.param_groups[0]
print("PROBE " + json.dumps({
    "steps": config.training.steps,
    "local_batch_size": config.training.local_batch_size,
    "global_batch_size": config.training.global_batch_size,
    "max_norm": str(config.training.max_norm),
    "degrees": [dims.dp_replicate, dims.dp_shard, dims.tp, dims.pp],
    "parts": parts,
    "missing": [m for part in parts for m in part if m not in names],
    "layers": len(model.layers),
    "schedule": config.parallelism.pipeline_parallel_schedule,
    "micro": config.parallelism.pipeline_parallel_microbatch_size,
    "ac": type(config.activation_checkpoint).__qualname__ if config.activation_checkpoint is not None else None,
    "optimizer": [group.optimizer_name, group.optimizer_kwargs["weight_decay"], list(group.optimizer_kwargs["betas"])],
}))
"""


def test_a_pipeline_export_is_accepted_by_torchtitans_config_machinery(
    write_plan, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_file = write_plan("three", **SCENARIOS["three_stages_gpipe_sgd"])  # 3 stages x 2 replicas, 6 layers
    folder = plan_file.parent / "titan"
    assert run(["export", "torchtitan", str(plan_file), "-o", str(folder)], capsys)[0] == 0
    exported = load_plan(folder / "exported-plan.yaml")
    settings = titan_settings(folder)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(folder), *sys.path]),
        "HETPLAN_TITAN_MODULE": "torchtitan.models.llama3.config_registry",
        "HETPLAN_TITAN_CONFIG": "llama3_debugmodel",  # 6 layers, as the profile
    }
    world = len(exported.all_devices())
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(world)], env=env, capture_output=True, text=True, timeout=300, cwd=folder
    )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("PROBE "))
    probe = json.loads(line[len("PROBE ") :])
    assert probe["missing"] == [] and probe["layers"] == 6
    assert probe["parts"] == settings["parallelism"]["module_fqns_per_model_part"]
    assert probe["degrees"] == [2, 1, 1, 3] and world == 6  # replicated, no FSDP sharding, no TP, 3 stages
    assert probe["steps"] == 3  # a command-line override still applies on top of the export
    assert (probe["local_batch_size"], probe["global_batch_size"]) == (16, 32)
    assert probe["max_norm"] == "inf" and probe["ac"] is None
    assert (probe["schedule"], probe["micro"]) == ("GPipe", exported.pipelines[0].micro_batches[0])
    assert probe["optimizer"] == ["Adam", 0.0, [0.9, 0.999]]  # the plan's SGD is dropped: torchtitan has Adam(W)
    # stage k of the exported plan holds exactly the layers torchtitan puts in part k
    starts = [s.start for s in exported.pipelines[0].stages]
    for k, part in enumerate(probe["parts"]):
        layers = [int(m.split(".")[1]) for m in part if m.startswith("layers.")]
        assert all(starts[k] <= 2 * i + 1 < (starts[k + 1] if k + 1 < len(starts) else 14) for i in layers)
