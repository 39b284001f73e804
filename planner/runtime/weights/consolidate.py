"""A run's checkpoint back to the model's own ``state_dict``: ``hetplan consolidate CHECKPOINT -o DIR``.

    written = consolidate("ckpt/", "out/")       # out/model.safetensors; + out/config.json for HF
    model = transformers.AutoModelForCausalLM.from_pretrained("out/")

A checkpoint holds every block whole, keyed by block (:mod:`hetplan.runtime.checkpoint`: tensor
parallel shards are gathered and ZeRO-1 state joined on save, whatever plan saved it), so
consolidating needs no plan: each block is read alone and its keys renamed with
``zoo.state_dict_keys(index)`` to the model's own (``transformers`` names, the factory's
``nn.Sequential`` names, ``<block name>.<key>`` for the zoo). A tied parameter is written once,
under its canonical key, as ``save_pretrained`` does (``from_pretrained`` ties the head back).

Values: a parameter of an fp16/bf16 run is written as its fp32 master (what the optimizer steps);
everything else at the dtype it was saved with. For a ``transformers`` model the folder also gets
the model's ``config.json`` (``config.save_pretrained``), so ``from_pretrained`` loads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hetplan.errors import HetplanError
from hetplan.models import resolve_model
from hetplan.runtime.checkpoint import read_blocks, read_manifest, resolve_checkpoint
from hetplan.runtime.weights.init_from import SAFETENSORS

__all__ = ["Consolidated", "consolidate", "consolidated_state"]


@dataclass(frozen=True)
class Consolidated:
    """What :func:`consolidate` wrote: the files, the step, the tensor count and bytes."""

    files: list[Path]
    step: int
    tensors: int
    bytes: int


def consolidated_state(
    checkpoint: str | Path, *, step: int | None = None
) -> tuple[dict[str, torch.Tensor], int, object]:
    """The model's own state dict from a checkpoint, its step, and the model (the ``ZooModel``)."""
    manifest = read_manifest(resolve_checkpoint(checkpoint, step))
    zoo = resolve_model(manifest.model)
    names = zoo.block_names()
    state: dict[str, torch.Tensor] = {}
    blocks = read_blocks(manifest.folder, names)
    for index, name in enumerate(names):
        saved = blocks[name]
        keys = zoo.state_dict_keys(index)
        for key, value in saved.params.items():
            if key not in keys:
                raise HetplanError(
                    f"block {name!r} holds {key!r}, which this model's block does not", file=str(manifest.path)
                )
            full = keys[key]
            if full in state:  # a tied parameter: written once, under its canonical key
                continue
            state[full] = saved.master.get(key, value).contiguous()
    return state, manifest.step, zoo


def consolidate(checkpoint: str | Path, out_dir: str | Path, *, step: int | None = None) -> Consolidated:
    """Write ``out_dir/model.safetensors`` (and ``config.json`` for a ``transformers`` model)."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise HetplanError("writing safetensors needs the safetensors package: pip install safetensors",
                           field="consolidate") from None  # fmt: skip
    state, saved_step, zoo = consolidated_state(checkpoint, step=step)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HetplanError(f"cannot create the folder ({exc.strerror})", file=str(out)) from None
    files = [out / SAFETENSORS]
    save_file(state, str(files[0]), metadata={"format": "pt"})
    config = zoo.hf_config()
    if config is not None:
        config.save_pretrained(str(out))
        files.append(out / "config.json")
    total = sum(t.numel() * t.element_size() for t in state.values())
    return Consolidated(files=files, step=saved_step, tensors=len(state), bytes=total)
