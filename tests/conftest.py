"""Builders for small, exact inputs: profiles with round numbers, clusters from a few lines."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Local runs fork their ranks from a fork server, which has imported torch once, instead of
# starting each rank as a fresh Python that imports it again (~2.5 s of CPU a rank): the suite's
# largest cost. tests/runtime/test_launcher.py and test_signals.py run both ways.
os.environ.setdefault("HETPLAN_RANK_START", "forkserver")
sys.path.insert(0, str(ROOT / "tests"))

SHARED_EXTERNAL = ROOT.parent / "shared" / "external"
needs_shared = pytest.mark.skipif(
    not SHARED_EXTERNAL.is_dir(), reason="../shared/external is absent (real profiles from other planners)"
)
