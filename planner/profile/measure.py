"""Measure a real model block by block: times, parameters, saved activations, FLOPs.

    from hetplan.profile.measure import measure_profile
    profile = measure_profile({"family": "gpt", "config": {"layers": 4, "hidden": 256}},
                              micro_batches=(1, 2, 4, 8), device="cpu", warmup=2, repeat=5)
    profile.save("gpt.cpu.yaml")          # times under `cpu`, source: measured

For each micro-batch size the model's synthetic batch runs through the blocks in order, each block
on the real output of the one before (so every shape is real), with ``warmup`` untimed runs of each
block (at least one: it makes the next block's input). Then ``repeat`` timed **rounds**, each running
every block at every size once on its recorded input: a burst of load from elsewhere on the machine
then lands on a few samples of many medians instead of on all samples of one. The profile keeps
the **median** forward and backward time of each block and size, and the relative spread
``(max - min) / median`` of their sum. The forward is timed with autograd recording (as in
training); the backward is ``torch.autograd.backward(output, ones)`` with the block's input
requiring grad, so it computes the input and parameter gradients and nothing upstream; gradients
accumulate across runs, as across the micro-batches of a step. The last block's forward includes
the loss and its backward starts from the loss, as on the last pipeline stage. On CUDA the device
is synchronised before and after each timed region.

Per block, once, at the largest micro-batch (divided by it): forward FLOPs by
``torch.utils.flop_counter.FlopCounterMode`` (2 per multiply-add, matmuls and convolutions, as the
analytic profiles count), the bytes autograd saves for backward by
``torch.autograd.graph.saved_tensors_hooks`` (unique storages; see :func:`saved_storages`), and the
output's bytes. Parameters and their bytes are counted from the module.

``estimate_for`` carries the measured times to other catalog types by the roofline ratio
(:func:`hetplan.profile.carry.carry_times`), at the measured dtype: a CPU fp32 measurement becomes
a GPU **fp32** estimate (CUDA cores, no TF32 or half-precision tensor cores). docs/profiling.md
says how far to trust that.
"""

from __future__ import annotations

import contextlib
import functools
import math
import platform
import re
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from hetplan.contracts.catalog import DTYPES, Catalog, DeviceType, load_catalog
from hetplan.contracts.model_profile import Block, ModelProfile, SharedParams, TensorParallel, Timing
from hetplan.errors import HetplanError
from hetplan.models import ZooModel, resolve_model
from hetplan.models.gpt_tp import TpGroup, VocabParallelEmbedding, VocabParallelHead
from hetplan.models.plan_tp import shard_model_block
from hetplan.profile.carry import carry_times

__all__ = ["cuda_device_type", "measure_profile", "saved_bytes", "saved_storages", "storage_key"]

Progress = Callable[[int, int], None]

_TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# --------------------------------------------------------------------------- device names
def cuda_device_type(name: str, memory_bytes: float, catalog: Catalog | None = None) -> str | None:
    """The catalog type for a CUDA device name as ``torch.cuda.get_device_name`` gives it, or None.

    ``"NVIDIA H100 80GB HBM3"`` -> ``H100-SXM``; A100 and V100 are told apart by their memory
    (``memory_bytes``, as ``torch.cuda.get_device_properties(i).total_memory``). Names with a
    variant the catalog lacks (H100 NVL, H200 NVL, L40, 3090 Ti, ...) give None: the caller
    asks the user for ``--device-type``. ROCm builds of torch report AMD GPUs through the same
    call (``"AMD Instinct MI300X"``).
    """
    text = name.upper().replace("NVIDIA", "").replace("GEFORCE", "").replace("TESLA", "").strip()
    gib = memory_bytes / 2**30
    rules: list[tuple[str, str | Callable[[], str]]] = [
        (r"\bGH200\b", "GH200"),
        (r"\bB200\b", "B200"),
        (r"\bH200\b(?!.*\bNVL\b)", "H200"),
        (r"\bH100\b(?!.*\b(PCIE|NVL)\b)", "H100-SXM"),
        (r"\bH100\b.*\bPCIE\b", "H100-PCIe"),
        (r"\bMI300X\b", "MI300X"),
        (r"\bL40S\b", "L40S"),
        (r"\bA10G\b", "A10G"),
        (r"\bA100\b", lambda: "A100-80GB" if gib > 48 else "A100-40GB"),
        (r"\bV100\b", lambda: "V100-32GB" if gib > 24 else "V100-16GB"),
        (r"\bA10\b", "A10"),
        (r"\bL4\b", "L4"),
        (r"\bT4\b", "T4"),
        (r"\bRTX 4090\b(?! D)", "RTX-4090"),
        (r"\bRTX 3090\b(?! TI)", "RTX-3090"),
        (r"\bRTX 2080 TI\b", "RTX-2080Ti"),
        (r"\bRTX 2080\b(?! (TI|SUPER))", "RTX-2080"),
        (r"\bTITAN RTX\b", "TITAN-RTX"),
        (r"\bP100\b", "P100"),
    ]
    for pattern, result in rules:
        if re.search(pattern, text):
            found = result if isinstance(result, str) else result()
            if catalog is None or found in catalog:
                return found
            return None
    return None


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or what the platform module knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _resolve_device(device: str) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise HetplanError(f"expected a device such as 'cpu' or 'cuda', got {device!r}", field="--device") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise HetplanError(
                "CUDA was asked for but torch sees no CUDA device here; use --device cpu", field="--device"
            )
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise HetplanError(f"no CUDA device {index} (torch sees {torch.cuda.device_count()})", field="--device")
        return torch.device("cuda", index)
    if dev.type != "cpu":
        raise HetplanError(f"measuring on {dev.type!r} is not supported; use cpu or cuda", field="--device")
    return dev


