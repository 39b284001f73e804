"""Builders for small, exact inputs: profiles with round numbers, clusters from a few lines."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

SHARED_EXTERNAL = ROOT.parent / "shared" / "external"
needs_shared = pytest.mark.skipif(
    not SHARED_EXTERNAL.is_dir(), reason="../shared/external is absent (real profiles from other planners)"
)
