"""Execute one rank's action list, step by step: forward, backward, send, receive, all-reduce, step.

Gradients are scaled so that one step equals a single-process step on the whole global batch: each
rank's loss is the SUM of its samples' losses divided by the global batch, micro-batches accumulate,
and each gradient group is all-reduced with SUM over every device that holds it (replicas and
pipelines alike); the shares of the batch are therefore weighted by their sample counts, exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from planner.models import resolve_model
from planner.runtime.comm import tag_of, wait
from planner.runtime.config import RuntimeConfig
from planner.runtime.data import micro_offsets, pipeline_offsets
from planner.runtime.optim import make_optimizer
from planner.runtime.textdata import batches_for
from planner.schedule.actions import Action, Kind
from planner.schedule.compile import CompiledPlan

__all__ = ["RankExecutor", "StepStats"]


@dataclass
class StepStats:
    iteration_s: float = 0.0
    compute_s: float = 0.0
    wait_s: float = 0.0
    comm_s: float = 0.0
    loss_sum: float = 0.0
    extra: dict = field(default_factory=dict)


def _io_shapes(zoo, seed: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Per-sample shape and dtype of every block's output.

    On the meta device first (no memory); a model whose blocks make tensors on a fixed device cannot
    run there, so then each block is built for real, one at a time, and run on a batch of one.
    """
    try:
        with torch.device("meta"):
            blocks = zoo.build_blocks(0, zoo.n_blocks, seed)
            x = torch.empty((1, *zoo.sample_shape()), dtype=zoo.input_dtype())
            shapes = []
            for b in blocks:
                x = b(x)
                shapes.append((tuple(x.shape[1:]), x.dtype))
        return shapes
    except (RuntimeError, NotImplementedError):
        pass
    x, _ = zoo.sample_batch(1, seed=seed, step=0)
    shapes = []
    with torch.no_grad():
        for i in range(zoo.n_blocks):
            x = zoo.build_block(i, seed)(x)
            shapes.append((tuple(x.shape[1:]), x.dtype))
    return shapes


