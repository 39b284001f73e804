"""One check that a launched run trained the single-process reference model, shared by the
tensor-parallel runtime tests (tests/runtime/test_tensor_parallel_runtime.py, test_vocab_parallel.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from hetplan.runtime.checkpoint import read_block


def assert_run_equals_reference(
    records: list[dict], losses: list[float], history: list[dict], blocks: list[nn.Module], checkpoint: Path
) -> list[dict]:
    """Rank 0's logged losses and global gradient norms equal the reference's, and every block the
    run saved at ``checkpoint`` equals the reference's block, within 1e-5; rank 0's records."""
    mine = [r for r in records if r["rank"] == 0]
    assert [r["loss"] for r in mine] == pytest.approx(losses, abs=1e-5)
    # the global norm counts every parameter once (a replicated one on one member of its group only)
    assert [r["grad_norm"] for r in mine] == pytest.approx([h["grad_norm"] for h in history], rel=1e-5)
    for i, block in enumerate(blocks):
        saved = read_block(checkpoint, i).params
        for name, value in block.state_dict().items():
            torch.testing.assert_close(saved[name], value.detach(), atol=1e-5, rtol=0)
    return mine
