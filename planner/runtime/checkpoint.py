"""Checkpoints keyed by block, so a run saved under one plan resumes under another.

One file per block (``block-0007.pt``): the block's parameters and, per parameter, its optimizer
state (and, for fp16/bf16 runs, its fp32 master copy, which the optimizer updates), plus the
step. Any rank that holds the block can write it (the holders agree after the
all-reduce); the first holder does. A resuming rank loads the files of the blocks it now holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from planner.errors import HetplanError
from planner.runtime.precision import Precision

__all__ = ["load_blocks", "save_blocks"]


def _path(folder: Path, index: int) -> Path:
    return folder / f"block-{index:04d}.pt"


def save_blocks(
    folder: str | Path,
    blocks: dict[int, torch.nn.Module],
    precision: Precision,
    *,
    step: int,
    names: list[str],
) -> None:
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    optimizer = precision.optimizer
    for index, block in blocks.items():
        masters = [precision.master_of(p) for p in block.parameters()]
        states = [_to_cpu(optimizer.state.get(m, {})) for m in masters]
        payload = {
            "name": names[index],
            "step": step,
            "params": {k: v.detach().cpu() for k, v in block.state_dict().items()},
            "optimizer": states,
        }
        if precision.mixed:
            payload["master"] = [m.detach().cpu().clone() for m in masters]
        tmp = _path(target, index).with_suffix(".tmp")
        torch.save(payload, tmp)
        tmp.replace(_path(target, index))


def _to_cpu(state: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.detach().cpu().clone() if torch.is_tensor(v) else v) for k, v in state.items()}


def load_blocks(
    folder: str | Path, blocks: dict[int, torch.nn.Module], precision: Precision, *, names: list[str]
) -> int:
    """Load every held block's parameters and optimizer state; returns the step to continue from."""
    source = Path(folder)
    step = 0
    for index, block in blocks.items():
        path = _path(source, index)
        if not path.is_file():
            raise HetplanError(f"no checkpoint for block {index} ({names[index]})", file=str(path))
        payload = torch.load(path, map_location="cpu", weights_only=False)
        if payload["name"] != names[index]:
            raise HetplanError(f"checkpoint holds block {payload['name']!r}, expected {names[index]!r}", file=str(path))
        device = next(block.parameters()).device if any(True for _ in block.parameters()) else torch.device("cpu")
        block.load_state_dict({k: v.to(device) for k, v in payload["params"].items()})
        saved_masters = payload.get("master") or [None] * len(payload["optimizer"])
        for p, state, saved in zip(block.parameters(), payload["optimizer"], saved_masters, strict=True):
            master = precision.master_of(p)
            if master is not p:  # fp16/bf16: the fp32 copy, saved or (from an fp32 run) the weights
                with torch.no_grad():
                    master.copy_(saved.to(device) if saved is not None else p.float())
                    p.copy_(master)
            elif saved is not None:  # an fp16/bf16 checkpoint resumed in fp32: the precise copy
                with torch.no_grad():
                    p.copy_(saved.to(device))
            if state:
                precision.optimizer.state[master] = {
                    k: (v.to(device) if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in state.items()
                }
        step = payload["step"]
    return step
