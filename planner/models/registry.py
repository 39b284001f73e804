"""Resolve a profile's ``model`` section to a buildable :class:`~hetplan.models.base.ZooModel`.

    zoo = resolve_model({"family": "gpt", "config": {"layers": 2, "hidden": 64}})   # defaults filled in
    zoo.model        # {'family': 'gpt', 'config': {'layers': 2, 'hidden': 64, 'heads': 12, ...}}
    zoo = resolve_model({"factory": "pkg.mod:build", "config": {"width": 64}, "input_shape": [3, 32, 32]})
    zoo = resolve_model({"hf": "llama", "config": {"num_hidden_layers": 2}, "seq": 64})

Zoo families take their config keys, defaults and checks from :mod:`hetplan.families` (torch-free,
shared with the analytic profiler), so a measured and an analytic profile of one config describe the
same model, block for block, and building a model never loads the cost model.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any

from hetplan.errors import HetplanError
from hetplan.families import get_spec
from hetplan.models.base import ZooModel
from hetplan.models.factory import FactoryModel
from hetplan.models.gpt import GptModel
from hetplan.models.mlp import MlpModel
from hetplan.models.resnet import ResnetModel
from hetplan.models.vgg import VggModel

__all__ = ["ZOO", "resolve_model"]

#: Families with a torch implementation (``bert`` is analytic only for now).
ZOO: dict[str, Callable[[dict[str, int]], ZooModel]] = {
    "gpt": GptModel,
    "resnet": ResnetModel,
    "vgg": VggModel,
    "mlp": MlpModel,
}

_FAMILY_KEYS = ("family", "config")
_FACTORY_KEYS = ("factory", "config", "input_shape")
_HF_KEYS = ("hf", "config", "seq")


def _refuse_unknown(model: Mapping[str, Any], known: tuple[str, ...]) -> None:
    for key in model:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f" (known: {', '.join(known)})"
            raise HetplanError(f"unknown field{hint}", field=f"model.{key}")


def resolve_model(model: Mapping[str, Any]) -> ZooModel:
    """The buildable model a ``model`` section describes.

    Args:
        model: ``{"family": name, "config": {...}}`` (a zoo family; missing config keys take the
            family's defaults), ``{"factory": "pkg.mod:build", "config": {...}, "input_shape": [...]}``
            or ``{"hf": "gpt2" | "llama" | "path/config.json", "config": {...}, "seq": 128}``
            (:mod:`hetplan.models.hf`).

    Returns:
        A :class:`ZooModel` whose ``model`` attribute is the normalised section (full config).

    Raises:
        HetplanError: an unknown family (``field="family"``), a bad setting (``config.<key>``), a
            factory that does not import or returns no blocks (``factory``), an input shape the
            model refuses (``--input-shape``).
    """
    if not isinstance(model, Mapping):
        raise HetplanError(f"expected a mapping with 'family' or 'factory', got {model!r}", field="model")
    if sum(key in model for key in ("family", "factory", "hf")) > 1:
        raise HetplanError(
            "give one of 'family' (a zoo model), 'factory' (module:function) or 'hf' (a transformers model), not both",
            field="model",
        )
    if "hf" in model:
        _refuse_unknown(model, _HF_KEYS)
        from hetplan.models.hf import HfModel  # transformers is optional: loaded for HF models only

        return HfModel(model["hf"], model.get("config"), model.get("seq"))
    if "factory" in model:
        _refuse_unknown(model, _FACTORY_KEYS)
        return FactoryModel(model["factory"], model.get("config"), model.get("input_shape"))
    if "family" not in model:
        what = f"an imported model ({model['name']!r})" if "name" in model else "no model"
        raise HetplanError(
            f"this section names {what}; hetplan can build a zoo 'family' or a 'factory' (module:function)",
            field="model",
        )
    _refuse_unknown(model, _FAMILY_KEYS)
    name = model["family"]
    family = get_spec(name)
    if name not in ZOO:
        raise HetplanError(
            f"the model zoo has no torch implementation of {name!r} yet (it has: {', '.join(ZOO)}); "
            "profile it with --analytic",
            field="family",
        )
    return ZOO[name](family.full_config(model.get("config")))
