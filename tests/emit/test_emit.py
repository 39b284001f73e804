"""Launch files: a torchrun command per node, a SLURM script, one rank config every rank reads."""

from __future__ import annotations

import pytest
import yaml
from builders import make_cluster, make_profile

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.rank_config import load_rank_config
from hetplan.emit import emit_launch
from hetplan.errors import HetplanError


def _inputs():
    profile = make_profile(4, times={"A100-80GB": (1.0, 1.0), "V100-16GB": (2.0, 2.0)})
    profile.model = {"family": "mlp", "config": {"layers": 4}}
    cluster = make_cluster([("gpu-a", [("A100-80GB", 2)]), ("gpu-b", [("V100-16GB", 1)])])
    plan = Plan(
        global_batch=8,
        pipelines=[
            Pipeline(6, (2, 4), (Stage(0, 2, ("gpu-a/0",), (1.0,)), Stage(2, 4, ("gpu-b/0",), (1.0,)))),
            Pipeline(2, (2,), (Stage(0, 4, ("gpu-a/1",), (1.0,)),)),
        ],
    )
    return profile, cluster, plan


def test_emit_writes_a_torchrun_script_per_node_and_a_rank_config(tmp_path) -> None:
    profile, cluster, plan = _inputs()
    written = emit_launch(plan, profile, cluster, tmp_path, master="gpu-a:29500", steps=50)
    names = sorted(p.name for p in written)
    assert names == ["node-gpu-a.sh", "node-gpu-b.sh", "rank-config.yaml", "slurm.sbatch"]
    a = (tmp_path / "node-gpu-a.sh").read_text()
    assert "torchrun --nnodes=2 --node-rank=0 --nproc-per-node=2" in a
    assert "--rdzv-endpoint=gpu-a:29500" in a and "--node-name gpu-a" in a and "--steps 50" in a
    b = (tmp_path / "node-gpu-b.sh").read_text()
    assert "--node-rank=1 --nproc-per-node=1" in b
    assert "srun" in (tmp_path / "slurm.sbatch").read_text()
    config = load_rank_config(tmp_path / "rank-config.yaml")
    assert config.nodes == {"gpu-a": ["gpu-a/0", "gpu-a/1"], "gpu-b": ["gpu-b/0"]}
    assert config.devices["gpu-b/0"].actions.startswith("RA0<gpu-a/0 F0")
    raw = yaml.safe_load((tmp_path / "rank-config.yaml").read_text())
    assert raw["training"]["backend"] == "nccl" and raw["world_size"] == 3


def test_emit_refuses_a_master_without_a_port(tmp_path) -> None:
    profile, cluster, plan = _inputs()
    with pytest.raises(HetplanError, match="HOST:PORT"):
        emit_launch(plan, profile, cluster, tmp_path, master="gpu-a")
