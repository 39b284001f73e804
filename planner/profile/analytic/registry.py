"""The analytic model families by name.

    from hetplan.profile.analytic.registry import FAMILIES, get_family
    FAMILIES["resnet"].defaults          # {'depth': 50, 'image_size': 224, 'classes': 1000}
    get_family("gtp")                    # HetplanError: unknown model family 'gtp'; did you mean 'gpt'?

The CLI turns each family's ``defaults`` into options (``image_size`` -> ``--image-size``).
"""

from __future__ import annotations

from types import ModuleType

from hetplan.families import get_spec
from hetplan.profile.analytic import bert, gpt, mlp, resnet, vgg
from hetplan.profile.analytic.base import Family

__all__ = ["FAMILIES", "get_family"]


def _family(name: str, module: ModuleType) -> Family:
    return Family(
        name=name,
        defaults=dict(module.DEFAULTS),
        help=module.HELP,
        build=module.blocks,
        check=module.check,
        input_bytes=module.input_bytes,
        build_at=getattr(module, "blocks_at", None),
        shared_of=getattr(module, "shared", None),
    )


FAMILIES: dict[str, Family] = {
    name: _family(name, module)
    for name, module in (("gpt", gpt), ("bert", bert), ("resnet", resnet), ("vgg", vgg), ("mlp", mlp))
}


def get_family(name: str) -> Family:
    """The family called ``name``; an unknown name is an error located at ``family`` (the families'
    own lookup, :func:`hetplan.families.get_spec`, says so, with its suggestion)."""
    return FAMILIES[get_spec(name).name]
