"""Probe this node: see the devices, time them, and return a :class:`~hetplan.probe.entry.ProbeResult`.

    result = probe_node(seconds=0.2)                 # short: a few seconds per GPU
    result = probe_node(seconds=2.0, long=True)      # larger matrices and copies: steadier figures

Short mode times 4096-square matmuls and 64 MiB copies on a GPU (512-square and 32 MiB on a CPU),
``seconds`` per figure; long mode 8192-square and 512 MiB (1024 and 128 MiB on a CPU). A matrix too
large for a device's free memory is halved until it fits.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from hetplan.contracts.catalog import Catalog, load_catalog
from hetplan.errors import HetplanError
from hetplan.probe.entry import DeviceFigures, ProbeResult
from hetplan.probe.seen import SeenDevice, cpu_name, pci_order_env, seen_devices, total_host_memory
from hetplan.probe.timing import copy_bandwidth, copy_latency, matmul_tflops
from hetplan.units import parse_bandwidth, parse_time

__all__ = ["probe_node"]

_GPU_DTYPES = ("fp32", "tf32", "fp16", "bf16")


def _sizes(long: bool, gpu: bool) -> tuple[int, int]:
    """(matmul side, copy bytes) for the mode and the device kind."""
    if gpu:
        return (8192, 512 * 2**20) if long else (4096, 64 * 2**20)
    return (1024, 128 * 2**20) if long else (512, 32 * 2**20)


def _node_name(name: str | None) -> str:
    chosen = name or socket.gethostname().split(".")[0] or "node0"
    if "/" in chosen or not chosen.strip():
        raise HetplanError(f"expected a node name without '/', got {chosen!r}", field="--name")
    return chosen


def _gpu_dtypes(torch: Any, device: Any) -> tuple[str, ...]:
    """The dtypes to time: all four, less bf16 where the GPU has no bf16 math (pre-Ampere)."""
    supported = getattr(torch.cuda, "is_bf16_supported", lambda **_: True)
    try:
        with torch.cuda.device(device):
            bf16 = bool(supported(including_emulation=False))
    except TypeError:  # an older signature
        with torch.cuda.device(device):
            bf16 = bool(supported())
    return tuple(dt for dt in _GPU_DTYPES if dt != "bf16" or bf16)


def _figures(
    torch: Any, device: Any, *, gpu: bool, long: bool, seconds: float, dtypes: tuple[str, ...]
) -> DeviceFigures:
    side, nbytes = _sizes(long, gpu)
    if gpu:
        free = torch.cuda.mem_get_info(device)[0]
        while side > 256 and 3 * side * side * 4 > free / 2:
            side //= 2
        nbytes = int(min(nbytes, free / 4))
    figures = DeviceFigures()
    for dtype in dtypes:
        figures.matmul_tflops[dtype] = matmul_tflops(torch, device, dtype, size=side, budget=seconds)
    figures.memory_bandwidth = copy_bandwidth(torch, device, device, nbytes=nbytes, budget=seconds)
    if gpu:
        host = torch.device("cpu")
        figures.host_to_device = copy_bandwidth(torch, host, device, nbytes=nbytes, budget=seconds)
        figures.device_to_host = copy_bandwidth(torch, device, host, nbytes=nbytes, budget=seconds)
        torch.cuda.empty_cache()
    return figures


def probe_node(
    *,
    seconds: float = 0.2,
    long: bool = False,
    name: str | None = None,
    network: str = "100Gbps",
    network_latency: str = "10us",
    catalog: Catalog | None = None,
    force_cpu: bool = False,
) -> ProbeResult:
    """Probe the devices of this node (GPUs if torch sees any, else the CPU).

    Args:
        seconds: timed seconds per figure (each figure takes at least three batches).
        long: larger matrices and copies (steadier, slower).
        name: the node's name in the entry (default: the host name).
        network, network_latency: the inter-node link written into the entry; not measured.
        force_cpu: describe the CPU even where a GPU is present.
    """
    if seconds <= 0:
        raise HetplanError(f"expected a positive number of seconds, got {seconds:g}", field="--seconds")
    for value, option in ((network, "--network"), (network_latency, "--network-latency")):
        try:
            parse_bandwidth(value) if option == "--network" else parse_time(value)
        except (ValueError, HetplanError) as exc:
            raise HetplanError(str(exc), field=option) from None
    order = pci_order_env()  # before torch initialises CUDA
    try:
        import torch
    except ImportError:
        raise HetplanError("probing needs torch: pip install torch==2.13.0", field="probe") from None
    catalog = catalog or load_catalog()
    node = _node_name(name)
    host = {
        "hostname": socket.gethostname(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count() or 1,
        "memory_bytes": total_host_memory(),
        "torch": torch.__version__,
        "cuda": getattr(torch.version, "cuda", None),
        "hip": getattr(torch.version, "hip", None),
        "cuda_device_order": order,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    }
    settings = {"seconds": seconds, "long": long}
    gpus = [] if force_cpu else seen_devices(torch, catalog)
    if not gpus:
        cpu = SeenDevice(index=0, name=host["cpu"], memory=host["memory_bytes"], pci_bus_id="", type=None,
                         sms=host["cpu_count"], kind="cpu")  # fmt: skip
        figures = _figures(torch, torch.device("cpu"), gpu=False, long=long, seconds=seconds, dtypes=("fp32",))
        return ProbeResult(node=node, devices=[cpu], figures=[figures], catalog=catalog, network=network,
                           network_latency=network_latency, host=host, settings=settings)  # fmt: skip
    figures_list = []
    for gpu in gpus:
        device = torch.device("cuda", gpu.index)
        figures_list.append(
            _figures(torch, device, gpu=True, long=long, seconds=seconds, dtypes=_gpu_dtypes(torch, device))
        )
    links: dict[str, float] = {}
    latency = 0.0
    if len(gpus) > 1:
        _, nbytes = _sizes(long, True)
        first = torch.device("cuda", gpus[0].index)
        for position, gpu in enumerate(gpus[1:], start=1):
            other = torch.device("cuda", gpu.index)
            links[f"0->{position}"] = copy_bandwidth(torch, first, other, nbytes=nbytes, budget=seconds)
            links[f"{position}->0"] = copy_bandwidth(torch, other, first, nbytes=nbytes, budget=seconds)
        latency = copy_latency(torch, first, torch.device("cuda", gpus[1].index), budget=seconds)
    return ProbeResult(node=node, devices=gpus, figures=figures_list, catalog=catalog, links=links,
                       link_latency=latency, network=network, network_latency=network_latency, host=host,
                       settings=settings)  # fmt: skip
