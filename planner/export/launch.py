"""torchrun lines that number ranks as an export needs: node by node, devices in the order given.

    text = torchrun_script(uniform, '"$MEGATRON/pretrain_gpt.py" $(cat args.txt)', header="# ...\\n")

Each node gets its own line with ``--node-rank`` (a static rendezvous at the first node: torchrun
then numbers ranks node by node in node-rank order) and ``CUDA_VISIBLE_DEVICES`` listing the
plan's devices on it, so local rank ``i`` is the ``i``-th device listed. Flags are torchrun's
(https://pytorch.org/docs/stable/elastic/run.html).
"""

from __future__ import annotations

from hetplan.export.structure import Uniform

__all__ = ["MASTER_PORT", "TORCHRUN_FLAGS", "torchrun_script"]

#: torchrun flags written, from https://pytorch.org/docs/stable/elastic/run.html.
TORCHRUN_FLAGS = frozenset({"--nnodes", "--nproc-per-node", "--node-rank", "--master-addr", "--master-port", "-m"})
MASTER_PORT = 29500


def torchrun_script(u: Uniform, command: str, *, header: str) -> str:
    """A bash script with one torchrun line per node (run each line on its node)."""
    nodes = u.nodes()
    master = nodes[0][0]
    lines = ["#!/usr/bin/env bash", header.rstrip("\n"), 'cd "$(dirname "$0")"']
    first = 0
    for rank, (node, indices) in enumerate(nodes):
        last = first + len(indices) - 1
        lines.append(f"# on {node}: ranks {first}-{last}")
        lines.append(
            f"CUDA_VISIBLE_DEVICES={','.join(map(str, indices))} torchrun --nnodes {len(nodes)} "
            f"--nproc-per-node {len(indices)} --node-rank {rank} --master-addr {master} "
            f"--master-port {MASTER_PORT} {command}"
        )
        first = last + 1
    return "\n".join(lines) + "\n"
