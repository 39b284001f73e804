"""Where the bundled ``profiles/`` folder is, in a source checkout or in an installed wheel."""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["bundled_profiles_dir"]


def bundled_profiles_dir() -> Path:
    """The folder holding ``devices.yaml``, ``clusters/`` and ``models/``.

    A checkout (editable install, tests) uses the repository's ``profiles/``; a wheel ships the same
    files as the ``hetplan_profiles`` package (a namespace package: plain YAML, no code).
    """
    checkout = Path(__file__).resolve().parents[2] / "profiles"
    if (checkout / "devices.yaml").is_file():
        return checkout
    spec = importlib.util.find_spec("hetplan_profiles")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the bundled profiles (hetplan_profiles) are not installed")
    return Path(next(iter(spec.submodule_search_locations)))
