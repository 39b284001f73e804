"""The runtime's tensor-parallel stage beside torch.distributed.tensor.parallel, on the same blocks.

    python benchmarks/bench_tensor_parallel.py                       # TP 2, about 1 minute on 2 cores
    python benchmarks/bench_tensor_parallel.py --tp 4 --repeats 5

Both sides train the same stack of zoo GPT blocks (``layers`` x [attention, MLP], pre-LN, the
runtime's :mod:`hetplan.models.gpt_tp` blocks cut from the full deterministic blocks) on ``--tp``
gloo ranks of this machine, one thread each, with the same shapes, batch and SGD step:

* **hetplan**: :func:`hetplan.models.gpt_tp.shard_block` (column-parallel QKV and up-projection,
  row-parallel output and down-projection, Megatron's f/g operators as autograd functions with
  explicit all-reduces on the group's process group);
* **torch TP**: the same full blocks, with separate q, k, v projections (DTensor's column split of a
  fused QKV would cut across q, k and v; torch's TP tutorial does the same), parallelized by
  ``parallelize_module`` with ``ColwiseParallel`` (q, k, v, up) and ``RowwiseParallel`` (proj, down)
  on a one-dimensional CPU device mesh.

Both are first checked to give the same output as the one-process blocks (to 1e-5). Then the two
alternate, ``--repeats`` rounds of ``--steps`` timed steps each (after ``--warmup``), so both see the
same background load; per round samples/s = batch x steps / the slowest rank's time. Prints a
Markdown table (median of the rounds, and the per-round ratio hetplan / torch TP), the command and
the load average.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

from hetplan.models import resolve_model  # noqa: E402
from hetplan.models.gpt import Attention, attention_core  # noqa: E402
from hetplan.models.gpt_tp import TpGroup, shard_block  # noqa: E402


class SplitQkvAttention(nn.Module):
    """The zoo attention with q, k and v as three layers (the same weights), for DTensor's column split;
    the head count is read from the local width, as torch's TP tutorial does."""

    def __init__(self, full: Attention) -> None:
        super().__init__()
        h = full.qkv.in_features
        self.head_dim = h // full.heads
        self.norm = full.norm
        self.q, self.k, self.v = (nn.Linear(h, h) for _ in range(3))
        self.proj = full.proj
        with torch.no_grad():
            for i, layer in enumerate((self.q, self.k, self.v)):
                layer.weight.copy_(full.qkv.weight[i * h : (i + 1) * h])
                layer.bias.copy_(full.qkv.bias[i * h : (i + 1) * h])
        self.register_buffer("mask", full.mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        y = self.norm(x)
        q, k, v = self.q(y), self.k(y), self.v(y)
        heads = q.shape[-1] // self.head_dim
        return x + self.proj(attention_core(q, k, v, heads, self.mask[:t, :t]))


def _model(args: argparse.Namespace) -> dict:
    config = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "seq": args.seq, "vocab": 64}
    return {"family": "gpt", "config": config}


def _blocks(args: argparse.Namespace) -> list[nn.Module]:
    zoo = resolve_model(_model(args))
    return zoo.build_blocks(1, zoo.n_blocks - 1, seed=0)  # every attention and MLP block


def _torch_tp(args: argparse.Namespace, mesh) -> list[nn.Module]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    out = []
    for b in _blocks(args):
        if isinstance(b, Attention):
            b = SplitQkvAttention(b)
            plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "proj": RowwiseParallel()}
        else:
            plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
        out.append(parallelize_module(b, mesh, plan))
    return out


def _train_step(blocks: list[nn.Module], opt: torch.optim.Optimizer, x: torch.Tensor, w: torch.Tensor) -> None:
    y = x
    for b in blocks:
        y = b(y)
    (y * w).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _forward(blocks: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        for b in blocks:
            x = b(x)
    return x


def _rank(rank: int, size: int, port: int, args: argparse.Namespace, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (size,))
    group = TpGroup(dist.group.WORLD, size, rank, tuple(range(size)))
    ours = [shard_block(b, group) for b in _blocks(args)]
    theirs = _torch_tp(args, mesh)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.seq, args.hidden, generator=gen)
    w = torch.randn(args.batch, args.seq, args.hidden, generator=gen) / math.sqrt(x.numel())
    reference = _forward(_blocks(args), x)
    diffs = [float((_forward(ours, x) - reference).abs().max()), float((_forward(theirs, x) - reference).abs().max())]
    variants = {
        "hetplan": (ours, torch.optim.SGD([p for b in ours for p in b.parameters()], lr=1e-3)),
        "torch TP": (theirs, torch.optim.SGD([p for b in theirs for p in b.parameters()], lr=1e-3)),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, (blocks, opt) in variants.items():
            for _ in range(args.warmup):
                _train_step(blocks, opt, x, w)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                _train_step(blocks, opt, x, w)
            elapsed = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time
            times[name].append(float(elapsed))
    if rank == 0:
        torch.save({"times": times, "diffs": diffs}, f"{folder}/result.pt")
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel degree (gloo ranks)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before each round")
    parser.add_argument("--repeats", type=int, default=5, help="rounds (the variants alternate)")
    args = parser.parse_args(argv)
    before = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_rank, args=(args.tp, _free_port(), args, folder), nprocs=args.tp, join=True)
        result = torch.load(f"{folder}/result.pt")
    times, diffs = result["times"], result["diffs"]
    if max(diffs) > 1e-5:
        raise SystemExit(f"the two sides differ from the one-process blocks: {diffs}")
    rate = {name: [args.batch * args.steps / t for t in ts] for name, ts in times.items()}
    ratios = [a / b for a, b in zip(rate["hetplan"], rate["torch TP"], strict=True)]
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    given = shlex.join(argv if argv is not None else sys.argv[1:])
    print(f"`python benchmarks/bench_tensor_parallel.py{' ' + given if given else ''}`")
    print(
        f"\nTP {args.tp} on {args.tp} gloo ranks (1 thread each); {args.layers} layers, hidden {args.hidden}, "
        f"{args.heads} heads, seq {args.seq}, batch {args.batch}; {args.repeats} rounds of {args.steps} steps; "
        f"outputs equal the one-process blocks within {max(diffs):.1e}; load average (1/5/15 min) before: "
        f"{before}, after: {load}; {time.strftime('%H:%M UTC', time.gmtime())}\n"
    )
    print("| variant | samples/s (median) | per round |")
    print("|---|---:|---|")
    for name, values in rate.items():
        print(f"| {name} | {statistics.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)} |")
    print(
        f"| **ratio hetplan / torch TP** | **{statistics.median(ratios):.2f}** | "
        f"{', '.join(f'{r:.2f}' for r in ratios)} |"
    )


if __name__ == "__main__":
    main()
