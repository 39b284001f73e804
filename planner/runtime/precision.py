"""Training precision: fp32, or fp16/bf16 with fp32 master weights and dynamic loss scaling.

    precision = Precision("bf16", params, optimizer="adam", lr=1e-3)
    with precision.autocast(device):
        y = run_blocks(blocks, x, precision)
    precision.scale(loss).backward()
    precision.accumulate_one(p)             # per parameter after its backward: .grad -> fp32 buffer
    sq = precision.grad_sq_sum(params)      # for the global gradient norm (all-reduced by the caller)
    precision.set_lr(schedule.lr_at(step))
    ok = precision.step(nonfinite_anywhere=..., clip_coef=...)   # unscale, clip, step, copy back

What the memory model assumes (planner/simulate/memory.py) is what this holds. fp32 plans train the
parameters directly, as before. fp16 and bf16 plans keep the **weights** at the plan's dtype (the
forward and backward run on them under ``torch.autocast``, which keeps softmax, norms and the loss in
fp32), an fp32 **gradient buffer** per parameter that each micro-batch's half-precision ``.grad`` is
added into (Megatron's ``main_grad``: accumulating many micro-batches in bf16 would lose most of
their bits), and an fp32 **master copy** that the optimizer updates and whose state is fp32; after
each step the master copy is cast back into the weights. Gradient all-reduces run on the fp32
buffers. fp16 adds dynamic loss scaling (the defaults of ``torch.amp.GradScaler``: start at 2^16,
halve and skip the step when any gradient on any rank is not finite, double after 2000 good steps);
the skip must be decided by every rank together, so the caller counts non-finite values across the
job (an all-reduce) and passes the total to :meth:`Precision.step`.

Global-norm clipping needs the norm of the whole model's *unscaled* gradient, which only the job
knows: each rank adds up the squares of the gradients it counts (:meth:`Precision.grad_sq_sum`, on
the gradients as held, scaled by the loss scale under fp16: the scale is the same on every rank, so
the caller divides the all-reduced norm by it), and :meth:`Precision.step` unscales and clips in one
multiplication (``clip_coef / scale``) before stepping, which is what unscaling first and then
clipping does (the scale is a power of two).

The sync modes (:mod:`hetplan.runtime.executor`) keep the same rule: what leaves a rank is unscaled
and every rank whose update depends on an overflow skips with it. ``topk`` and ``adasum`` send
unscaled gradients (a non-finite value is sent as 0 and counted in the job-wide skip count);
``sdpipe`` counts overflows in the pipeline's own all-reduce (the pipeline skips, the others do not
depend on its gradient); ``wsp`` pushes the wave's unscaled gradient and flags an overflow, and the
parameter server then skips that clock for every worker, each of which backs its scale off.

Block boundaries carry the compute dtype: every block's floating-point output is cast to it, in the
runtime and in the single-process reference alike, so where a plan cuts the model does not change
the numbers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from hetplan.runtime.optim import make_optimizer

__all__ = ["TORCH_DTYPES", "LossScaler", "Precision", "run_blocks"]

TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class LossScaler:
    """Dynamic loss scaling (fp16 only; a scale of 1 that never changes otherwise)."""

    def __init__(self, *, enabled: bool, init_scale: float = 2.0**16, growth_interval: int = 2000) -> None:
        self.enabled = enabled
        self.scale = init_scale if enabled else 1.0
        self.growth_interval = growth_interval
        self.good_steps = 0

    def update(self, *, finite: bool) -> None:
        """After a step: halve on overflow (the step was skipped), double after a run of good steps."""
        if not self.enabled:
            return
        if not finite:
            self.scale *= 0.5
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= 2.0
            self.good_steps = 0


class Precision:
    """The weights, gradient buffers, master copy, optimizer and loss scale of one rank."""

    def __init__(
        self,
        dtype: str,
        params: Sequence[nn.Parameter],
        *,
        optimizer: str,
        lr: float,
        weight_decay: float | None = None,
    ) -> None:
        self.dtype = dtype
        self.torch_dtype = TORCH_DTYPES[dtype]
        self.mixed = dtype in ("fp16", "bf16")
        self.params = list(params)
        self.scaler = LossScaler(enabled=dtype == "fp16")
        # a rank whose parameters are all stepped elsewhere (ZeRO-1 groups) still has an optimizer, over
        # one empty tensor: torch refuses an empty parameter list, and stepping nothing is a no-op
        stepped = None if self.params else [nn.Parameter(torch.zeros(0))]
        if self.mixed:
            self.master = [nn.Parameter(p.detach().float().clone()) for p in self.params]
            self.main_grads = [torch.zeros_like(m) for m in self.master]
            self.optimizer = make_optimizer(optimizer, stepped or self.master, lr, weight_decay=weight_decay)
        else:
            self.master = self.params
            self.main_grads = []
            self.optimizer = make_optimizer(optimizer, stepped or self.params, lr, weight_decay=weight_decay)
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._unscaled = False  # the optimizer's gradients are made (unscaled, clipped) this step

    @staticmethod
    def cast_model(blocks: Sequence[nn.Module], dtype: str) -> None:
        """Weights at the compute dtype for fp16/bf16 (in place); fp32 leaves them as they are."""
        if dtype in ("fp16", "bf16"):
            for b in blocks:
                b.to(TORCH_DTYPES[dtype])

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.torch_dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scaler.scale if self.scaler.enabled else loss

    def grad_of(self, p: nn.Parameter) -> torch.Tensor | None:
        """The gradient that is all-reduced and stepped: the fp32 buffer, or ``.grad`` for fp32."""
        if self.mixed:
            return self.main_grads[self._index[id(p)]]
        return p.grad

    def holds(self, p: nn.Parameter) -> bool:
        """True if this steps ``p`` (False for a parameter a ZeRO-1 group steps)."""
        return id(p) in self._index

    def master_of(self, p: nn.Parameter) -> nn.Parameter:
        """The tensor the optimizer updates for ``p``: its fp32 master copy, or ``p`` itself."""
        return self.master[self._index[id(p)]]

    def accumulate_one(self, p: nn.Parameter) -> None:
        """Move one parameter's fresh half-precision gradient into its fp32 buffer."""
        if self.mixed and p.grad is not None:
            self.main_grads[self._index[id(p)]].add_(p.grad)
            p.grad = None

    def nonfinite(self) -> int:
        """1 if any gradient this rank holds is inf or NaN (fp16 only: the others never skip)."""
        if not self.scaler.enabled:
            return 0
        for g in self.main_grads:
            if not bool(torch.isfinite(g).all()):
                return 1
        return 0

    def grad_sq_sum(self, params: Sequence[nn.Parameter]) -> torch.Tensor:
        """The sum of squares of ``params``' gradients as held (times the loss scale squared under
        fp16), a float64 scalar on their device: this rank's share of the squared global norm.

        Per tensor the 2-norm in fp32 (as ``clip_grad_norm_``), squared and added up in float64,
        so that the sum over ranks does not depend on how the model was cut.
        """
        grads = [g for g in (self.grad_of(p) for p in params) if g is not None]  # None: not reached
        if not grads:
            device = params[0].device if params else torch.device("cpu")
            return torch.zeros((), dtype=torch.float64, device=device)
        norms = torch.stack([torch.linalg.vector_norm(g, 2, dtype=torch.float32) for g in grads])
        return norms.double().square().sum()

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next step (every parameter group)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def unscale_(self, clip_coef: float = 1.0) -> None:
        """Make the gradients the optimizer steps: the fp32 buffers (or fp32 ``.grad``) times
        ``clip_coef`` and divided by the loss scale, in one multiplication. Once per step."""
        if self._unscaled:
            return
        factor = clip_coef / self.scaler.scale if self.scaler.enabled else clip_coef
        if self.mixed:
            for m, g in zip(self.master, self.main_grads, strict=True):
                m.grad = g.mul_(factor) if factor != 1.0 else g
        elif factor != 1.0:
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(factor)
        self._unscaled = True

    def step(self, *, nonfinite_anywhere: int, clip_coef: float = 1.0) -> bool:
        """Unscale and clip (by ``clip_coef``, the same on every rank), step (unless a gradient
        anywhere overflowed), reset gradients; True if stepped."""
        finite = nonfinite_anywhere == 0
        if finite:
            self.unscale_(clip_coef)
            self.optimizer.step()
            if self.mixed:
                with torch.no_grad():
                    for p, m in zip(self.params, self.master, strict=True):
                        p.copy_(m)
        self.zero_grad()
        self.scaler.update(finite=finite)
        return finite

    def zero_grad(self) -> None:
        self._unscaled = False
        if self.mixed:
            for m in self.master:
                m.grad = None
            for g in self.main_grads:
                g.zero_()
            for p in self.params:
                p.grad = None
        else:
            self.optimizer.zero_grad(set_to_none=True)

    def state_tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor this holds for the whole run (for memory accounting)."""
        yield from self.params
        if self.mixed:
            yield from self.master
            yield from self.main_grads
        else:
            yield from (p.grad for p in self.params if p.grad is not None)
        for state in self.optimizer.state.values():
            yield from (v for v in state.values() if isinstance(v, torch.Tensor))


def run_blocks(blocks: Sequence[nn.Module], x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Run ``blocks`` in order; under fp16/bf16 every block's floating output carries ``dtype``."""
    cast = dtype != torch.float32
    if cast and x.is_floating_point():
        x = x.to(dtype)
    for b in blocks:
        x = b(x)
        if cast and x.is_floating_point() and x.dtype != dtype:
            x = x.to(dtype)
    return x
