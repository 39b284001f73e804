"""``pytest -n 2 --dist loadgroup`` runs the suite on two pytest-xdist workers with every test that
starts processes in one group, run by one worker (tests/conftest.py, tests/suite_groups.py): two
launches at once would share 2 cores between 8 to 16 ranks. These tests pin which files that group
holds, and the work units the conftest's scheduler hands xdist."""

from __future__ import annotations

import pytest
from suite_groups import (
    PROCESS_GROUP,
    ROOT,
    SLOWEST_FIRST,
    _starts_processes,
    process_scope,
    slowest_first,
)

#: Files whose tests start ranks or other processes (launches, the CLI's launch, process groups of
#: spawned processes, the GPU check's sections, torchrun itself).
STARTS = [
    "tests/runtime/test_runtime.py",
    "tests/runtime/test_sync_checkpoint.py",
    "tests/runtime/test_tensor_parallel_runtime.py",
    "tests/runtime/test_cli_launch.py",
    "tests/runtime/test_zero.py",
    "tests/runtime/test_signals.py",
    "tests/export/test_deepspeed_run.py",
    "tests/test_gpu_check.py",
]
#: Single-process files, among them the slowest: they run on the other worker, beside the group.
SINGLE = ["tests/solve/test_optimality.py", "tests/solve/test_planner.py", "tests/calibrate/test_never_worse.py"]


@pytest.mark.parametrize("path", STARTS)
def test_files_that_start_processes_are_in_the_group(path: str) -> None:
    assert _starts_processes(ROOT / path)


@pytest.mark.parametrize("path", SINGLE)
def test_single_process_files_are_not(path: str) -> None:
    assert not _starts_processes(ROOT / path)


def test_the_group_is_one_work_unit_and_every_other_test_its_own() -> None:
    assert process_scope(f"{STARTS[0]}::test_one_stage") == process_scope(f"{STARTS[-1]}::test_x[a]") == PROCESS_GROUP
    assert process_scope(f"{SINGLE[0]}::test_y[1-2]") == f"{SINGLE[0]}::test_y[1-2]"


def test_the_slowest_files_come_first_and_the_rest_keep_their_order() -> None:
    ids = ["tests/a.py::t1", f"{SLOWEST_FIRST[1]}::t", "tests/b.py::t2", f"{SLOWEST_FIRST[0]}::t", "tests/a.py::t3"]
    assert [ids[i] for i in slowest_first(ids)] == [ids[3], ids[1], ids[0], ids[2], ids[4]]
    assert all((ROOT / path).is_file() for path in SLOWEST_FIRST)
