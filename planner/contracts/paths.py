"""Where the bundled ``profiles/`` folder is, in a source checkout or in an installed wheel."""

from __future__ import annotations

from pathlib import Path

__all__ = ["bundled_profiles_dir"]


def bundled_profiles_dir() -> Path:
    """The folder holding ``devices.yaml``, ``clusters/`` and ``models/``.

    A wheel ships the files inside the package as ``hetplan/bundled/`` (plain YAML, no code); a
    checkout (editable install, tests) uses the repository's ``profiles/`` beside ``planner/``. The
    wheel's place is looked at first: beside an installed package, ``../profiles`` could be anyone's.
    """
    installed = Path(__file__).resolve().parents[1] / "bundled"
    if (installed / "devices.yaml").is_file():
        return installed
    checkout = Path(__file__).resolve().parents[2] / "profiles"
    if (checkout / "devices.yaml").is_file():
        return checkout
    raise FileNotFoundError(f"the bundled profiles are not installed (looked in {checkout} and {installed})")
