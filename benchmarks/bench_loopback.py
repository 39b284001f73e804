"""What gloo over loopback costs on this machine: the link figures of the local emulated clusters.

    python benchmarks/bench_loopback.py            # a few seconds

Two processes, one torch thread each (as the ranks of ``hetplan launch``): a ping-pong of
blocking ``send``/``recv`` at several sizes (one-way time = half the round trip) and an
``all_reduce`` of the same sizes, 20 repetitions each. profiles/clusters/local-2.yaml and
local-4.yaml state their node link from this (latency about the one-way time of a few hundred KB,
bandwidth the slope between 1 and 4 MB). Prints a Markdown table and the command.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time

SIZES = (4096, 262144, 1048576, 4194304)
REPEAT = 20


def _worker(rank: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for nbytes in SIZES:
        t = torch.zeros(nbytes // 4)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(REPEAT):
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)
        one_way = (time.perf_counter() - start) / REPEAT / 2
        dist.barrier()
        start = time.perf_counter()
        for _ in range(REPEAT):
            dist.all_reduce(t)
        reduce = (time.perf_counter() - start) / REPEAT
        if rank == 0:
            print(
                f"| {nbytes:,} | {one_way * 1e6:.0f} us | {nbytes / one_way / 1e9:.2f} GB/s | {reduce * 1e6:.0f} us |",
                flush=True,
            )
    dist.destroy_process_group()


def main() -> None:
    if len(sys.argv) == 3:
        _worker(int(sys.argv[1]), int(sys.argv[2]))
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"`{shlex.join(['python', *sys.argv])}`\n")
    print("| bytes | send one way | effective rate | all_reduce (2 ranks) |")
    print("|---:|---:|---:|---:|")
    peer = subprocess.Popen([sys.executable, __file__, "1", str(port)])
    _worker(0, port)
    peer.wait()


if __name__ == "__main__":
    main()
