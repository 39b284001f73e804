"""Which tests start processes of their own, for pytest-xdist's grouping (tests/conftest.py).

A module of its own, not the conftest: ``from conftest import`` in a test finds whichever
``conftest.py`` Python imported first under that name (tests/models/ has one too).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: What a test module's source says when its tests start processes of their own: ranks (a launch,
#: torchrun, a process group over spawned processes) or a script that starts them.
STARTS_PROCESSES = (
    "launch_local",
    "hetplan.runtime.launcher",
    '"launch"',
    "init_process_group",
    "torchrun",
    "subprocess",
)
#: pytest-xdist's group for those modules' tests: under ``-n 2 --dist loadgroup`` (the README's
#: two-worker run, docs/benchmarks.md "Test suite") they run one after another on one worker, as
#: without xdist, while the other worker takes the single-process tests. Two launches at once would
#: put 8 to 16 ranks on 2 cores, and ranks with short timeouts would then time out. Six files of
#: short runs beside the group (tried in 14ca96b) did not shorten the suite (docs/benchmarks.md,
#: "Test suite"; the killed-rank failure one of those runs had came back with the group whole).
PROCESS_GROUP = "starts-processes"
#: The slowest single-process files (tens of seconds each), handed out first so that neither
#: worker ends the suite alone on one of them (longest first: xdist keeps collection order).
SLOWEST_FIRST = (
    "tests/solve/test_optimality.py",
    "tests/solve/test_planner.py",
    "tests/calibrate/test_never_worse.py",
    "tests/calibrate/test_recover_overheads.py",
)


def _starts_processes(path: Path, cache: dict[Path, bool] = {}) -> bool:  # noqa: B006 (a cache per run)
    if path not in cache:
        text = path.read_text(encoding="utf-8") if path.suffix == ".py" and path.is_file() else ""
        cache[path] = any(token in text for token in STARTS_PROCESSES)
    return cache[path]


def process_scope(nodeid: str) -> str:
    """xdist's work unit for a test: the group for a test that starts processes, else the test itself."""
    return PROCESS_GROUP if _starts_processes(ROOT / nodeid.split("::", 1)[0]) else nodeid


def slowest_first(nodeids: list[str]) -> list[int]:
    """Positions of ``nodeids`` reordered so that the files of :data:`SLOWEST_FIRST` come first,
    in that order, and the rest keep theirs (a stable sort)."""
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    return sorted(range(len(nodeids)), key=lambda i: rank.get(nodeids[i].split("::", 1)[0], len(rank)))
