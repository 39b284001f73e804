"""Model families by name, without torch: settings, rules and architecture constants.

    from hetplan.families import get_spec
    get_spec("resnet").full_config({"depth": 18})   # {'depth': 18, 'image_size': 224, 'classes': 1000}
    get_spec("gtp")                                 # HetplanError: unknown model family 'gtp'; did you mean 'gpt'?

The torch zoo (:mod:`hetplan.models`) builds these families' blocks and the analytic profiler
(:mod:`hetplan.profile.analytic`) estimates their costs; both read the families from here, so the
runtime, which builds blocks, never loads the cost model.
"""

from __future__ import annotations

import difflib
from types import ModuleType

from hetplan.errors import HetplanError
from hetplan.families import bert, gpt, mlp, resnet, vgg
from hetplan.families.base import FamilySpec, config_error, full_config

__all__ = ["SPECS", "FamilySpec", "config_error", "full_config", "get_spec"]


def _spec(name: str, module: ModuleType) -> FamilySpec:
    return FamilySpec(name=name, defaults=dict(module.DEFAULTS), help=module.HELP, check=module.check)


SPECS: dict[str, FamilySpec] = {
    name: _spec(name, module)
    for name, module in (("gpt", gpt), ("bert", bert), ("resnet", resnet), ("vgg", vgg), ("mlp", mlp))
}


def get_spec(name: str) -> FamilySpec:
    """The family called ``name``; an unknown name is an error located at ``family``."""
    if name in SPECS:
        return SPECS[name]
    close = difflib.get_close_matches(str(name), list(SPECS), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(SPECS)}"
    raise HetplanError(f"unknown model family {name!r}{hint}", field="family")
