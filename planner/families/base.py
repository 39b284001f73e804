"""What every model family's settings share: defaults overlaid with the user's, checked.

spec = get_spec("gpt")
spec.full_config({"layers": 2})          # defaults filled in, unknown keys and bad values refused
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hetplan.errors import HetplanError

__all__ = ["FamilySpec", "config_error", "full_config"]

CheckFn = Callable[[dict[str, Any]], None]


def config_error(key: str, reason: str) -> HetplanError:
    """A HetplanError located at ``config.<key>``."""
    return HetplanError(reason, field=f"config.{key}")


def full_config(
    name: str, defaults: Mapping[str, Any], check: CheckFn, config: Mapping[str, Any] | None
) -> dict[str, Any]:
    """``defaults`` overlaid with ``config``; unknown keys and non-positive integers are refused
    (a setting whose default is a string takes a name, checked by the family), then the family's
    own rules (``check``) run."""
    if config is not None and not isinstance(config, Mapping):
        raise HetplanError(f"expected a mapping of settings, got {type(config).__name__}", field="config")
    out = dict(defaults)
    for key, value in dict(config or {}).items():
        if key not in defaults:
            close = difflib.get_close_matches(str(key), list(defaults), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise config_error(str(key), f"unknown setting for {name}{hint} (known: {', '.join(defaults)})")
        if isinstance(defaults[key], str):  # a named choice (the family's check lists the choices)
            if not isinstance(value, str):
                raise config_error(key, f"expected a name, got {value!r}")
            out[key] = value
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise config_error(key, f"expected a positive integer, got {value!r}")
        if value <= 0:
            raise config_error(key, f"expected a positive integer, got {value}")
        out[key] = value
    check(out)
    return out


@dataclass(frozen=True)
class FamilySpec:
    """A model family's settings: defaults (the CLI's options), a help line, its rules."""

    name: str
    defaults: dict[str, Any]
    help: str
    check: CheckFn

    def full_config(self, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return full_config(self.name, self.defaults, self.check, config)
