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

from suite_groups import process_scope, slowest_first  # noqa: E402 (tests/ is on sys.path from the line above)


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own loadgroup scheduler
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup`` with the group given by the test's file, not by marks: xdist 3.8 puts a
    mark's group into ``item._nodeid``, which pytest 9 no longer reads (its tests would spread over
    both workers). Other ``--dist`` modes are xdist's own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ProcessGroupScheduling(LoadScopeScheduling):
        """One work unit for every test that starts processes (it goes first: the largest unit),
        one unit per test for the others."""

        def _split_scope(self, nodeid: str) -> str:
            return process_scope(nodeid)

    return ProcessGroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` the slowest single-process files first (``suite_groups.SLOWEST_FIRST``):
    xdist hands out the work units in collection order, and a minute-long test handed out last
    leaves one worker running it alone. Serial runs keep pytest's order."""
    # an xdist worker runs with dist "no" and says loadgroup in an option of its own
    if getattr(config.option, "loadgroup", False) or config.getoption("dist", "no") == "loadgroup":
        items[:] = [items[i] for i in slowest_first([item.nodeid for item in items])]


SHARED_EXTERNAL = ROOT.parent / "shared" / "external"
needs_shared = pytest.mark.skipif(
    not SHARED_EXTERNAL.is_dir(), reason="../shared/external is absent (real profiles from other planners)"
)
