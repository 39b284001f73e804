"""Where the bundled ``profiles/`` folder is, in a source checkout or in an installed wheel."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["bundled_profiles_dir"]


def bundled_profiles_dir() -> Path:
    """The folder holding ``devices.yaml``, ``clusters/`` and ``models/``.

    A checkout (editable install, tests) uses the repository's ``profiles/``; a wheel ships the same
    files as the ``hetplan_profiles`` package.
    """
    checkout = Path(__file__).resolve().parents[2] / "profiles"
    if (checkout / "devices.yaml").is_file():
        return checkout
    return Path(str(resources.files("hetplan_profiles")))
