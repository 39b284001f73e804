"""What every rank would otherwise do once, done by the fork server it is forked from.

    multiprocessing.set_forkserver_preload([..., "hetplan.runtime.processes.warm"])

A rank builds its blocks on torch's meta device first (:func:`hetplan.models.base.uninitialised`:
parameters drawn once, not twice). torch's first meta-device operation imports its Python meta
kernels and with them ``torch._dynamo``, ``torch._inductor`` and sympy: about 900 modules, 1.7-2 s
of CPU on a laptop-class core, in every rank of every launch. Importing this module in the server
does it once before the fork; it starts no thread of its own (the server must not run more
threads than numpy's idle BLAS pool).
"""

from __future__ import annotations

import torch

torch.empty(0, device="meta").normal_()
