"""Checkpoints keyed by block, so a run saved under one plan resumes under another.

One file per block (``block-0007.pt``): the block's parameters and, per parameter, its optimizer
state, plus the step. Any rank that holds the block can write it (the holders agree after the
all-reduce); the first holder does. A resuming rank loads the files of the blocks it now holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from planner.errors import HetplanError

__all__ = ["load_blocks", "save_blocks"]


def _path(folder: Path, index: int) -> Path:
    return folder / f"block-{index:04d}.pt"


def save_blocks(
    folder: str | Path,
    blocks: dict[int, torch.nn.Module],
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    names: list[str],
) -> None:
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    for index, block in blocks.items():
        states = [_to_cpu(optimizer.state.get(p, {})) for p in block.parameters()]
        payload = {
            "name": names[index],
            "step": step,
            "params": {k: v.detach().cpu() for k, v in block.state_dict().items()},
            "optimizer": states,
        }
        tmp = _path(target, index).with_suffix(".tmp")
        torch.save(payload, tmp)
        tmp.replace(_path(target, index))


def _to_cpu(state: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.detach().cpu().clone() if torch.is_tensor(v) else v) for k, v in state.items()}


def load_blocks(
    folder: str | Path, blocks: dict[int, torch.nn.Module], optimizer: torch.optim.Optimizer, *, names: list[str]
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
        for p, state in zip(block.parameters(), payload["optimizer"], strict=True):
            if state:
                optimizer.state[p] = {
                    k: (v.to(device) if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in state.items()
                }
        step = payload["step"]
    return step
