"""Train a few steps of a DeepSpeed export through DeepSpeed's own ``PipelineModule`` and engine.

    torchrun --standalone --nproc-per-node 4 deepspeed_train.py EXPORT_DIR STEPS OUT.json

Run by ``tests/export/test_deepspeed_run.py`` under torchrun on gloo (CPU). It is the user's training
script the export's ``launch.sh`` names: it reads ``pipeline.json`` and ``ds_config.json`` as written
and only adds what a CPU needs (``torch_adam``: DeepSpeed's fused Adam is a CUDA kernel). The model is
:func:`build_layers` (the same layers the test's profile describes), every rank building all of them
from one seed so the single-process reference starts from the same weights. Every rank writes
``OUT.json.RANK``: its stage and replica as DeepSpeed's grid numbers them, the parts DeepSpeed's
partitioner computed, the engine's settings, and the loss of each step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

WIDTHS = (12, 24, 16, 16, 24, 8)  # layer i maps WIDTHS[i] -> WIDTHS[i + 1]; last maps to CLASSES
CLASSES = 5
SEED = 0


class Block(nn.Module):
    """One pipeline layer: a linear map and a tanh (whole tensors in and out, as DeepSpeed pipes them)."""

    def __init__(self, width_in: int, width_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width_in, width_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


def build_layers() -> list[nn.Module]:
    """The model as a list of layers, from one seed (the same on every rank and in the reference)."""
    torch.manual_seed(SEED)
    widths = (*WIDTHS, CLASSES)
    layers: list[nn.Module] = [Block(widths[i], widths[i + 1]) for i in range(len(widths) - 2)]
    layers.append(nn.Linear(widths[-2], widths[-1]))
    return layers


def batches(global_batch: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each step's global batch: inputs and class labels, from a fixed generator."""
    g = torch.Generator().manual_seed(1234)
    return [
        (torch.randn(global_batch, WIDTHS[0], generator=g), torch.randint(0, CLASSES, (global_batch,), generator=g))
        for _ in range(steps)
    ]


def main(export_dir: str, steps: int, out: str) -> None:
    import deepspeed
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

    folder = Path(export_dir)
    pipeline = json.loads((folder / "pipeline.json").read_text())
    config = json.loads((folder / "ds_config.json").read_text())
    config["optimizer"]["params"]["torch_adam"] = True  # CPU: torch's Adam, not the fused CUDA kernel
    import deepspeed.ops

    # CPU: gloo all-reduces; DeepSpeed would otherwise compile its shared-memory all-reduce (C++, JIT)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    module_args = dict(pipeline["PipelineModule"])
    topology = PipeDataParallelTopology(**pipeline["PipeDataParallelTopology"])
    model = PipelineModule(layers=build_layers(), topology=topology, loss_fn=nn.CrossEntropyLoss(), **module_args)
    engine, _, _, _ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())

    replicas = pipeline["PipeDataParallelTopology"]["num_dp"]
    micro = config["train_micro_batch_size_per_gpu"]
    replica = engine.grid.get_data_parallel_rank()
    losses = []
    for x, y in batches(config["train_batch_size"], steps):
        share = x.shape[0] // replicas
        mine_x, mine_y = x[replica * share : (replica + 1) * share], y[replica * share : (replica + 1) * share]
        micro_batches = iter([(mine_x[i : i + micro], mine_y[i : i + micro]) for i in range(0, share, micro)])
        losses.append(float(engine.train_batch(data_iter=micro_batches)))
    rank = torch.distributed.get_rank()
    record = {
        "rank": rank,
        "stage": int(engine.stage_id),
        "replica": int(replica),
        "parts": [int(p) for p in model.parts],
        "losses": losses,
        "zero_stage": int(engine.zero_optimization_stage()),
        "checkpoint_interval": model.activation_checkpoint_interval,
        "optimizer": type(engine.optimizer).__name__,
        "basic_optimizer": type(engine.basic_optimizer).__name__ if engine.basic_optimizer else None,
        "gradient_clipping": engine.gradient_clipping(),
        "batch": [
            engine.train_batch_size(),
            engine.train_micro_batch_size_per_gpu(),
            engine.gradient_accumulation_steps(),
        ],
    }
    Path(f"{out}.{rank}").write_text(json.dumps(record))
    torch.distributed.barrier()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
