"""ZeRO-1 for one gradient group: the optimizer state and fp32 master weights sharded over its holders.

A plan with ``zero: 1`` keeps, on each of the ``H`` devices that hold a gradient group, only ``1/H``
of the group's optimizer state (and of its fp32 master copy); every holder still keeps the whole
gradient (this is stage 1 of ZeRO, not 2) and the whole weights. Per step the gradient is
**reduce-scattered** (each holder receives the sum of its shard), each holder **steps its shard**, and
the updated shards are **all-gathered** into every holder's weights. The numbers equal the replicated
optimizer's (the tests check it to 1e-6 for SGD, momentum, Adam and AdamW, fp32 and bf16) because the
four optimizers are elementwise: the update of one element depends on that element's gradient, state
and weight alone, so stepping a slice of a flat copy is stepping those elements.

**Layout.** The group's parameters, in the order the caller gives (every holder must give the same
names, shapes and order: blocks ascending, then ``named_parameters()`` order; checked at construction
with one small all-reduce), are flattened into one fp32 gradient buffer of ``N`` elements. Parameter
``i`` owns ``[offset_i, offset_i + numel_i)``; :attr:`Zero1Group.grad_buffer` is that buffer.
Shards are contiguous ranges of it (:func:`shard_bounds`):

* **equal** (the default): every holder gets ``ceil(N / H)`` elements, the last ones what is left (it
  may be fewer, even 0). The buffer is padded with zeros at its end to ``H * ceil(N / H)`` elements, so
  it is exactly ``H`` equal pieces: what ``reduce_scatter_tensor`` / ``all_gather_into_tensor`` need.
* **weighted** (``weights=[w_0, ..., w_{H-1}]``, e.g. the holders' speeds, so that a device twice as fast
  steps twice as many elements): holder ``r`` gets ``[round(N*W_{r-1}/W), round(N*W_r/W))`` with ``W_r``
  the prefix sums of the weights (the last bound is ``N``). No padding; the shards have unequal sizes, so
  the collectives are per holder (below). Every holder must pass the same weights (part of the check).

Correctness never depends on the shard sizes: a holder of an empty shard steps nothing and still
takes part in every collective.

**Collectives, chosen by backend** (``collectives=`` overrides, for tests):

* ``"reduce_scatter"`` (NCCL): equal shards use ``reduce_scatter_tensor`` (into a separate
  ``ceil(N/H)`` fp32 buffer) and ``all_gather_into_tensor``; weighted shards use one ``reduce`` to each
  holder of its range (in place in the buffer) and one ``broadcast`` from each holder of its range
  (NCCL's reduce-scatter and all-gather need equal pieces).
* ``"all_reduce"`` (**the gloo fallback**, any backend other than NCCL): the whole buffer is
  all-reduced and each holder reads its range (twice the bytes of a reduce-scatter; gloo has no real
  reduce-scatter on CPU: torch 2.13's ``ProcessGroupGloo`` implements ``reduce_scatter_tensor`` itself
  as an all-reduce then a chunk, and older gloo has none). The gather is gloo's ``all_gather`` into
  the ``H`` equal pieces (equal shards) or the per-holder ``broadcast`` (weighted).

Every reduction is a SUM, as the executor's all-reduce: gradients arrive already weighted by their
share of the global batch (each rank's loss is its samples' loss sum divided by the global batch), so
the sum is the global batch's gradient.

**Mixed precision.** The weights stay at their dtype (fp32, or fp16/bf16 under autocast); the gradient
buffer and the master shard are fp32, the optimizer state is fp32 (as :class:`~hetplan.runtime.
precision.Precision` keeps them). Each micro-batch's ``.grad`` (any dtype) is added into the buffer by
:meth:`Zero1Group.accumulate_one`, which then drops ``.grad``. After the step the updated master shard
is cast to the weights' dtype and gathered **into the memory of the gradient buffer** (reinterpreted
as the weights' dtype: it is free once the shard has stepped, and it is zeroed for the next step
anyway), then copied into the weights. Memory per holder, for a group of ``N`` elements with weights
of ``b`` bytes: ``b*N`` (weights) + ``4*N`` (gradient buffer, plus its padding) + ``4*N/H`` (fp32
master shard, **also under fp32**: the optimizer steps a flat copy, not the weights themselves) +
the optimizer's state on ``N/H`` elements (``4*N/H`` for momentum, ``8*N/H`` for Adam/AdamW) + under
NCCL equal shards a ``4*N/H`` reduce-scatter output; a ``b*N/H`` send buffer during the gather.

**Global-norm clipping and fp16 overflow.** After the reduce each holder holds the summed gradient
of its shard only. :meth:`Zero1Group.shard_sq_norm` (float64, as held: times the loss scale squared
under fp16) summed over *every* holder of every group, plus the non-ZeRO ranks' usual shares, is the
squared global norm; :meth:`Zero1Group.shard_has_inf` summed the same way sees every shard (a
non-finite contribution on any rank makes the sum non-finite on the holder of that element).

**Checkpoints.** :meth:`Zero1Group.state_dict` (a collective over the holders) returns full tensors
keyed by the caller's parameter names, in the form a replicated optimizer keeps them
(``optimizer.state[p]``: ``momentum_buffer``, ``step``, ``exp_avg``, ``exp_avg_sq``), and the full fp32
master weights; :meth:`Zero1Group.load_state_dict` takes the same (from a run sharded any other way,
or not sharded) and keeps its own shard. So a checkpoint keyed by block resumes under any sharding.
Scalar state (Adam's ``step``) is one value per shard: it is given to every parameter on saving, and
the largest of the parameters' values is taken on loading.

Wiring into the executor, per ``RankExecutor`` (``pg``: the group's process group, created as now)::

    # construction, for each gradient group in id order, when plan.zero == 1, len(g.devices) > 1 and
    # this rank holds it (blocks already on the device and cast by Precision.cast_model):
    named = [(f"{names[b]}/{pname}", p) for b in g.blocks if b in blocks
             for pname, p in blocks[b].named_parameters()]
    zero = Zero1Group(named, group=pg, optimizer=cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay)
    # Precision gets only the parameters no Zero1Group owns (zero.owns(p) is False)

    # in the post-accumulate-grad hook, every micro-batch:
    zero.accumulate_one(p)                    # instead of precision.accumulate_one(p)
    # when the group's gradients are final (the hook count, as now; same group order on every rank):
    works = zero.start_reduce()               # instead of the flat all-reduce; a list, maybe empty
    # at OPT, before the job's [loss, overflow, sq-norm] all-reduce:
    for w in works: wait(w, ...)              # hetplan.runtime.comm.wait; nothing to copy back
    overflow += zero.shard_has_inf()          # fp16 only (every holder adds its own)
    sq += zero.shard_sq_norm()                # EVERY holder, not only the lowest rank; leave the
                                              # group's parameters out of precision.grad_sq_sum(...)
    # after it (norm = sqrt(sq) / scale, coef = clip_coefficient(norm, max_norm), as now), per group
    # in id order:
    if overflow == 0:
        zero.set_lr(lr)
        zero.step(clip_coef=coef, loss_scale=scale)   # scale = precision.scaler.scale (1.0 unless fp16)
        for w in zero.start_gather(): wait(w, ...)
        zero.finish_gather()                  # weights updated, gradient buffer zeroed
    else:
        zero.zero_grad()                      # the step is skipped everywhere

``zero.state_tensors()`` lists what it holds for memory accounting; a checkpoint save calls
``zero.state_dict()`` on every holder (collective) and writes ``<block>/master/<pname>`` (fp16/bf16) and
``<block>/optim/<pname>/<key>`` from it on the first holder; a load calls ``zero.load_state_dict(optim,
masters)`` after the blocks' weights are loaded (``masters=None`` takes them from the weights).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hetplan.errors import HetplanError
from hetplan.runtime.optim import make_optimizer

__all__ = ["COLLECTIVES", "SCALAR_STATE_KEYS", "Zero1Group", "shard_bounds"]

#: How the gradient is reduced and the weights gathered: ``reduce_scatter`` (NCCL) or ``all_reduce``
#: (the gloo fallback). See the module docstring.
COLLECTIVES = ("reduce_scatter", "all_reduce")

#: Optimizer-state keys that hold one number per parameter, not one per element (torch's SGD, Adam and
#: AdamW keep only ``step``); every other tensor key has its parameter's shape.
SCALAR_STATE_KEYS = ("step",)

_WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# torch 2.13 renamed the flat collectives (the old names warn); older versions have only the old names
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def shard_bounds(numel: int, holders: int, weights: Sequence[float] | None = None) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` range of a flat buffer of ``numel`` elements each holder steps, in holder order.

    Without ``weights`` (or with all weights equal): ``ceil(numel / holders)`` each, the last holders
    what is left. With weights: proportional to them, bounds rounded from the prefix sums (so the
    sizes add up to ``numel`` exactly and the same inputs give the same bounds on every holder).
    """
    if holders < 1:
        raise HetplanError(f"a ZeRO-1 group needs at least one holder, not {holders}", field="holders")
    if numel < 0:
        raise HetplanError(f"a buffer cannot have {numel} elements", field="numel")
    if _equal(weights, holders):
        per = -(-numel // holders)
        return [(min(r * per, numel), min((r + 1) * per, numel)) for r in range(holders)]
    assert weights is not None
    total = math.fsum(weights)
    bounds, lo = [], 0
    for r in range(holders):
        hi = numel if r == holders - 1 else math.floor(numel * math.fsum(weights[: r + 1]) / total + 0.5)
        hi = max(lo, min(numel, hi))
        bounds.append((lo, hi))
        lo = hi
    return bounds


def _equal(weights: Sequence[float] | None, holders: int) -> bool:
    """True for equal shards; checks the weights otherwise (one per holder, positive, finite)."""
    if weights is None:
        return True
    if len(weights) != holders:
        raise HetplanError(f"{len(weights)} shard weights for {holders} holders (one per holder)", field="weights")
    if not all(isinstance(w, (int, float)) and math.isfinite(w) and w > 0 for w in weights):
        raise HetplanError(f"shard weights must be positive numbers, not {list(weights)}", field="weights")
    return len(set(weights)) == 1


class Zero1Group:
    """One gradient group's ZeRO-1 optimizer on one holder: gradient buffer, master shard, state shard.

    Read-only attributes callers may use: ``names``, ``params`` (in flattening order), ``offsets`` and
    ``sizes`` (each parameter's range of the flat buffer), ``numel``, ``bounds`` (every holder's
    ``[lo, hi)``), ``start``/``end`` (this holder's), ``holders``, ``index`` (this holder's place),
    ``ranks`` (global ranks in holder order), ``collectives``, ``grad_buffer``, ``master`` (the fp32
    shard, a flat ``nn.Parameter``) and ``optimizer`` (over ``[master]``).
    """

    def __init__(
        self,
        named_params: Sequence[tuple[str, nn.Parameter]],
        *,
        group: dist.ProcessGroup | None,
        optimizer: str,
        lr: float,
        weight_decay: float | None = None,
        weights: Sequence[float] | None = None,
        collectives: str | None = None,
    ) -> None:
        """``group``: the holders' process group (``None``: this rank is the only holder, no
        collectives). ``weights``: one per holder in group-rank order for weighted shards.
        ``collectives``: one of :data:`COLLECTIVES`; by default ``reduce_scatter`` on NCCL and
        ``all_reduce`` (the gloo fallback) on anything else."""
        self.names = [name for name, _ in named_params]
        self.params = [p for _, p in named_params]
        if not self.params:
            raise HetplanError("a ZeRO-1 group needs at least one parameter", field="params")
        if len(set(self.names)) != len(self.names):
            raise HetplanError("parameter names of a ZeRO-1 group must be unique", field="params")
        self.dtype = self.params[0].dtype
        self.device = self.params[0].device
        for name, p in named_params:
            if p.dtype != self.dtype or p.device != self.device:
                raise HetplanError(
                    f"{name} is {p.dtype} on {p.device}, the group's first parameter {self.dtype} on "
                    f"{self.device}: one dtype and one device per ZeRO-1 group",
                    field="params",
                )
        if self.dtype not in _WEIGHT_DTYPES:
            raise HetplanError(f"ZeRO-1 weights must be fp32, fp16 or bf16, not {self.dtype}", field="params")
        self.group = group
        self.ranks = dist.get_process_group_ranks(group) if group is not None else [0]
        self.holders = len(self.ranks)
        self.index = dist.get_rank(group) if group is not None else 0
        if collectives is None:
            backend = str(dist.get_backend(group)) if group is not None else ""
            collectives = "reduce_scatter" if "nccl" in backend else "all_reduce"
        if collectives not in COLLECTIVES:
            raise HetplanError(f"unknown collectives {collectives!r} (known: {', '.join(COLLECTIVES)})")
        self.collectives = collectives
        self.sizes = [p.numel() for p in self.params]
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.numel = sum(self.sizes)
        self.equal = _equal(weights, self.holders)
        self.bounds = shard_bounds(self.numel, self.holders, weights)
        self.start, self.end = self.bounds[self.index]
        self.per = -(-self.numel // self.holders)  # the padded piece of equal shards
        length = self.holders * self.per if self.equal else self.numel
        self.grad_buffer = torch.zeros(max(length, 1), dtype=torch.float32, device=self.device)
        self._grads = [
            self.grad_buffer[o : o + n].view(p.shape)
            for p, o, n in zip(self.params, self.offsets, self.sizes, strict=True)
        ]
        self._scatter_out = (
            torch.zeros(self.per, dtype=torch.float32, device=self.device)
            if self.holders > 1 and self.equal and collectives == "reduce_scatter"
            else None
        )
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1).float() for p in self.params])
            self.master = nn.Parameter(flat[self.start : self.end].clone())
        del flat
        self.optimizer = make_optimizer(optimizer, [self.master], lr, weight_decay=weight_decay)
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._send: torch.Tensor | None = None
        self._check_layout(optimizer, weights)

    # -- what it holds -------------------------------------------------------------------------------
    def owns(self, p: nn.Parameter) -> bool:
        """True if ``p`` is one of this group's parameters (its gradient and step are this object's)."""
        return id(p) in self._index

    def grad_of(self, p: nn.Parameter) -> torch.Tensor:
        """``p``'s gradient as accumulated here (a view of the fp32 buffer); summed only after the
        reduce for the elements of this holder's shard (all of them with ``all_reduce``)."""
        return self._grads[self._index[id(p)]]

    @property
    def shard_grad(self) -> torch.Tensor:
        """The summed fp32 gradient of this holder's shard (valid once the reduce has completed)."""
        if self._scatter_out is not None:
            return self._scatter_out[: self.end - self.start]
        return self.grad_buffer[self.start : self.end]

    def state_tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor this holds for the whole run besides the weights (for memory accounting)."""
        yield self.grad_buffer
        if self._scatter_out is not None:
            yield self._scatter_out
        yield self.master
        for state in self.optimizer.state.values():
            yield from (v for v in state.values() if isinstance(v, torch.Tensor))

    # -- per micro-batch -------------------------------------------------------------------------------
    def accumulate_one(self, p: nn.Parameter) -> None:
        """Add ``p``'s fresh ``.grad`` (any dtype) into the fp32 buffer and drop it; call from the
        post-accumulate-grad hook after each backward."""
        g = p.grad
        if g is not None:
            self._grads[self._index[id(p)]].add_(g)
            p.grad = None

    # -- per step ------------------------------------------------------------------------------------
    def start_reduce(self) -> list[dist.Work]:
        """Issue the gradient reduce (asynchronous): wait for every returned work before
        :meth:`shard_sq_norm`, :meth:`shard_has_inf` and :meth:`step`. Same order on every holder."""
        if self.holders == 1:
            return []
        group = self.group
        if self.collectives == "all_reduce":  # the gloo fallback: the whole buffer, then our range
            return [dist.all_reduce(self.grad_buffer, group=group, async_op=True)]
        if self.equal:
            return [_reduce_scatter_flat(self._scatter_out, self.grad_buffer, group=group, async_op=True)]
        return [
            dist.reduce(self.grad_buffer[lo:hi], dst=self.ranks[r], group=group, async_op=True)
            for r, (lo, hi) in enumerate(self.bounds)
            if hi > lo
        ]

    def shard_sq_norm(self) -> torch.Tensor:
        """The sum of squares of this holder's summed shard gradient (float64 scalar on the device);
        summed over every holder it is the group's share of the squared global norm."""
        return torch.linalg.vector_norm(self.shard_grad, 2, dtype=torch.float64).square()

    def shard_has_inf(self) -> int:
        """1 if this holder's summed shard gradient has an inf or NaN (fp16 overflow), else 0."""
        shard = self.shard_grad
        return int(shard.numel() > 0 and not bool(torch.isfinite(shard).all()))

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next step."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self, *, clip_coef: float = 1.0, loss_scale: float = 1.0) -> None:
        """Step the shard: its gradient times ``clip_coef / loss_scale`` (one multiplication, as
        :meth:`Precision.unscale_`), then the optimizer on the fp32 master shard. Only when no
        gradient anywhere overflowed (else :meth:`zero_grad`); then :meth:`start_gather`."""
        grad = self.shard_grad
        factor = clip_coef / loss_scale
        if factor != 1.0:
            grad.mul_(factor)
        self.master.grad = grad
        self.optimizer.step()
        self.master.grad = None

    def start_gather(self) -> list[dist.Work]:
        """Issue the all-gather of the updated shards into the gradient buffer's memory (as the
        weights' dtype; asynchronous): wait for every returned work, then :meth:`finish_gather`."""
        gathered = self._gather_view()
        size = self.end - self.start
        if self.holders == 1 or not self.equal:
            with torch.no_grad():
                gathered[self.start : self.end].copy_(self.master)
            if self.holders == 1:
                return []
            return [
                dist.broadcast(gathered[lo:hi], src=self.ranks[r], group=self.group, async_op=True)
                for r, (lo, hi) in enumerate(self.bounds)
                if hi > lo
            ]
        send = torch.zeros(self.per, dtype=self.dtype, device=self.device)
        with torch.no_grad():
            send[:size].copy_(self.master)
        self._send = send  # kept until the gather has completed
        out = gathered[: self.holders * self.per]
        if self.collectives == "reduce_scatter":
            return [_all_gather_flat(out, send, group=self.group, async_op=True)]
        return [dist.all_gather(list(out.split(self.per)), send, group=self.group, async_op=True)]

    def finish_gather(self) -> None:
        """Copy the gathered weights into the parameters and zero the gradient buffer."""
        gathered = self._gather_view()
        with torch.no_grad():
            for p, o, n in zip(self.params, self.offsets, self.sizes, strict=True):
                p.copy_(gathered[o : o + n].view_as(p))
        self._send = None
        self.zero_grad()

    def zero_grad(self) -> None:
        """Zero the gradient buffer and drop every ``.grad`` (after the gather, or instead of a step)."""
        self.grad_buffer.zero_()
        if self._scatter_out is not None:
            self._scatter_out.zero_()
        for p in self.params:
            p.grad = None

    def _gather_view(self) -> torch.Tensor:
        """The gradient buffer's memory seen as the weights' dtype (free after the step)."""
        return self.grad_buffer if self.dtype == torch.float32 else self.grad_buffer.view(self.dtype)

    # -- checkpoints -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Full state keyed by parameter name (a collective: every holder calls it, every holder gets
        all of it): ``{"master": {name: fp32 tensor}, "optim": {name: {key: value}}}`` with the
        optimizer state as a replicated optimizer keeps it per parameter. Under fp32 the masters are
        the weights themselves (not copies: equal to the master shards by construction), so a save
        holds the full optimizer state and one gathered flat tensor beyond what the step holds."""
        if self.dtype == torch.float32:  # fp32 weights are the master (gathered from it every step)
            masters = {name: p.detach() for name, p in self._named()}
        else:
            masters = self._split(self.master.detach())
        own = self.optimizer.state.get(self.master, {})
        optim: dict[str, dict[str, Any]] = {name: {} for name in self.names}
        for key in sorted(own):  # the same keys on every holder: they step together
            value = own[key]
            if value is None:
                continue
            if torch.is_tensor(value) and value.dim() == 1 and key not in SCALAR_STATE_KEYS:
                for name, part in self._split(value.detach()).items():
                    optim[name][key] = part
            else:
                for name in self.names:
                    optim[name][key] = value.detach().clone() if torch.is_tensor(value) else value
        return {"master": masters, "optim": optim}

    def load_state_dict(
        self, optim: Mapping[str, Mapping[str, Any]], masters: Mapping[str, torch.Tensor] | None = None
    ) -> None:
        """Keep this holder's shard of full per-parameter state (no collective). ``masters`` (fp32,
        full shapes) also sets the weights; without it the master shard is taken from the weights."""
        if masters is not None:
            missing = [n for n in self.names if n not in masters]
            if missing:
                raise HetplanError("no saved master weights", field=missing[0])
            flat = torch.cat([self._checked(name, p, masters[name]).reshape(-1).float() for name, p in self._named()])
        else:
            flat = torch.cat([p.detach().reshape(-1).float() for p in self.params])
        with torch.no_grad():
            self.master.copy_(flat[self.start : self.end])
            if masters is not None:
                for p, name in zip(self.params, self.names, strict=True):
                    p.copy_(masters[name])
        entries = [optim.get(name, {}) for name in self.names]
        keys = [{k for k, v in e.items() if v is not None} for e in entries]
        if not any(keys):
            self.optimizer.state.pop(self.master, None)
            return
        for name, k in zip(self.names, keys, strict=True):
            if k != keys[0]:
                raise HetplanError(
                    f"optimizer state keys {sorted(k)}, the group's first parameter has {sorted(keys[0])}: "
                    "a ZeRO-1 shard keeps one state for all",
                    field=name,
                )
        state: dict[str, Any] = {}
        for key in sorted(keys[0]):
            values = [e[key] for e in entries]
            if key in SCALAR_STATE_KEYS or not torch.is_tensor(values[0]):
                numbers = [float(v) for v in values]
                top = values[numbers.index(max(numbers))]
                state[key] = top.detach().clone() if torch.is_tensor(top) else top
                continue
            parts = [self._checked(name, p, v).reshape(-1) for (name, p), v in zip(self._named(), values, strict=True)]
            state[key] = torch.cat(parts)[self.start : self.end].to(self.device).clone()
        self.optimizer.state[self.master] = state

    def _split(self, shard: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every parameter's full tensor of a flat per-holder ``shard`` (a collective), each its own
        copy; at most one flat gathered tensor exists at a time beside them (a save's transient:
        what the memory walk prices, hetplan.simulate.memory.zero_checkpoint_bytes)."""
        full = self._gather_full(shard)
        parts = {name: full[o : o + n].view(p.shape).clone() for name, p, o, n in self._items()}
        del full
        return parts

    def _gather_full(self, shard: torch.Tensor) -> torch.Tensor:
        """The flat ``N``-element tensor whose holder ``r`` range is holder ``r``'s ``shard``."""
        if self.holders == 1:
            return shard.clone()
        widest = max(hi - lo for lo, hi in self.bounds)
        send = torch.zeros(widest, dtype=shard.dtype, device=shard.device)
        send[: shard.numel()].copy_(shard)
        out = torch.zeros(self.holders * widest, dtype=shard.dtype, device=shard.device)
        dist.all_gather(list(out.split(widest)), send, group=self.group)
        del send
        if self.equal:  # the pieces are consecutive: the flat tensor is the gathered one's head
            return out[: self.numel]
        return torch.cat([out[r * widest : r * widest + hi - lo] for r, (lo, hi) in enumerate(self.bounds)])

    def _items(self) -> Iterator[tuple[str, nn.Parameter, int, int]]:
        yield from zip(self.names, self.params, self.offsets, self.sizes, strict=True)

    def _named(self) -> Iterator[tuple[str, nn.Parameter]]:
        yield from zip(self.names, self.params, strict=True)

    @staticmethod
    def _checked(name: str, p: nn.Parameter, value: Any) -> torch.Tensor:
        if not torch.is_tensor(value) or tuple(value.shape) != tuple(p.shape):
            shape = list(value.shape) if torch.is_tensor(value) else type(value).__name__
            raise HetplanError(f"saved as {shape}, the parameter is {list(p.shape)}", field=name)
        return value.to(p.device)

    def _check_layout(self, optimizer: str, weights: Sequence[float] | None) -> None:
        """One small all-reduce: every holder must flatten the same parameters the same way."""
        if self.holders == 1:
            return
        text = repr(
            ([(n, tuple(p.shape)) for n, p in self._named()], str(self.dtype), optimizer, weights, self.collectives)
        )
        sig = zlib.crc32(text.encode())
        both = torch.tensor([sig, -sig], dtype=torch.int64, device=self.device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.group)
        if int(both[0]) != sig or int(both[1]) != -sig:
            raise HetplanError(
                f"the holders of a ZeRO-1 group (ranks {self.ranks}) give different parameters, dtypes, "
                "optimizers, shard weights or collectives",
                field="params",
            )
