"""The Megatron-LM arguments hetplan writes, as Megatron's own parser defines them.

    MEGATRON_ARGUMENTS["--clip-grad"]        # Arg(type=float, default=1.0, group="regularization")

Transcribed from ``megatron/training/arguments.py`` of NVIDIA/Megatron-LM at commit
:data:`SOURCE_COMMIT` (read through the project's source search; Megatron-LM is not installable from
the package index). Only the arguments an export writes are listed, each with the type argparse
converts its value with (``None``: a ``store_true`` switch), its default (what Megatron does when
the flag is left out, which is why the export writes every optimizer setting explicitly), and the
``_add_*_args`` function that adds it. ``hetplan.export.megatron`` refuses to write a flag not listed
here, and ``tests/export`` parses every written value with the listed type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MEGATRON_ARGUMENTS", "SOURCE_COMMIT", "SOURCE_FILE", "Arg"]

SOURCE_FILE = "megatron/training/arguments.py"
SOURCE_COMMIT = "000c4ac24f61159c138b0975def722c65245983c"


@dataclass(frozen=True)
class Arg:
    """One ``group.add_argument`` of Megatron's parser."""

    type: type | None  # None: action='store_true'
    default: Any
    group: str
    choices: tuple[str, ...] = ()


MEGATRON_ARGUMENTS: dict[str, Arg] = {
    # _add_network_size_args
    "--num-layers": Arg(int, None, "network size"),
    "--hidden-size": Arg(int, None, "network size"),
    "--num-attention-heads": Arg(int, None, "network size"),
    "--max-position-embeddings": Arg(int, None, "network size"),
    "--untie-embeddings-and-output-weights": Arg(None, False, "network size"),
    # _add_data_args
    "--seq-length": Arg(int, None, "data"),
    # _add_regularization_args
    "--weight-decay": Arg(float, 0.01, "regularization"),
    "--clip-grad": Arg(float, 1.0, "regularization"),
    "--adam-beta1": Arg(float, 0.9, "regularization"),
    "--adam-beta2": Arg(float, 0.999, "regularization"),
    "--adam-eps": Arg(float, 1e-08, "regularization"),
    "--sgd-momentum": Arg(float, 0.9, "regularization"),
    # _add_training_args
    "--micro-batch-size": Arg(int, None, "training"),
    "--global-batch-size": Arg(int, None, "training"),
    "--recompute-granularity": Arg(str, None, "training", ("full", "selective")),
    "--recompute-method": Arg(str, None, "training", ("uniform", "block")),
    "--recompute-num-layers": Arg(int, None, "training"),
    "--optimizer": Arg(str, "adam", "training", ("adam", "sgd", "muon", "dist_muon")),
    # _add_learning_rate_args
    "--lr": Arg(float, None, "learning rate"),
    # _add_mixed_precision_args
    "--fp16": Arg(None, False, "mixed precision"),
    "--bf16": Arg(None, False, "mixed precision"),
    # _add_distributed_args
    "--tensor-model-parallel-size": Arg(int, 1, "distributed"),
    "--pipeline-model-parallel-size": Arg(int, 1, "distributed"),
    "--pipeline-model-parallel-layout": Arg(str, None, "distributed"),
    "--use-distributed-optimizer": Arg(None, False, "distributed"),
}
