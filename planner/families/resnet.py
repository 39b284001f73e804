"""ResNet-18/34/50/101/152 (torchvision v1.5): settings, rules and layout constants.

Torch-free, so the torch zoo (:mod:`hetplan.models`) and the analytic profiler
(:mod:`hetplan.profile.analytic`) share one definition without depending on each other.
"""

from __future__ import annotations

from hetplan.families.base import config_error

__all__ = ["DEFAULTS", "EXPANSION", "HELP", "LAYOUTS", "WIDTHS", "check"]

DEFAULTS: dict[str, int] = {"depth": 50, "image_size": 224, "classes": 1000}
HELP = "ResNet-18/34/50/101/152 (torchvision v1.5); blocks: stem, layerI.J residual blocks, head"

#: depth -> (bottleneck?, blocks per stage), from He et al. 2016, Table 1.
LAYOUTS: dict[int, tuple[bool, tuple[int, int, int, int]]] = {
    18: (False, (2, 2, 2, 2)),
    34: (False, (3, 4, 6, 3)),
    50: (True, (3, 4, 6, 3)),
    101: (True, (3, 4, 23, 3)),
    152: (True, (3, 8, 36, 3)),
}
WIDTHS = (64, 128, 256, 512)
EXPANSION = 4  # bottleneck output channels = 4 x width


def check(config: dict[str, int]) -> None:
    """Only the standard depths have a defined layout."""
    if config["depth"] not in LAYOUTS:
        known = ", ".join(str(k) for k in LAYOUTS)
        raise config_error("depth", f"expected one of {known}, got {config['depth']}")
