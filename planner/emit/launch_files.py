"""Write the launch folder: ``rank-config.yaml``, ``node-<name>.sh`` (one torchrun per node), ``slurm.sbatch``.

    emit_launch(plan, profile, cluster, "launch/", master="node0.example.org:29500", save="ckpt")
    # on each node, from any directory:  bash launch/node-<name>.sh
    # or, from the launch folder (or its parent):  sbatch launch/slurm.sbatch

torchrun is started with a static rendezvous on ``--rdzv-endpoint`` (the first node); each worker
is told its node name and finds its device by ``LOCAL_RANK``, then all ranks exchange addresses, so
the ranks torchrun assigns never need to match a precomputed order.

Each node script finds its files beside itself, from whatever directory it is started, and exports
what the ranks need: ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (a node's GPUs numbered in PCI order, as the
cluster file and ``hetplan probe`` number them; CUDA's default numbers the fastest first),
``CUDA_VISIBLE_DEVICES`` (the node's GPUs the plan uses, in order, unless the scheduler has set it:
a rank takes the visible GPU of its local rank), and ``PYTHONPATH`` with the directories of the
user's model factory and dataset modules as found when ``emit`` ran (the nodes must see the same
paths, as on a shared file system). The SLURM script requests the GPUs, finds the folder from
``$SLURM_SUBMIT_DIR`` (slurmd runs a spool copy of the script, so the script's own directory says
nothing), runs one ``srun`` per node and fails as soon as any of them fails, stopping the others.
"""

from __future__ import annotations

import importlib.machinery
import ipaddress
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit.rank_config import build_rank_config
from hetplan.errors import HetplanError

__all__ = ["default_backend", "emit_launch", "module_dirs", "torchrun_command"]


def torchrun_command(
    *,
    nnodes: int,
    node_rank: int,
    nproc: int,
    endpoint: str,
    node: str,
    config: str,
    steps: int,
    log: str,
    extra: list[str] | None = None,
) -> str:
    """One node's torchrun command line (``config`` and ``log`` are written as given: a node script
    passes ``"$HERE/..."`` paths, quoted for the shell, so they are not quoted again here)."""
    head = [
        "torchrun",
        f"--nnodes={nnodes}",
        f"--node-rank={node_rank}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=static",
        f"--rdzv-endpoint={endpoint}",
        "-m",
        "hetplan.runtime.worker",
    ]
    tail = [
        "--node-name",  # not --node: torchrun's parser reads it as an ambiguous --node-rank
        node,
        "--steps",
        str(steps),
        *(extra or []),
    ]
    quoted = [shlex.quote(a) for a in head]
    # --run-log, not --log: torchrun's parser reads it as an ambiguous --log-dir
    return " ".join([*quoted, config, *(shlex.quote(a) for a in tail), "--run-log", log])


def default_backend(cluster: Cluster, addresses: set[str]) -> str:
    """``nccl`` when every used device is a GPU that runs it, else ``gloo`` (a CPU-only cluster, an
    emulated one, a type the catalog says runs gloo only, or a node the cluster marks
    ``host_staged``: its GPUs communicate through host memory)."""
    for d in cluster.devices:
        if d.address in addresses and (d.type.emulated or "nccl" not in getattr(d.type, "backends", ("nccl",))):
            return "gloo"
        if d.address in addresses and cluster.node(d.node).staging is not None:
            return "gloo"
    return "nccl"


def staged_gpus(cluster: Cluster, addresses: set[str]) -> bool:
    """Whether the plan's devices are GPUs on nodes the cluster marks ``host_staged``: their ranks
    compute on the GPU and communicate through host memory (``compute_device: cuda`` under gloo)."""
    used = [d for d in cluster.devices if d.address in addresses]
    return bool(used) and all(
        cluster.node(d.node).staging is not None and not d.type.emulated and d.type.name != "cpu" for d in used
    )