class RankExecutor:
    """One device's part of a plan: its blocks, optimizer, peers, process groups and actions."""

    def __init__(
        self,
        config: RuntimeConfig,
        compiled: CompiledPlan,
        address: str,
        rank_of: dict[str, int],
        device: torch.device,
        *,
        emulate: bool,
    ) -> None:
        self.config = config
        self.address = address
        self.rank_of = rank_of
        self.device = device
        self.program = compiled.programs[address]
        self.actions: list[Action] = self.program.actions
        self.zoo = resolve_model(config.model)
        self.batches = batches_for(config.model, self.zoo, config.data)
        self.names = self.zoo.block_names()
        self.block_list = [
            b.to(device) for b in self.zoo.build_blocks(self.program.start, self.program.end, config.seed)
        ]
        self.blocks = {self.program.start + i: b for i, b in enumerate(self.block_list)}
        params = [p for b in self.block_list for p in b.parameters()]
        self.optimizer = make_optimizer(config.optimizer, params, config.lr)
        shapes = _io_shapes(self.zoo, config.seed)
        start = self.program.start
        self.in_shape, self.in_dtype = (
            (self.zoo.sample_shape(), self.zoo.input_dtype()) if start == 0 else shapes[start - 1]
        )
        self.out_shape, self.out_dtype = shapes[self.program.end - 1]
        self.first = start == 0
        self.last = self.program.end == config.n_blocks
        pipe = config.plan.pipelines[self.program.pipeline]
        self.pipe_offset = pipeline_offsets(config.plan)[self.program.pipeline]
        self.micro_offsets = micro_offsets(pipe.micro_batches)
        self.slowdown = config.devices[address].emulated_slowdown if emulate else 1.0
        # one process group per gradient group held by more than one device, created in the same
        # order on every rank (torch.distributed requires every rank to call new_group identically)
        self.groups: dict[int, tuple[dist.ProcessGroup | None, list[torch.nn.Parameter]]] = {}
        for g in compiled.groups:
            if len(g.devices) <= 1:
                continue
            ranks = sorted(rank_of[a] for a in g.devices)
            pg = dist.new_group(ranks)
            if address in g.devices:
                held = [p for b in g.blocks if b in self.blocks for p in self.blocks[b].parameters()]
                self.groups[g.id] = (pg, held)

    def _samples(self, micro: int) -> tuple[int, int]:
        """Global-batch indices ``[lo, hi)`` this device computes of micro-batch ``micro``."""
        base = self.pipe_offset + self.micro_offsets[micro] + self.program.offsets[micro]
        return base, base + self.program.counts[micro]

    def _compute(self, fn, stats: StepStats) -> None:
        start = time.perf_counter()
        fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - start
        if self.slowdown > 1.0:  # emulate a slower device type: labelled as emulation everywhere
            time.sleep(elapsed * (self.slowdown - 1.0))
            elapsed *= self.slowdown
        stats.compute_s += elapsed

    def run_step(self, step: int) -> StepStats:
        cfg = self.config
        stats = StepStats()
        begin = time.perf_counter()
        inputs = targets = None
        if self.first or self.last:
            inputs, targets = self.batches.sample_batch(cfg.global_batch, seed=cfg.seed, step=step)
        x_in: dict[int, torch.Tensor] = {}
        y_out: dict[int, torch.Tensor] = {}
        grad_out: dict[int, torch.Tensor] = {}
        losses: dict[int, torch.Tensor] = {}
        pending: list[tuple[dist.Work, str, torch.Tensor]] = []
        timeout = cfg.timeout_s

        def where(a: Action) -> str:
            return f"rank {dist.get_rank()} ({self.address}) step {step}: waiting on {a}"

        for a in self.actions:
            kind = a.kind
            if kind is Kind.RECV_ACT or kind is Kind.RECV_GRAD:
                grad = kind is Kind.RECV_GRAD
                micro = a.micro
                count = self.program.counts[micro]
                table = grad_out if grad else x_in
                if micro not in table:
                    shape, dtype = (self.out_shape, self.out_dtype) if grad else (self.in_shape, self.in_dtype)
                    table[micro] = torch.empty((count, *shape), dtype=dtype, device=self.device)
                lo = a.lo - self.program.offsets[micro]
                buf = torch.empty((a.hi - a.lo, *table[micro].shape[1:]), dtype=table[micro].dtype, device=self.device)
                t0 = time.perf_counter()
                work = dist.irecv(buf, src=self.rank_of[a.peer], tag=tag_of(micro, grad))
                wait(work, timeout_s=timeout, what=where(a))
                stats.wait_s += time.perf_counter() - t0
                table[micro][lo : lo + (a.hi - a.lo)] = buf
            elif kind is Kind.FORWARD:
                micro = a.micro
                lo, hi = self._samples(micro)
                if self.first:
                    x = inputs[lo:hi].to(self.device)
                else:
                    x = x_in[micro].requires_grad_(True)
                    x_in[micro] = x

                def forward(x=x, micro=micro, lo=lo, hi=hi) -> None:
                    y = x
                    for b in self.block_list:
                        y = b(y)
                    y_out[micro] = y
                    if self.last:
                        losses[micro] = self.zoo.loss(y, targets[lo:hi].to(self.device)) / cfg.global_batch

                self._compute(forward, stats)
            elif kind is Kind.SEND_ACT or kind is Kind.SEND_GRAD:
                grad = kind is Kind.SEND_GRAD
                micro = a.micro
                source = x_in[micro].grad if grad else y_out[micro]
                lo = a.lo - self.program.offsets[micro]
                piece = source[lo : lo + (a.hi - a.lo)].detach().contiguous()
                work = dist.isend(piece, dst=self.rank_of[a.peer], tag=tag_of(micro, grad))
                pending.append((work, where(a), piece))
            elif kind is Kind.BACKWARD:
                micro = a.micro

                def backward(micro=micro) -> None:
                    if self.last:
                        losses[micro].backward()
                    else:
                        y_out[micro].backward(grad_out.pop(micro))
                    if self.first or micro not in x_in:
                        y_out.pop(micro, None)

                self._compute(backward, stats)
                if self.last:
                    stats.loss_sum += float(losses.pop(micro).detach()) * cfg.global_batch
            elif kind is Kind.ALLREDUCE:
                pg, params = self.groups[a.group]
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
                flat = torch.cat([g.reshape(-1) for g in grads]) if grads else torch.zeros(1, device=self.device)
                t0 = time.perf_counter()
                work = dist.all_reduce(flat, group=pg, async_op=True)
                wait(work, timeout_s=timeout, what=where(a))
                stats.comm_s += time.perf_counter() - t0
                offset = 0
                for p, g in zip(params, grads, strict=True):
                    n = g.numel()
                    p.grad = flat[offset : offset + n].view_as(g).clone()
                    offset += n
            elif kind is Kind.STEP:
                t0 = time.perf_counter()
                for work, what, _ in pending:
                    wait(work, timeout_s=timeout, what=what)
                stats.comm_s += time.perf_counter() - t0
                pending.clear()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        # the mean loss over the global batch, the same on every rank
        total = torch.tensor([stats.loss_sum], dtype=torch.float64)
        work = dist.all_reduce(total, async_op=True)
        wait(
            work,
            timeout_s=timeout,
            what=f"rank {dist.get_rank()} ({self.address}) step {step}: waiting on the loss all-reduce",
        )
        stats.loss_sum = float(total[0]) / cfg.global_batch
        stats.iteration_s = time.perf_counter() - begin
        return stats
