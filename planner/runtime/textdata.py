"""Character-level language-model batches from any text file (``hetplan launch --data FILE``).

    data = TextData("book.txt", seq=64, vocab=512)
    inputs, targets = data.sample_batch(32, seed=0, step=7)   # [32, 64] character ids, next characters

The file's distinct bytes, sorted, are the characters (ids 0..k-1; the model's vocabulary must hold
k). Sample ``i`` of step ``s`` is a window at an offset drawn from a generator seeded by (seed, s, i),
so every rank draws the same global batch and slices its own samples, as with the zoo's task.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hetplan.errors import HetplanError
from hetplan.models import derive_seed

__all__ = ["TextData"]


class TextData:
    def __init__(self, path: str | Path, *, seq: int, vocab: int) -> None:
        name = str(path)
        try:
            raw = np.frombuffer(Path(path).read_bytes(), dtype=np.uint8)
        except OSError as exc:
            raise HetplanError(f"cannot read the text file: {exc.strerror}", file=name, field="--data") from None
        if raw.size < seq + 2:
            raise HetplanError(f"the text has {raw.size} bytes; a sample needs {seq + 1}", file=name, field="--data")
        chars, ids = np.unique(raw, return_inverse=True)
        if len(chars) > vocab:
            raise HetplanError(
                f"the text has {len(chars)} distinct characters but the model's vocabulary holds "
                f"{vocab}; profile and plan a model with --vocab {len(chars)} or more",
                file=name,
                field="--data",
            )
        self.ids = ids.astype(np.int64)
        self.seq = seq
        self.characters = len(chars)

    def sample_batch(self, batch_size: int, *, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        span = self.ids.size - self.seq - 1
        windows = np.empty((batch_size, self.seq + 1), dtype=np.int64)
        for i in range(batch_size):
            start = np.random.default_rng(derive_seed("text", seed, step, i)).integers(span + 1)
            windows[i] = self.ids[start : start + self.seq + 1]
        out = torch.from_numpy(windows)
        return out[:, :-1].contiguous(), out[:, 1:].contiguous()


def batches_for(model: dict, zoo, data: str | None):
    """The batch source of a run: the text file when given (gpt models only), else the zoo's task."""
    if not data:
        return zoo
    if model.get("family") != "gpt":
        raise HetplanError("--data (a character-level language model) needs a gpt model", field="--data")
    return TextData(data, seq=zoo.model["config"]["seq"], vocab=zoo.model["config"]["vocab"])