def _is_loopback(host: str) -> bool:
    name = host.strip("[]").lower()
    if name in ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def module_dirs(modules: list[str]) -> list[str]:
    """The directories that make ``modules`` (``package.module:function`` or ``module``) importable,
    found as ``hetplan`` itself finds them (the current directory, then ``sys.path``) without
    importing them; an installed module (under the interpreter's prefix) needs none."""
    out: list[str] = []
    search = [os.getcwd(), *[p for p in sys.path if p]]
    for spec in modules:
        top = spec.split(":", 1)[0].split(".", 1)[0]
        if not top:
            continue
        found = importlib.machinery.PathFinder.find_spec(top, search)
        if found is None or found.origin in (None, "built-in", "frozen"):
            continue
        origin = Path(found.origin).resolve()
        folder = origin.parent.parent if origin.name == "__init__.py" else origin.parent
        if str(folder).startswith((sys.prefix, sys.base_prefix)):
            continue
        if str(folder) not in out:
            out.append(str(folder))
    return out


def _user_modules(config: dict[str, Any]) -> list[str]:
    """The user's modules a rank imports: the model factory and the dataset."""
    names = []
    factory = config["model"].get("factory") if isinstance(config.get("model"), dict) else None
    if isinstance(factory, str):
        names.append(factory)
    dataset = config["training"].get("dataset")
    if isinstance(dataset, str):
        names.append(dataset)
    return names


def _node_script(node: dict[str, Any], command: str, *, gpus: bool, paths: list[str]) -> str:
    indices = ",".join(a.split("/", 1)[1] for a in node["devices"])
    lines = [
        "#!/usr/bin/env bash",
        f"# hetplan: run on {node['name']} ({', '.join(node['devices'])}); rank config beside this file.",
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID  # the cluster file's numbering (CUDA's default: fastest first)",
    ]
    if gpus:
        lines.append(
            f'export CUDA_VISIBLE_DEVICES="${{CUDA_VISIBLE_DEVICES:-{indices}}}"  # the plan\'s GPUs of the node, '
            "unless the scheduler chose"
        )
    if paths:
        joined = ":".join(shlex.quote(p) for p in paths)
        lines.append(f'export PYTHONPATH="{joined}${{PYTHONPATH:+:$PYTHONPATH}}"  # the model and dataset modules')
    lines += ['cd "$HERE"', f"exec {command}", ""]
    return "\n".join(lines)


