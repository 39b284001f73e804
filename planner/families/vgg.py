"""VGG-16/19 (no batch norm): settings, rules and layout constants.

Torch-free, so the torch zoo (:mod:`hetplan.models`) and the analytic profiler
(:mod:`hetplan.profile.analytic`) share one definition without depending on each other.
"""

from __future__ import annotations

from hetplan.families.base import config_error

__all__ = ["CHANNELS", "DEFAULTS", "FC_WIDTH", "HELP", "LAYOUTS", "MIN_IMAGE", "POOL_SIDE", "check"]

DEFAULTS: dict[str, int] = {"depth": 16, "image_size": 224, "classes": 1000}
HELP = "VGG-16/19 (no batch norm); blocks: convS_I (pools folded into the stage's last conv), fc6, fc7, fc8"

#: depth -> convolutions per stage (output channels 64, 128, 256, 512, 512).
LAYOUTS: dict[int, tuple[int, int, int, int, int]] = {16: (2, 2, 3, 3, 3), 19: (2, 2, 4, 4, 4)}
CHANNELS = (64, 128, 256, 512, 512)
POOL_SIDE = 7  # torchvision's adaptive average pool output before the classifier
FC_WIDTH = 4096
#: Five 2x2 pools need at least 32 pixels a side.
MIN_IMAGE = 32


def check(config: dict[str, int]) -> None:
    """Known depths only; the image must survive five halvings."""
    if config["depth"] not in LAYOUTS:
        known = ", ".join(str(k) for k in LAYOUTS)
        raise config_error("depth", f"expected one of {known}, got {config['depth']}")
    if config["image_size"] < MIN_IMAGE:
        raise config_error("image_size", f"expected at least {MIN_IMAGE} (five 2x2 pools), got {config['image_size']}")
