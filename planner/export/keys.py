"""Check a written configuration against a runtime's documented keys, before it reaches a user.

    undocumented({"fp16": {"enabled": True, "typo": 1}}, {"fp16": {"enabled": bool}})
    # ['fp16.typo: not a documented key']

A schema is a mapping from key to the type of its value, or to a nested schema. An export that
writes a key its runtime does not document would be ignored (or refused) there; this catches such
a slip in hetplan's own code, so it is a bug, not a user's error.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_documented", "undocumented"]


def _type_ok(value: Any, expected: type) -> bool:
    if expected is float:  # JSON and TOML write 0 for 0.0
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


def undocumented(data: dict[str, Any], schema: dict[str, Any], where: str = "") -> list[str]:
    """Every key of ``data`` (recursively) not in ``schema``, or holding a value of another type."""
    problems = []
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in schema:
            problems.append(f"{path}: not a documented key")
        elif isinstance(schema[key], dict):
            if not isinstance(value, dict):
                problems.append(f"{path}: expected a mapping, got {value!r}")
            else:
                problems.extend(undocumented(value, schema[key], path))
        elif not _type_ok(value, schema[key]):
            problems.append(f"{path}: expected {schema[key].__name__}, got {value!r}")
    return problems


def check_documented(problems: list[str], *, runtime: str, file: str) -> None:
    """Stop an export whose file has undocumented keys (an internal error: hetplan wrote them)."""
    if problems:
        raise RuntimeError(f"hetplan export {runtime} wrote undocumented keys in {file}: {'; '.join(problems)}")
