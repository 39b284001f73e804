"""Analytic model profiles: per-block FLOPs, parameters and bytes from closed-form formulas, times
from the roofline (:mod:`hetplan.profile.roofline`). No torch, no measurement.

    from hetplan.contracts import load_catalog
    from hetplan.profile.analytic import FAMILIES, analytic_profile
    FAMILIES["gpt"].defaults      # {'layers': 12, 'hidden': 768, 'heads': 12, 'seq': 256, 'vocab': 50257}
    profile = analytic_profile("resnet", {"depth": 50}, devices=[load_catalog().get("A100-80GB")])

Families: ``gpt``, ``bert``, ``resnet``, ``vgg``, ``mlp`` (one module each); the formulas and the
trust one may place in them are in docs/analytic-profiles.md.
"""

from hetplan.profile.analytic.base import BlockCost, Family
from hetplan.profile.analytic.build import DEFAULT_MICRO_BATCHES, analytic_profile, block_times
from hetplan.profile.analytic.registry import FAMILIES, get_family

__all__ = ["DEFAULT_MICRO_BATCHES", "FAMILIES", "BlockCost", "Family", "analytic_profile", "block_times", "get_family"]
