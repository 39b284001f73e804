"""Parallelism of the runtime beyond the pipeline's own: what spans ranks or stages of one replica.

* :mod:`.tensor_parallel`: one process group per replica of a tensor-parallel stage.
* :mod:`.zero`: ZeRO-1, the optimizer state and fp32 master weights sharded over a gradient group.
* :mod:`.recompute`: activation recomputation of a stage.
* :mod:`.tied`: parameters tied across stages (a GPT's embedding and head).
"""
