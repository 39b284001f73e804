"""Fuzz the contract loaders: a broken file gives a valid object or a located HetplanError, nothing else.

Each example takes one real file (the bundled catalog, a bundled cluster, or a small profile and
plan built here), breaks it a few ways (delete a key, replace a value with a random scalar, list,
mapping, null or a unit typo, duplicate a list item, truncate the text, flip a byte) and loads it.
The loader must either return an object or raise :class:`HetplanError` whose text starts with the
file's path (a plan may also name the profile or cluster it points to, in its own folder).

The examples are the same on every run (``derandomize``). To hunt for new failures, run with fresh
random examples and more of them::

    HETPLAN_FUZZ_RANDOM=1 HETPLAN_FUZZ_EXAMPLES=3000 .venv/bin/python -m pytest tests/contracts/test_fuzz.py
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bad_input import plan_data, profile_data

from hetplan.contracts import check_plan, load_catalog, load_cluster, load_plan, load_plan_inputs, load_profile
from hetplan.contracts.paths import bundled_profiles_dir
from hetplan.errors import HetplanError

PROFILES = bundled_profiles_dir()
EXAMPLES = int(os.environ.get("HETPLAN_FUZZ_EXAMPLES", "160"))


def _load_plan_fully(path: Path) -> Any:
    plan = load_plan(path)
    profile, cluster = load_plan_inputs(plan)
    check_plan(plan, cluster, profile)
    return plan


@dataclass(frozen=True)
class Target:
    name: str
    text: bytes  # the valid original
    load: Callable[[Path], Any]
    suffix: str


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a valid plan's inputs (profile.yaml, cluster.yaml) and the plan itself."""
    folder = tmp_path_factory.mktemp("fuzz")
    data = plan_data(folder)
    (folder / "plan.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def targets(workdir: Path) -> list[Target]:
    out = [Target("devices.yaml", (PROFILES / "devices.yaml").read_bytes(), load_catalog, ".yaml")]
    for path in sorted((PROFILES / "clusters").glob("*.yaml")):
        out.append(Target(f"clusters/{path.name}", path.read_bytes(), load_cluster, ".yaml"))
    profile_text = yaml.safe_dump(profile_data(), sort_keys=False).encode()
    out.append(Target("profile", profile_text, load_profile, ".profile.yaml"))
    out.append(Target("plan", (workdir / "plan.yaml").read_bytes(), _load_plan_fully, ".plan.yaml"))
    # every original must load: otherwise the fuzz only ever tests one error
    for target in out:
        path = workdir / f"original{target.suffix}"
        path.write_bytes(target.text)
        target.load(path)
    return out


# --------------------------------------------------------------------------- mutations

UNIT_TYPOS = ["100Gbsp", "600 GB/S", "80GIB", "5 sec", "2mss", "-3GB/s", "1e999GB/s", "12,5GB/s", "GB/s", "fast"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.integers(min_value=-3, max_value=10),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(UNIT_TYPOS),
    st.sampled_from(["A100-80GB", "node0/0", "node0", "hetplan/cluster/v1", "fp32", "1f1b", ""]),
)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(st.text(max_size=6), scalars, max_size=3),
)


def _places(data: Any, path: tuple = ()) -> list[tuple]:
    """Every (container path, key) in a parsed document, so a mutation can pick one."""
    out: list[tuple] = []
    if isinstance(data, dict):
        for key, value in data.items():
            out.append((*path, key))
            out.extend(_places(value, (*path, key)))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out.append((*path, i))
            out.extend(_places(value, (*path, i)))
    return out


def _container(data: Any, place: tuple) -> tuple[Any, Any]:
    target = data
    for key in place[:-1]:
        target = target[key]
    return target, place[-1]


def _mutate_structure(text: bytes, draw: st.DrawFn) -> bytes:
    data = yaml.safe_load(text)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        places = _places(data)
        if not places:
            break
        container, key = _container(data, draw(st.sampled_from(places)))
        action = draw(st.sampled_from(["delete", "replace", "replace", "duplicate"]))
        if action == "delete":
            del container[key]
        elif action == "replace":
            container[key] = draw(values)
        else:  # duplicate the list item at this place, or the nearest list above it
            if isinstance(container, list):
                container.insert(key, container[key])
            elif isinstance(container.get(key), list) and container[key]:
                container[key].append(container[key][0])
            else:
                container[key] = [container[key], container[key]]
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode()


def _mutate_bytes(text: bytes, draw: st.DrawFn) -> bytes:
    action = draw(st.sampled_from(["truncate", "flip", "flip"]))
    if action == "truncate":
        return text[: draw(st.integers(min_value=0, max_value=len(text)))]
    out = bytearray(text)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        i = draw(st.integers(min_value=0, max_value=len(out) - 1))
        out[i] ^= draw(st.integers(min_value=1, max_value=255))
    return bytes(out)


# --------------------------------------------------------------------------- the test


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("HETPLAN_FUZZ_RANDOM") is None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_broken_files_fail_cleanly(data: st.DataObject, targets: list[Target], workdir: Path) -> None:
    target = data.draw(st.sampled_from(targets), label="target")
    if data.draw(st.booleans(), label="structural"):
        text = _mutate_structure(target.text, data.draw)
    else:
        text = _mutate_bytes(target.text, data.draw)
    path = workdir / f"fuzzed{target.suffix}"
    path.write_bytes(text)
    try:
        target.load(path)
    except HetplanError as exc:
        message = str(exc)
        allowed = (str(path),) if target.name != "plan" else (str(path), str(workdir) + os.sep)
        assert message.startswith(allowed), f"{target.name}: error does not start with the file: {message}"
        assert "\n" not in message, f"{target.name}: error is not one line: {message!r}"
    except Exception as exc:  # any other exception is a bug in a loader
        shutil.copy(path, workdir / "last-failure.yaml")
        raise AssertionError(f"{target.name}: {type(exc).__name__}: {exc}\n--- file ---\n{text[:2000]!r}") from exc