def _slurm_script(cluster: Cluster, nodes: list[dict[str, Any]], host: str, folder: str, *, gpus: bool) -> str:
    most = max(len(n["devices"]) for n in nodes)
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name=hetplan-{cluster.name}",
        f"#SBATCH --nodes={len(nodes)}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={most}"] if gpus else []),
        f"# hetplan: one torchrun per node; the first node ({nodes[0]['name']}) serves the rendezvous at {host}.",
        "# Node names here are the cluster file's; map them to SLURM host names with --nodelist if they differ.",
        "# Submit from the launch folder or its parent: slurmd runs a copy of this script, so the files are",
        "# found from $SLURM_SUBMIT_DIR.",
        "set -euo pipefail",
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
        'SUBMIT="${SLURM_SUBMIT_DIR:-$PWD}"',
        f'for HERE in "$SUBMIT" "$SUBMIT"/{shlex.quote(folder)}; do',
        '  [ -f "$HERE/rank-config.yaml" ] && break',
        "done",
        'if [ ! -f "$HERE/rank-config.yaml" ]; then',
        '  echo "error: slurm.sbatch: no rank-config.yaml in $SUBMIT or $SUBMIT/'
        + folder.replace('"', "")
        + ': submit from the launch folder or its parent" >&2',
        "  exit 2",
        "fi",
        "pids=()",
    ]
    for node in nodes:
        gres = f" --gpus-per-node={len(node['devices'])}" if gpus else ""
        lines.append(
            f"srun --nodes=1 --ntasks=1 --nodelist={shlex.quote(node['name'])}{gres} "
            f'bash "$HERE"/{shlex.quote("node-" + node["name"] + ".sh")} &'
        )
        lines.append("pids+=($!)")
    lines += [
        "# the first srun to fail ends the job: the others are stopped (they would wait for the lost node)",
        'for _ in "${pids[@]}"; do',
        "  status=0",
        "  wait -n || status=$?",
        '  if [ "$status" -ne 0 ]; then',
        '    echo "error: slurm.sbatch: an srun failed (exit $status); stopping the others" >&2',
        '    kill "${pids[@]}" 2>/dev/null || true',
        "    wait || true",
        '    exit "$status"',
        "  fi",
        "done",
        "",
    ]
    return "\n".join(lines)


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
    backend: str | None = None,
    save: str | None = None,
    save_every: int | None = None,
    keep_last: int | None = None,
    resume: str | None = None,
    resume_step: int | None = None,
    skip_nonfinite: bool = False,
    **training: Any,
) -> list[Path]:
    """Write the launch files for ``plan``; returns their paths.

    Args:
        master: ``HOST:PORT`` of the rendezvous, on the first node (not a loopback address when the
            plan spans several nodes: the others could not reach it).
        backend: ``nccl`` or ``gloo``; None: :func:`default_backend` (gloo on a CPU-only cluster).
        save, save_every, keep_last, resume, resume_step, skip_nonfinite: the worker's checkpoint
            and run options, as ``hetplan launch`` takes them (a relative folder is relative to the
            launch folder, where each node script runs).
        training: how the ranks train beyond the plan (optimizer, clipping, learning-rate schedule,
            dataset, compute device; :func:`build_rank_config`).
    """
    host, sep, port = master.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise HetplanError(f"expected HOST:PORT, got {master!r}", field="--master")
    out = Path(out_dir)
    used = {a for p in plan.pipelines for s in p.stages for a in s.devices}
    backend = backend or default_backend(cluster, used)
    if backend == "nccl" and default_backend(cluster, used) == "gloo":
        raise HetplanError(
            "backend nccl needs GPUs that run it, and this plan uses CPU, emulated or gloo-only devices; "
            "use --backend gloo",
            field="--backend",
        )
    if save_every is not None and not save:
        raise HetplanError("--save-every needs --save", field="--save-every")
    if keep_last is not None and not save:
        raise HetplanError("--keep-last needs --save", field="--keep-last")
    if resume_step is not None and not resume:
        raise HetplanError("--resume-step needs --resume", field="--resume-step")
    if backend == "gloo" and training.get("compute_device") is None and staged_gpus(cluster, used):
        training["compute_device"] = "cuda"  # what the cluster's host_staged nodes say the ranks run
    config = build_rank_config(plan, profile, cluster, seed=seed, lr=lr, backend=backend, **training)
    nodes = config["nodes"]
    if len(nodes) > 1 and _is_loopback(host):
        raise HetplanError(
            f"{host} is this machine's loopback address, which the other {len(nodes) - 1} node(s) cannot reach: "
            f"give the first node's ({nodes[0]['name']}) host name or address",
            field="--master",
        )
    config_path = out / "rank-config.yaml"
    write_yaml(config, config_path)
    written = [config_path]
    gpus = backend == "nccl" or config["training"].get("compute_device") == "cuda"
    paths = module_dirs(_user_modules(config))
    options = {"--save": save, "--save-every": save_every, "--keep-last": keep_last, "--resume": resume}
    options["--resume-step"] = resume_step
    extra = [str(x) for flag, value in options.items() if value is not None for x in (flag, value)]
    extra += ["--skip-nonfinite"] if skip_nonfinite else []
    for node_rank, node in enumerate(nodes):
        command = torchrun_command(
            nnodes=len(nodes),
            node_rank=node_rank,
            # the central process of wsp/sdpipe runs under the first node's agent, after its devices
            nproc=len(node["devices"]) + (1 if config.get("central", {}).get("node") == node["name"] else 0),
            endpoint=master,
            node=node["name"],
            config='"$HERE/rank-config.yaml"',
            steps=steps,
            log=f'"$HERE"/{shlex.quote("run-" + node["name"] + ".jsonl")}',
            extra=extra,
        )
        script = out / f"node-{node['name']}.sh"
        script.write_text(_node_script(node, command, gpus=gpus, paths=paths), encoding="utf-8")
        script.chmod(0o755)
        written.append(script)
    sbatch = out / "slurm.sbatch"
    sbatch.write_text(_slurm_script(cluster, nodes, host, out.name or ".", gpus=gpus), encoding="utf-8")
    written.append(sbatch)
    return written
