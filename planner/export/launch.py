"""torchrun scripts that number ranks as an export needs: one script a node, devices in the order given.

    files = node_scripts(u, '"$MEGATRON/pretrain_gpt.py" $(cat args.txt)', header="# ...\\n",
                         env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    files["node-node0.sh"]   # run on node0; the other nodes' scripts on theirs, at the same time

Each node gets its own script (as ``hetplan emit`` writes them) with one torchrun line: its
``--node-rank`` (a static rendezvous at the first node: torchrun then numbers ranks node by node in
node-rank order) and ``CUDA_VISIBLE_DEVICES`` listing the plan's devices on it, so local rank ``i``
is the ``i``-th device listed. ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes those indices the ones
``nvidia-smi`` and the cluster file use (CUDA's default order puts the fastest device first, which on
a node of mixed GPUs is not the index order). Flags are torchrun's
(https://pytorch.org/docs/stable/elastic/run.html).
"""

from __future__ import annotations

from hetplan.export.structure import Uniform

__all__ = ["MASTER_PORT", "TORCHRUN_FLAGS", "node_scripts", "script_name"]

#: torchrun flags written, from https://pytorch.org/docs/stable/elastic/run.html.
TORCHRUN_FLAGS = frozenset({"--nnodes", "--nproc-per-node", "--node-rank", "--master-addr", "--master-port", "-m"})
MASTER_PORT = 29500


def script_name(node: str) -> str:
    """The launch script of ``node`` (as ``hetplan emit`` names them)."""
    return f"node-{node}.sh"


def node_scripts(u: Uniform, command: str, *, header: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """One bash script per node, each with that node's torchrun line (run each on its node).

    ``env`` is exported before torchrun (after ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), in its order."""
    nodes = u.nodes()
    master = nodes[0][0]
    exports = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", **(env or {})}
    out: dict[str, str] = {}
    first = 0
    for rank, (node, indices) in enumerate(nodes):
        last = first + len(indices) - 1
        lines = ["#!/usr/bin/env bash", header.rstrip("\n"), f"# on {node}: ranks {first}-{last}", "set -e"]
        lines.append('cd "$(dirname "$0")"')
        lines += [f"export {key}={value}" for key, value in exports.items()]
        lines.append(
            f"CUDA_VISIBLE_DEVICES={','.join(map(str, indices))} torchrun --nnodes {len(nodes)} "
            f"--nproc-per-node {len(indices)} --node-rank {rank} --master-addr {master} "
            f"--master-port {MASTER_PORT} {command}"
        )
        out[script_name(node)] = "\n".join(lines) + "\n"
        first = last + 1
    return out
