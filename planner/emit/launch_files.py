"""Write the launch folder: ``rank-config.yaml``, ``node-<name>.sh`` (one torchrun per node), ``slurm.sbatch``.

torchrun is started with a static rendezvous on ``--rdzv-endpoint`` (the first node); each worker
is told its node name and finds its device by ``LOCAL_RANK``, then all ranks exchange addresses, so
the ranks torchrun assigns never need to match a precomputed order.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit.rank_config import build_rank_config
from hetplan.errors import HetplanError

__all__ = ["emit_launch", "torchrun_command"]


def torchrun_command(
    *, nnodes: int, node_rank: int, nproc: int, endpoint: str, node: str, config: str, steps: int, log: str
) -> str:
    args = [
        "torchrun",
        f"--nnodes={nnodes}",
        f"--node-rank={node_rank}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=static",
        f"--rdzv-endpoint={endpoint}",
        "-m",
        "hetplan.runtime.worker",
        config,
        "--node-name",  # not --node: torchrun's parser reads it as an ambiguous --node-rank
        node,
        "--steps",
        str(steps),
        "--run-log",  # not --log: torchrun's parser reads it as an ambiguous --log-dir
        log,
    ]
    return " ".join(shlex.quote(a) for a in args)


def emit_launch(
    plan: Plan,
    profile: ModelProfile,
    cluster: Cluster,
    out_dir: str | Path,
    *,
    master: str,
    steps: int = 100,
    seed: int = 0,
    lr: float | None = None,
    backend: str = "nccl",
    **training: Any,
) -> list[Path]:
    """Write the launch files for ``plan``; returns their paths. ``training``: how the ranks train
    beyond the plan (optimizer, clipping, learning-rate schedule, dataset; :func:`build_rank_config`)."""
    if ":" not in master:
        raise HetplanError(f"expected HOST:PORT, got {master!r}", field="--master")
    out = Path(out_dir)
    config = build_rank_config(plan, profile, cluster, seed=seed, lr=lr, backend=backend, **training)
    config_path = out / "rank-config.yaml"
    write_yaml(config, config_path)
    written = [config_path]
    nodes = config["nodes"]
    for node_rank, node in enumerate(nodes):
        command = torchrun_command(
            nnodes=len(nodes),
            node_rank=node_rank,
            # the central process of wsp/sdpipe runs under the first node's agent, after its devices
            nproc=len(node["devices"]) + (1 if config.get("central", {}).get("node") == node["name"] else 0),
            endpoint=master,
            node=node["name"],
            config="rank-config.yaml",
            steps=steps,
            log=f"run-{node['name']}.jsonl",
        )
        script = out / f"node-{node['name']}.sh"
        script.write_text(
            "#!/usr/bin/env bash\n"
            f"# hetplan: run on {node['name']} ({', '.join(node['devices'])}); rank config beside this file.\n"
            'set -euo pipefail\ncd "$(dirname "$0")"\n'
            f"exec {command}\n",
            encoding="utf-8",
        )
        script.chmod(0o755)
        written.append(script)
    host = master.rsplit(":", 1)[0]
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name=hetplan-{cluster.name}",
        f"#SBATCH --nodes={len(nodes)}",
        "#SBATCH --ntasks-per-node=1",
        f"# hetplan: one torchrun per node; the first node ({nodes[0]['name']}) serves the rendezvous at {host}.",
        "# Node names here are the cluster file's; map them to SLURM host names with --nodelist if they differ.",
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
    ]
    for node in nodes:
        lines.append(f"srun --nodes=1 --ntasks=1 --nodelist={shlex.quote(node['name'])} bash node-{node['name']}.sh &")
    lines.append("wait")
    sbatch = out / "slurm.sbatch"
    sbatch.write_text("\n".join(lines) + "\n", encoding="utf-8")
    written.append(sbatch)
    return written