# --------------------------------------------------------------------------- what one block keeps
StorageKey = tuple[str, int]


def storage_key(t: torch.Tensor) -> StorageKey:
    """Identity of the memory a tensor lives in: its device and its storage's address."""
    return str(t.device), t.untyped_storage().data_ptr()


def saved_storages(run: Callable[[], Any]) -> tuple[dict[StorageKey, int], Any]:
    """The storages autograd saves for backward while ``run()`` executes (bytes by
    :func:`storage_key`), and what ``run`` returned.

    Every tensor autograd saves passes the pack hook; it is counted by its **storage**, deduplicated
    by ``(device, data_ptr)``, each counted whole (``untyped_storage().nbytes()``) since a saved view
    keeps its whole base alive. The saved tensors stay alive as long as ``run``'s result (the graph
    holds them), so no two of them can share an address by reuse while they are counted.
    """
    seen: dict[StorageKey, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[storage_key(t)] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = run()
    return seen, result


def saved_bytes(run: Callable[[], Any], exclude: Iterable[torch.Tensor] = ()) -> tuple[float, Any]:
    """Bytes of :func:`saved_storages` less the storages of ``exclude``, and what ``run`` returned."""
    seen, result = saved_storages(run)
    skip = {storage_key(t) for t in exclude}
    return float(sum(n for key, n in seen.items() if key not in skip)), result


def _block_state(block: nn.Module) -> list[torch.Tensor]:
    return [*block.parameters(), *block.buffers()]


# --------------------------------------------------------------------------- timing
class _Clock:
    """What a timed region costs. On CUDA: wall time between synchronisations. On a CPU measured with
    one thread: the thread's CPU time, which other work on a shared machine does not inflate (a
    rank of ``hetplan launch`` runs with one thread too, and its emulation stretches CPU time); with
    several threads: wall time (one thread's CPU time would miss the others')."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.cpu_time = not self.cuda and torch.get_num_threads() == 1
        self.note = "cuda wall time" if self.cuda else ("thread cpu time" if self.cpu_time else "wall time")

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.thread_time() if self.cpu_time else time.perf_counter()


def _spread(values: Sequence[float]) -> float:
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid > 0 else 0.0


def _as_input(x: torch.Tensor) -> torch.Tensor:
    x = x.detach()
    return x.requires_grad_() if x.is_floating_point() else x


def _run_once(
    block: nn.Module, x: torch.Tensor, finish: Callable[[torch.Tensor], torch.Tensor] | None, clock: _Clock
) -> tuple[float, float, torch.Tensor]:
    """One forward (with ``finish``, the loss, if given) and its backward: (fwd s, bwd s, output)."""
    xin = _as_input(x)
    t0 = clock.now()
    output = block(xin)
    result = finish(output) if finish is not None else output
    t1 = clock.now()
    if not result.requires_grad:  # a block without parameters on an integer input
        return t1 - t0, 0.0, output.detach()
    grad = torch.ones_like(result)
    t2 = clock.now()
    torch.autograd.backward(result, grad)
    t3 = clock.now()
    return t1 - t0, t3 - t2, output.detach()


class _CarryDtype(nn.Module):
    """A block whose floating-point output is cast to the compute dtype (the runtime's boundary rule)."""

    def __init__(self, block: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.block = block
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return y.to(self.dtype) if y.is_floating_point() and y.dtype != self.dtype else y


def _timing(fwd: Sequence[float], bwd: Sequence[float]) -> Timing:
    return Timing(
        fwd=_sig(statistics.median(fwd)),
        bwd=_sig(statistics.median(bwd)),
        source="measured",
        spread=round(_spread([f + b for f, b in zip(fwd, bwd, strict=True)]), 4),
    )


def broadcast_kv_heads(query_shape, key_shape, value_shape) -> tuple[tuple, tuple, tuple]:
    """Key and value shapes with their heads broadcast to the query's (grouped-query attention):
    the FLOPs of the kernel, which repeats each key/value head for its group of query heads."""
    heads = query_shape[1]
    return tuple(query_shape), (key_shape[0], heads, *key_shape[2:]), (value_shape[0], heads, *value_shape[2:])


def sdpa_forward_flops(query_shape, key_shape, value_shape, *_args, out_shape=None, **_kwargs) -> int:
    """Scaled dot-product attention's forward FLOPs (2 per multiply-add: scores, then the weighted
    sum of values), key/value heads broadcast to the query's."""
    q, k, v = broadcast_kv_heads(query_shape, key_shape, value_shape)
    b, h, s_q, d = q
    return 2 * b * h * s_q * k[2] * d + 2 * b * h * s_q * k[2] * v[3]


def _cpu_sdpa() -> dict[Any, Callable[..., int]]:
    """The CPU's fused attention kernel, which torch's FLOP counter does not know (it counted 0
    FLOPs for the attention of every model calling ``scaled_dot_product_attention`` on a CPU, such as
    the transformers models, so their FLOPs, and the estimates carried from them, were too low)."""
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    return {op: sdpa_forward_flops} if op is not None else {}


@contextlib.contextmanager
def _gqa_flop_counting() -> Iterator[None]:
    """Counting FLOPs of grouped-query attention under torch versions whose counter refuses it.

    Before torch 2.13, ``torch.utils.flop_counter.sdpa_flop_count`` asserts that queries, keys and
    values have as many heads, so profiling any model with ``num_key_value_heads < heads`` (Llama 2
    70B, Llama 3, Mistral, TinyLlama) on a GPU, where transformers calls SDPA with ``enable_gqa``,
    ended in an internal error. Where the counter refuses such shapes, count them with the key/value
    heads broadcast (what the kernel computes); elsewhere change nothing."""
    import torch.utils.flop_counter as counter

    original = counter.sdpa_flop_count
    try:
        original((1, 2, 1, 1), (1, 1, 1, 1), (1, 1, 1, 1))
        counts_gqa = True
    except (AssertionError, RuntimeError):
        counts_gqa = False
    if counts_gqa:  # this torch counts grouped-query attention itself
        yield
        return
    counter.sdpa_flop_count = lambda q, k, v: original(*broadcast_kv_heads(q, k, v))
    try:
        yield
    finally:
        counter.sdpa_flop_count = original


def _stats(
    block: nn.Module, x: torch.Tensor, finish: Callable[[torch.Tensor], torch.Tensor] | None, m: int
) -> tuple[float, float, float]:
    """(forward FLOPs, bytes kept for backward, output bytes) per sample, from runs at micro-batch ``m``.

    Kept bytes leave out the block's parameters and buffers (not activations) and, except for the
    last block, its output: the next block counts it as its own input, the rule the analytic
    profiles follow, so summing over a stage counts each tensor once. The last block's output feeds
    the loss on the same device, so what the loss saves is counted with it.
    """
    with torch.no_grad(), _gqa_flop_counting(), FlopCounterMode(display=False, custom_mapping=_cpu_sdpa()) as counter:
        block(x.detach())
    flops = float(counter.get_total_flops())

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        out = block(_as_input(x))
        return out, (finish(out) if finish is not None else out)

    seen, (out, _result) = saved_storages(run)
    skip = {storage_key(t) for t in _block_state(block)}
    if finish is None:
        skip.add(storage_key(out))
    kept = float(sum(n for key, n in seen.items() if key not in skip))
    out_bytes = float(out.numel() * out.element_size())
    return flops / m, kept / m, out_bytes / m


def _loss_on(zoo: ZooModel, targets: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    return zoo.loss(output, targets)


def _head_loss_on(head: VocabParallelHead, targets: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    return head.loss(output, targets)


def _shard_loss(shard: nn.Module, finish: functools.partial) -> Callable[[torch.Tensor], torch.Tensor]:
    """The last block's loss at degree t: a vocabulary-parallel head's own (its slice of the
    logits), else the model's (``finish``, a :func:`_loss_on` partial holding the targets)."""
    if isinstance(shard, VocabParallelHead):
        return functools.partial(_head_loss_on, shard, finish.args[1])
    return finish


def _tp_allreduce_bytes(
    shard: nn.Module, out_bytes: float, x: torch.Tensor, finish: functools.partial | None, m: int
) -> float:
    """Bytes one member all-reduces per sample and pass (the contract's ``allreduce_bytes``, which
    the cost model counts in forward and in backward): a Megatron block its output; a
    vocabulary-parallel embedding its output in forward only; a vocabulary-parallel head its input
    gradient in backward and three fp32 numbers per token in forward."""
    if isinstance(shard, VocabParallelEmbedding):
        return out_bytes / 2.0
    if isinstance(shard, VocabParallelHead):
        tokens = finish.args[1].numel() / m if finish is not None else 0.0
        return (x.numel() * x.element_size() / m + 3 * 4 * tokens) / 2.0
    return out_bytes


class _Where:
    """The block and micro-batch being run; as a context manager, it turns a failure there into one
    located line."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.block = 0
        self.m = 0

    def __enter__(self) -> _Where:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            return
        name, m = self.names[self.block], self.m
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            raise HetplanError(
                f"out of memory in block {name} at micro-batch {m}; measure smaller sizes", field="--micro-batches"
            ) from exc
        if isinstance(exc, (ValueError, RuntimeError)):
            # e.g. BatchNorm in training mode with one value per channel (micro-batch 1 on a 1x1
            # feature map), or the CPU allocator running out of memory
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise HetplanError(f"block {name} failed at micro-batch {m}: {reason}", field="--micro-batches") from exc


def _check_counts(micro_batches: Sequence[int], warmup: int, repeat: int) -> tuple[int, ...]:
    sizes = tuple(micro_batches)
    if not sizes:
        raise HetplanError("expected at least one micro-batch size", field="--micro-batches")
    for m in sizes:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise HetplanError(f"expected positive integer micro-batch sizes, got {m!r}", field="--micro-batches")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise HetplanError(f"expected a warm-up count >= 0, got {warmup!r}", field="--warmup")
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise HetplanError(f"expected a repetition count >= 1, got {repeat!r}", field="--repeat")
    return tuple(sorted(set(sizes)))


def _resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype not in DTYPES:
        raise HetplanError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}", field="--dtype")
    if dtype == "tf32" and device.type != "cuda":
        raise HetplanError("tf32 is a CUDA tensor-core math mode; measure fp32 on the CPU", field="--dtype")
    return _TORCH_DTYPES[dtype]


class _MathMode:
    """On CUDA, TF32 matmuls and convolutions exactly when the dtype is tf32 (cuDNN allows TF32 by
    default, which would make an "fp32" measurement of a CNN a TF32 one); restored on exit.

    Uses the flags every torch >= 2.4 has (``torch.backends.cuda.matmul.allow_tf32``,
    ``torch.backends.cudnn.allow_tf32``). Newer torch refuses to read them once the newer
    ``fp32_precision`` API has been used in the process; then the math mode is left as found and
    :attr:`note` says so (it goes into the profile's ``source``).
    """

    def __init__(self, device: torch.device, dtype: str) -> None:
        self.active = device.type == "cuda"
        self.tf32 = dtype == "tf32"
        self.saved: list[tuple[Any, bool]] = []
        self.note = "tf32 matmuls and convolutions" if self.tf32 else "ieee fp32 matmuls and convolutions"

    def __enter__(self) -> _MathMode:
        if not self.active:
            return self
        for flags in (torch.backends.cuda.matmul, torch.backends.cudnn):
            try:
                old = bool(flags.allow_tf32)
                flags.allow_tf32 = self.tf32
            except (RuntimeError, AttributeError) as exc:
                self.note = f"left as found ({str(exc).splitlines()[0][:120]})"
                continue
            self.saved.append((flags, old))
        return self

    def __exit__(self, *exc: object) -> None:
        for flags, old in reversed(self.saved):
            with contextlib.suppress(RuntimeError):  # newer torch with the new API in use
                flags.allow_tf32 = old


def _device_type_name(device: torch.device, given: str | None, catalog: Catalog) -> str:
    if given:
        return catalog.canonical(given) or given
    if device.type == "cpu":
        return "cpu"
    props = torch.cuda.get_device_properties(device)
    found = cuda_device_type(props.name, props.total_memory, catalog)
    if found is None:
        raise HetplanError(
            f"cannot tell which catalog type {props.name!r} ({props.total_memory / 2**30:.0f} GiB) is; "
            f"name it with --device-type (catalog types: {', '.join(d.name for d in catalog)})",
            field="--device-type",
        )
    return found


def _describe(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {
            "backend": "cuda",
            "device": props.name,
            "memory_bytes": int(props.total_memory),
            "cuda": torch.version.cuda,
            "threads": torch.get_num_threads(),
        }
    return {"backend": "cpu", "device": cpu_name(), "threads": torch.get_num_threads()}


def _sig(x: float) -> float:
    """Six significant digits: the timing noise is far larger, and the YAML stays readable."""
    return float(f"{x:.6g}")


def measure_profile(
    model: dict[str, Any],
    *,
    micro_batches: tuple[int, ...] = (1, 2, 4, 8),
    device: str = "cpu",
    dtype: str = "fp32",
    warmup: int = 2,
    repeat: int = 5,
    seed: int = 0,
    estimate_for: Sequence[DeviceType] = (),
    progress: Progress | None = None,
    device_type_name: str | None = None,
    threads: int | None = None,
    tensor_parallel: Sequence[int] = (1,),
) -> ModelProfile:
    """Measure ``model`` (a profile's ``model`` section) block by block on ``device``.

    Args:
        model: ``{"family": ..., "config": {...}}`` or ``{"factory": "pkg.mod:fn", "config": {...},
            "input_shape": [...]}``, as :func:`hetplan.models.resolve_model` takes.
        micro_batches: sizes to time (sorted, duplicates dropped); include 1.
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        dtype: ``fp32``, ``tf32`` (CUDA only), ``fp16`` or ``bf16``: parameters and float inputs
            are cast to it; the loss is computed in fp32.
        warmup, repeat: untimed runs per block and size (at least one is made), timed rounds.
        seed: fixes the parameters and the synthetic batch.
        estimate_for: catalog types to carry the measured times to (marked ``estimated``).
        progress: called as ``progress(done, total)`` after each block run (warm-up and rounds).
        device_type_name: the name the times are filed under; default ``cpu`` on the CPU, else the
            catalog type of the CUDA device (see :func:`cuda_device_type`).
        threads: torch's intra-op threads while measuring (restored afterwards); default: torch's
            own choice. On a shared CPU, 1 avoids the stalls of threads waiting for a descheduled
            sibling, which can make a median 100x too slow (docs/profiling.md).
        tensor_parallel: degrees to measure (1 always is); for each ``t >= 2`` every block gets
            ``tensor_parallel[t]``: one member's parameters, saved bytes, all-reduce bytes and compute
            times (see :func:`_measure_degree`).

    Returns:
        A :class:`ModelProfile` with times under the device type name, ``source: measured``.

    Raises:
        HetplanError: a bad model section, CUDA asked for where there is none (``--device``), a
            CUDA device the catalog does not know (``--device-type``), bad counts, out of memory.

    Note:
        Every block stays on the device for the whole measurement, with its gradients and its input
        at every size, so peak memory is the whole model's weights and gradients, the block
        boundaries' tensors, and one block's activations at the largest micro-batch.
    """
    sizes = _check_counts(micro_batches, warmup, repeat)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise HetplanError(f"expected a positive thread count, got {threads!r}", field="--threads")
    dev = _resolve_device(device)
    torch_dtype = _resolve_dtype(dtype, dev)
    catalog = load_catalog()
    type_name = _device_type_name(dev, device_type_name, catalog)
    if estimate_for and type_name not in catalog:
        raise HetplanError(
            f"times measured as {type_name!r} cannot be carried to other types: it is not in the catalog",
            field="--device-type",
        )
    degrees = _check_degrees(tensor_parallel)
    zoo = resolve_model(model)
    with _Threads(threads):
        profile = _measure(zoo, sizes, dev, dtype, torch_dtype, type_name, warmup, repeat, seed, progress, degrees)
    if estimate_for:
        profile = carry_times(profile, type_name, list(estimate_for), catalog=catalog)
    return profile


class _Threads:
    def __init__(self, threads: int | None) -> None:
        self.threads = threads
        self.saved = torch.get_num_threads()

    def __enter__(self) -> None:
        if self.threads is not None:
            torch.set_num_threads(self.threads)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.saved)


def _measure(
    zoo: ZooModel,
    sizes: tuple[int, ...],
    dev: torch.device,
    dtype: str,
    torch_dtype: torch.dtype,
    type_name: str,
    warmup: int,
    repeat: int,
    seed: int,
    progress: Progress | None,
    degrees: tuple[int, ...] = (1,),
) -> ModelProfile:
    names, kinds = zoo.block_names(), zoo.block_kinds()
    n = zoo.n_blocks
    clock = _Clock(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    blocks = [b.to(device=dev, dtype=torch_dtype) for b in zoo.build_blocks(0, n, seed)]
    mixed = dtype in ("fp16", "bf16")
    if mixed:  # as the runtime runs them: every block's floating output carries the compute dtype
        blocks = [_CarryDtype(b, torch_dtype) for b in blocks]
    stats: list[tuple[float, float, float]] = [(0.0, 0.0, 0.0)] * n
    total, done = len(sizes) * n * (1 + repeat), 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    # each block's real input at each size, and the loss on that size's targets
    inputs: dict[int, list[torch.Tensor]] = {}
    finishes: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {}
    fwd: dict[tuple[int, int], list[float]] = {(i, m): [] for i in range(n) for m in sizes}
    bwd: dict[tuple[int, int], list[float]] = {(i, m): [] for i in range(n) for m in sizes}
    # fp16/bf16 under autocast, as the runtime trains them (planner/runtime/precision.py): softmax,
    # norms and the loss run in fp32, which changes both the times and the bytes saved for backward
    autocast = torch.autocast(dev.type, dtype=torch_dtype) if mixed else contextlib.nullcontext()
    with _MathMode(dev, dtype) as math_mode, _Where(names) as where, autocast:
        # pass 1, per size: the synthetic batch through the blocks, each warmed up on its real input
        for m in sizes:
            x, y = zoo.sample_batch(m, seed=seed, step=0)
            x = x.to(dev, dtype=torch_dtype) if x.is_floating_point() else x.to(dev)
            finishes[m] = functools.partial(_loss_on, zoo, y.to(dev))
            inputs[m] = []
            for i, block in enumerate(blocks):
                where.block, where.m = i, m
                finish = finishes[m] if i == n - 1 else None
                inputs[m].append(x)
                if m == sizes[-1]:
                    stats[i] = _stats(block, x, finish, m)
                out = x
                for _ in range(max(warmup, 1)):
                    *_, out = _run_once(block, x, finish, clock)
                x = out
                tick()
        # pass 2: the timed runs in rounds (every block and size once per round), so a burst of
        # load from elsewhere on the machine spreads over many medians instead of owning one
        for _ in range(repeat):
            for m in sizes:
                for i, block in enumerate(blocks):
                    where.block, where.m = i, m
                    f, b, _out = _run_once(block, inputs[m][i], finishes[m] if i == n - 1 else None, clock)
                    fwd[i, m].append(f)
                    bwd[i, m].append(b)
                    tick()
        selective = [_selective_bytes(block, inputs[sizes[-1]][i], sizes[-1]) for i, block in enumerate(blocks)]
        per_degree = {
            t: _measure_degree(
                zoo, t, blocks, inputs, finishes, sizes, dev, torch_dtype, type_name, warmup, repeat, seed
            )
            for t in degrees
            if t > 1
        }
    del inputs
    out_blocks = []
    shared, tied_ids = _shared_entries(zoo, blocks, names, per_degree)
    for i, block in enumerate(blocks):
        # a parameter blocks share (tied) is listed once, under ``shared``, not in any block
        params = list({id(p): p for p in block.parameters() if id(p) not in tied_ids}.values())
        flops, kept, out_bytes = stats[i]
        by_degree = {t: found[i] for t, found in per_degree.items()}
        times = {m: _timing(fwd[i, m], bwd[i, m]) for m in sizes}
        out_blocks.append(
            Block(
                name=names[i],
                kind=kinds[i],
                params=sum(p.numel() for p in params),
                param_bytes=float(sum(p.numel() * p.element_size() for p in params)),
                activation_bytes=kept,
                output_bytes=out_bytes,
                flops_fwd=flops,
                times={type_name: times},
                selective_bytes=selective[i],
                # a replicated block's times at degree t are its own (times {} from _measure_degree)
                tensor_parallel={
                    t: TensorParallel(
                        **{k: v for k, v in data.items() if k not in ("tied", "times")},
                        times=data["times"] or {type_name: dict(times)},
                    )
                    for t, data in by_degree.items()
                },
            )
        )
    element = torch.empty((), dtype=torch_dtype if zoo.input_dtype().is_floating_point else zoo.input_dtype())
    source: dict[str, Any] = {
        "tool": "hetplan measure",
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        **_describe(dev),
        "device_type": type_name,
        "warmup": warmup,
        "repeat": repeat,
        "seed": seed,
        "statistic": "median of the timed runs; spread = (max - min) / median of fwd + bwd",
        "flops": "torch.utils.flop_counter.FlopCounterMode: 2 per multiply-add, matmuls and convolutions",
        "activation_bytes": (
            "saved_tensors_hooks at the largest micro-batch, unique storages by (device, data_ptr), "
            "parameters, buffers and the block's output left out; per sample"
        ),
        "last_block": "forward and backward include the loss",
        "clock": clock.note,
    }
    if per_degree:
        source["tensor_parallel"] = (
            "per degree t: one member's shard (hetplan.models.gpt_tp) timed alone with its all-reduces left "
            "out (compute only, per device); allreduce_bytes = the block output's bytes; blocks without a "
            "tensor-parallel form are replicated (their degree-1 figures, no all-reduce)"
        )
    if dev.type == "cuda":
        source["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(dev))
        source["math"] = math_mode.note
    return ModelProfile(
        model=zoo.model,
        dtype=dtype,
        blocks=out_blocks,
        input_bytes=float(math.prod(zoo.sample_shape()) * element.element_size()),
        source=source,
        shared=shared,
    )


def _shared_entries(
    zoo: ZooModel, blocks: list[nn.Module], names: list[str], per_degree: dict[int, list[dict[str, Any]]]
) -> tuple[list[SharedParams], set[int]]:
    """The model's tied parameters as the profile's ``shared`` entries (named by their canonical
    member, ``<block>.<parameter>``; at each measured degree the member's shard, ``_measure_degree``'s
    ``tied`` figures), and the ids of the parameter objects they cover."""
    entries: list[SharedParams] = []
    ids: set[int] = set()
    for group in zoo.tied_parameters():
        owner, name = group[0]
        module = blocks[owner].block if isinstance(blocks[owner], _CarryDtype) else blocks[owner]
        p = module.get_parameter(name)
        ids.add(id(p))
        degrees = {}
        for t, found in per_degree.items():
            tied = found[owner].get("tied", {}).get(name)
            if tied is not None:
                degrees[t] = tied
        entries.append(
            SharedParams(
                name=f"{names[owner]}.{name}",
                params=p.numel(),
                param_bytes=float(p.numel() * p.element_size()),
                blocks=tuple(sorted({b for b, _ in group})),
                tensor_parallel=degrees,
            )
        )
    return entries, ids


# --------------------------------------------------------------------------- tensor parallelism
def _check_degrees(degrees: Sequence[int]) -> tuple[int, ...]:
    out = sorted(set(degrees) | {1})
    for t in out:
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise HetplanError(f"expected positive tensor-parallel degrees, got {t!r}", field="--tensor-parallel")
    return tuple(out)


def _selective_bytes(block: nn.Module, x: torch.Tensor, m: int) -> float:
    """Per sample: the bytes selective recomputation stops keeping (the attention core's; 0 for a
    block without one), as saved-tensor bytes with and without it."""
    cores = [mod for mod in block.modules() if hasattr(mod, "recompute_core")]
    if not cores:
        return 0.0

    def kept() -> float:
        seen, _ = saved_storages(lambda: block(_as_input(x)))
        skip = {storage_key(t) for t in _block_state(block)}
        return float(sum(n for key, n in seen.items() if key not in skip))

    plain = kept()
    for mod in cores:
        mod.recompute_core = True
    try:
        dropped = plain - kept()
    finally:
        for mod in cores:
            mod.recompute_core = False
    return max(dropped, 0.0) / m


def _measure_degree(
    zoo: ZooModel,
    t: int,
    blocks: list[nn.Module],
    inputs: dict[int, list[torch.Tensor]],
    finishes: dict[int, Callable[[torch.Tensor], torch.Tensor]],
    sizes: tuple[int, ...],
    dev: torch.device,
    torch_dtype: torch.dtype,
    type_name: str,
    warmup: int,
    repeat: int,
    seed: int,
) -> list[dict[str, Any]]:
    """Every block at tensor-parallel degree ``t``: the ``TensorParallel`` fields, per block.

    A block with a tensor-parallel form (:func:`hetplan.models.gpt_tp.shard_block`) is cut as the
    runtime cuts it and member 0's shard (every member's has the same shapes) is run alone, its
    all-reduces left out: the contract's times are compute only, per device, and the all-reduce is
    priced on the group's link by the cost model from ``allreduce_bytes`` (per pass: the block's
    output, once in forward and once in backward). The zoo GPT's embedding and head are cut by
    vocabulary rows, as the runtime cuts them by default (:class:`~hetplan.models.gpt_tp.VocabParallelHead`
    computes its own slice of the loss): the embedding all-reduces its output in forward only, the
    head its input gradient in backward and three fp32 numbers per token (row maximum, target logit,
    sum of exponentials) in forward, each averaged over the two passes as the analytic profile
    prices them. Timing the shard alone, not ``t`` ranks at once, also keeps ``t`` processes sharing
    this machine's cores from timing each other. A block without a tensor-parallel form (other
    families' blocks) is replicated in the group: its degree-1 figures, no all-reduce (times ``{}``,
    which the caller fills with the degree-1 times).
    """
    n = len(blocks)
    out: list[dict[str, Any]] = []
    group = TpGroup(None, t, 0, communicate=False, vocab=True)
    mixed = torch_dtype in (torch.float16, torch.bfloat16)
    clock = _Clock(dev)
    tied_names: dict[int, set[str]] = {}  # block -> its tied parameters' names (listed under ``shared``)
    for members in zoo.tied_parameters():
        for b, name in members:
            tied_names.setdefault(b, set()).add(name)
    for i, block in enumerate(blocks):
        inner = block.block if isinstance(block, _CarryDtype) else block
        params = [p for name, p in inner.named_parameters() if name not in tied_names.get(i, ())]
        full_params = sum(p.numel() for p in params)
        full = zoo.build_block(i, seed)
        shard = shard_model_block(zoo, i, full, group)
        if shard is full and not getattr(shard, "tp_specs", None):  # replicated (a plan's blocks are cut in place)
            m = sizes[-1]
            _, kept, _ = _stats(block, inputs[m][i], finishes[m] if i == n - 1 else None, m)
            out.append(
                {
                    "params": full_params,
                    "param_bytes": float(sum(p.numel() * p.element_size() for p in params)),
                    "activation_bytes": kept,
                    "allreduce_bytes": 0.0,
                    "times": {},
                    "selective_bytes": _selective_bytes(block, inputs[m][i], m),
                }
            )
            continue
        shard = shard.to(device=dev, dtype=torch_dtype)
        run: nn.Module = _CarryDtype(shard, torch_dtype) if mixed else shard
        ends = {s: _shard_loss(shard, finishes[s]) for s in sizes} if i == n - 1 else dict.fromkeys(sizes)
        m = sizes[-1]
        _, kept, out_bytes = _stats(run, inputs[m][i], ends[m], m)
        fwd: dict[int, list[float]] = {s: [] for s in sizes}
        bwd: dict[int, list[float]] = {s: [] for s in sizes}
        for s in sizes:
            for _ in range(max(warmup, 1)):
                _run_once(run, inputs[s][i], ends[s], clock)
        for _ in range(repeat):
            for s in sizes:
                f, b, _ = _run_once(run, inputs[s][i], ends[s], clock)
                fwd[s].append(f)
                bwd[s].append(b)
        own = [p for name, p in shard.named_parameters() if name not in tied_names.get(i, ())]
        tied = {
            name: (p.numel(), float(p.numel() * p.element_size()))
            for name, p in shard.named_parameters()
            if name in tied_names.get(i, ())
        }
        out.append(
            {
                "params": sum(p.numel() for p in own),
                "param_bytes": float(sum(p.numel() * p.element_size() for p in own)),
                "tied": tied,  # the tied parameters' shards (SharedParams.tensor_parallel), not a TensorParallel field
                "activation_bytes": kept,
                "allreduce_bytes": _tp_allreduce_bytes(shard, out_bytes, inputs[m][i], finishes[m], m),
                "times": {type_name: {s: _timing(fwd[s], bwd[s]) for s in sizes}},
                "selective_bytes": _selective_bytes(run, inputs[m][i], m),
            }
        )
    return out
