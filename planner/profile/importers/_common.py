"""Helpers shared by the importers: reading files and naming device types, all errors located.

text = read_text(path)                      # HetplanError if missing, binary or empty
data = read_json(path)                      # HetplanError naming line and column on bad JSON
name = catalog_name("V100-16", file=...)    # "V100-16GB" (via the catalog's aliases)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hetplan.contracts.catalog import Catalog, load_catalog
from hetplan.errors import HetplanError

__all__ = ["catalog_name", "read_json", "read_text", "require_positive_int"]


def read_text(path: str | Path, *, what: str) -> str:
    """The UTF-8 text of ``path``; a missing, unreadable, binary or empty file is a HetplanError."""
    name = str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise HetplanError(f"file not found (expected {what})", file=name) from None
    except IsADirectoryError:
        raise HetplanError(f"is a directory, expected {what}", file=name) from None
    except OSError as exc:
        raise HetplanError(f"cannot read: {exc.strerror}", file=name) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HetplanError(f"not a text file (invalid UTF-8); expected {what}", file=name) from None
    if "\x00" in text:
        raise HetplanError(f"not a text file (NUL bytes); expected {what}", file=name)
    if not text.strip():
        raise HetplanError(f"empty file; expected {what}", file=name)
    return text


def read_json(path: str | Path, *, what: str) -> Any:
    """Parse a JSON file; a syntax error names its line and column."""
    text = read_text(path, what=what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise HetplanError(
            f"not valid JSON ({exc.msg}); expected {what}",
            file=str(path),
            field=f"line {exc.lineno} column {exc.colno}",
        ) from None


def catalog_name(name: str, *, file: str, field: str, catalog: Catalog | None = None) -> str:
    """The device catalog's name for ``name`` (a catalog name or one of its aliases)."""
    cat = catalog if catalog is not None else load_catalog()
    canonical = cat.canonical(name) if isinstance(name, str) else None
    if canonical is None:
        known = ", ".join(sorted(d.name for d in cat))
        raise HetplanError(
            f"unknown GPU type {name!r}: not in the device catalog (profiles/devices.yaml) under that name "
            f"or an alias; known types: {known}",
            file=file,
            field=field,
        )
    return canonical


def require_positive_int(value: object, *, name: str, file: str) -> int:
    """``value`` as a positive int, else a HetplanError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HetplanError(f"{name} must be a positive integer, got {value!r}", file=file, field=name)
    return value
