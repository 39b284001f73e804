"""The analytic model families by name.

    from planner.profile.analytic.registry import FAMILIES, get_family
    FAMILIES["resnet"].defaults          # {'depth': 50, 'image_size': 224, 'classes': 1000}
    get_family("gtp")                    # HetplanError: unknown model family 'gtp'; did you mean 'gpt'?

The CLI turns each family's ``defaults`` into options (``image_size`` -> ``--image-size``).
"""

from __future__ import annotations

import difflib
from types import ModuleType

from planner.errors import HetplanError
from planner.profile.analytic import bert, gpt, mlp, resnet, vgg
from planner.profile.analytic.base import Family

__all__ = ["FAMILIES", "get_family"]


def _family(name: str, module: ModuleType) -> Family:
    return Family(
        name=name,
        defaults=dict(module.DEFAULTS),
        help=module.HELP,
        build=module.blocks,
        check=module.check,
        input_bytes=module.input_bytes,
    )


FAMILIES: dict[str, Family] = {
    name: _family(name, module)
    for name, module in (("gpt", gpt), ("bert", bert), ("resnet", resnet), ("vgg", vgg), ("mlp", mlp))
}


def get_family(name: str) -> Family:
    """The family called ``name``; an unknown name is an error located at ``family``."""
    if name in FAMILIES:
        return FAMILIES[name]
    close = difflib.get_close_matches(str(name), list(FAMILIES), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(FAMILIES)}"
    raise HetplanError(f"unknown model family {name!r}{hint}", field="family")
