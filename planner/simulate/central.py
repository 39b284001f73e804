"""Host memory of WSP's parameter server, the one process of a plan that holds no device.

    use = central_memory(plan, profile, cluster, optimizer="adam")   # None unless plan.sync == "wsp"
    use.tensor_bytes     # the peak of live tensors (what the server's CPU allocator profile measures)

The server (:mod:`hetplan.runtime.sync.param_server`, one more process on the plan's first node)
holds the whole model in fp32 and steps the optimizer once per clock; every device pushes its wave's
gradient to it and pulls the newest weights from it. A 7B model under Adam needs over 100 GB of host
memory there, which no device row shows, so the walk prices it as its own row. With ``P`` the
model's parameters and ``D`` the staleness bound, what it holds (fp32, 4 bytes an element):

* **weights**: ``4·P``, built once, whatever the plan's dtype (the server's optimizer steps fp32);
* **optimizer state**: SGD none, momentum ``4·P``, Adam and AdamW ``8·P`` (:data:`OPTIMIZER_STATE_BYTES`);
* **clock sums**: one dense ``4·P`` buffer per clock with a push not yet stepped. A clock is stepped
  once every device has pushed it, and a device that has pushed clock ``c + D`` waits for clock ``c``
  before it goes on, so at most ``D + 1`` clocks are open at once (``D = 0``: one). The bound is what
  the walk prices; a run whose devices keep pace holds fewer.
* **one message or step at a time** (the server is one thread): a push's payload or a pull's reply,
  the elements of the largest device's blocks (``4·n_max``), or the optimizer's temporaries while it
  steps, which torch's per-parameter Adam makes two of for the largest parameter tensor
  (``exp_avg_sq.sqrt() / bias_correction`` before ``addcdiv_``: ``8·p_max``); SGD and momentum
  update in place. A profile does not list tensors, so ``p_max`` is bounded by the largest block's
  parameters (a transformer layer's largest tensor is a third of its own), which over-counts where the
  step's temporaries exceed the message (a whole stage's elements, usually the larger).

Not counted: the interpreter and libraries (several hundred MB of resident memory for a process that
imports torch) and the module buffers (BatchNorm statistics) the server builds but never uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.simulate.memory import FP32_BYTES, OPTIMIZER_STATE_BYTES

__all__ = ["STEP_TEMPORARIES", "CentralMemory", "central_memory"]

#: Parameter-sized temporaries torch's per-parameter (``foreach=False``) step makes at once.
STEP_TEMPORARIES = {"sgd": 0, "momentum": 0, "adam": 2, "adamw": 2}


@dataclass(frozen=True)
class CentralMemory:
    """The parameter server's tensors, in bytes (see the module docstring for each term)."""

    node: str
    weights: float
    optimizer: float
    clock_sums: float
    open_clocks: int
    transient: float

    @property
    def tensor_bytes(self) -> float:
        return self.weights + self.optimizer + self.clock_sums + self.transient

    def to_dict(self) -> dict[str, float | int | str]:
        """The plan file's ``predicted.central`` entry."""
        return {
            "role": "wsp parameter server",
            "node": self.node,
            "tensor_bytes": round(self.tensor_bytes),
            "weights_bytes": round(self.weights),
            "optimizer_bytes": round(self.optimizer),
            "clock_sums_bytes": round(self.clock_sums),
            "open_clocks": self.open_clocks,
        }


def central_memory(plan: Plan, profile: ModelProfile, cluster: Cluster, *, optimizer: str) -> CentralMemory | None:
    """The parameter server's memory under ``plan`` (None for every mode without one: only ``wsp``
    has a server that holds tensors; SDPipe's scheduler moves a few integers)."""
    if plan.sync != "wsp":
        return None
    sizes = [block.shard(1).params for block in profile.blocks]  # wsp runs no TP and no tied weights
    params = float(sum(sizes))
    largest_device = max(
        sum(sizes[b] for b in range(stage.start, stage.end)) for p in plan.pipelines for stage in p.stages
    )
    largest_tensor = max(sizes, default=0.0)  # a block's parameters bound its largest tensor
    open_clocks = int(plan.sync_option("staleness")) + 1
    message = FP32_BYTES * largest_device
    step = STEP_TEMPORARIES[optimizer] * FP32_BYTES * largest_tensor
    # the first node of the cluster file that holds a device of the plan, as the rank config places it
    order = {n.name: i for i, n in enumerate(cluster.nodes)}
    node = min({cluster.device(a).node for p in plan.pipelines for a in p.devices()}, key=order.__getitem__)
    return CentralMemory(
        node=node,
        weights=FP32_BYTES * params,
        optimizer=OPTIMIZER_STATE_BYTES[optimizer] * params,
        clock_sums=open_clocks * FP32_BYTES * params,
        open_clocks=open_clocks,
        transient=max(message, step),
    )
