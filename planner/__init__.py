"""hetplan: plan and run hybrid pipeline + data parallel training on heterogeneous GPU clusters.

Data flows one way: ``profile`` -> ``solve`` (plan) -> ``emit`` -> ``runtime``. The contracts that
cross those borders live in :mod:`hetplan.contracts`.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
