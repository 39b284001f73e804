"""tests/models holds user_models.py, imported by factory path as ``user_models:build``.

The tests run torch on one thread: on a shared two-core machine, two threads stall whenever another
process takes a core, which makes these small models many times slower.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
