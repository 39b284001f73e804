"""The event-driven simulator of a plan, the ground truth for every predicted figure.

result = simulate(plan, profile, cluster)
print(result.iteration_s, result.bubble_fraction, result.bottleneck)
"""

from hetplan.simulate.simulator import SimResult, check_memory, simulate

__all__ = ["SimResult", "check_memory", "simulate"]
