"""Op-by-op cost accounting for the convolutional and MLP families.

    t = Tally(d=4)
    t.keep(3 * 224 * 224)                         # the block keeps its input (conv1 needs it)
    hw = t.conv(3, 64, 7, 2, 3, (224, 224))       # (112, 112)
    t.batchnorm(64, hw, keep_input=True)
    cost = t.block("stem", "stem", output_elems=64 * 56 * 56, work_items=112 * 112)

Each op adds its parameters, multiply-adds, the bytes it reads and writes (no fusion) and one kernel.
Convolutions (implicit GEMM: rows = output pixels, inner = C_in·k², columns = C_out) and linear
layers become ``gemm`` parts; every other op adds to the block's one ``memory`` part.
What is kept for backward is said explicitly with :meth:`Tally.keep` or an op's ``keep_*`` flag,
following one rule for every family: a block keeps its own input (the next block keeps its output),
plus each internal tensor some op saves (BatchNorm input, ReLU output, pooling indices, masks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetplan.profile.analytic.base import BlockCost, Work, memory_work
from hetplan.profile.efficiency import TILE

__all__ = ["INDEX_BYTES", "Tally", "conv_out"]

#: Max-pooling saves int64 argmax indices; dropout saves bool masks.
INDEX_BYTES = 8
MASK_BYTES = 1


def conv_out(size: int, kernel: int, stride: int, pad: int) -> int:
    """Output length of a convolution or pooling window along one axis (floor mode)."""
    return (size + 2 * pad - kernel) // stride + 1


@dataclass
class Tally:
    """Running totals for one block, at ``d`` bytes per element."""

    d: int
    params: int = 0
    macs: float = 0.0
    kept: float = 0.0  # bytes kept for backward, per sample
    traffic: float = 0.0  # activation bytes read + written, per sample
    kernels: int = 0
    gemms: list[Work] = field(default_factory=list)  # convolutions and linear layers, in order

    def keep(self, elems: float, *, nbytes: float | None = None) -> None:
        """Count ``elems`` elements (at ``nbytes`` each, default ``d``) as kept for backward."""
        self.kept += elems * (self.d if nbytes is None else nbytes)

    def _rw(self, read_elems: float, write_elems: float) -> None:
        self.traffic += (read_elems + write_elems) * self.d
        self.kernels += 1

    def conv(
        self, cin: int, cout: int, kernel: int, stride: int, pad: int, hw: tuple[int, int], *, bias: bool = False
    ) -> tuple[int, int]:
        """A dense 2-D convolution; returns the output (height, width)."""
        ho, wo = conv_out(hw[0], kernel, stride, pad), conv_out(hw[1], kernel, stride, pad)
        weights = cout * cin * kernel * kernel + (cout if bias else 0)
        macs = float(cout * ho * wo) * cin * kernel * kernel
        self.params += weights
        self.macs += macs
        self._rw(cin * hw[0] * hw[1], cout * ho * wo)
        self._gemm(2.0 * macs, (cin * hw[0] * hw[1] + cout * ho * wo) * self.d, weights, ho * wo * cout / TILE)
        return ho, wo

    def _gemm(self, flops: float, traffic: float, weights: int, tiles: float) -> None:
        self.gemms.append(
            Work(kind="gemm", flops=flops, traffic=float(traffic), weight_traffic=float(weights * self.d), tiles=tiles)
        )

    def batchnorm(self, c: int, hw: tuple[int, int], *, keep_input: bool) -> None:
        """BatchNorm (weight and bias; running statistics are buffers, not parameters)."""
        self.params += 2 * c
        self._rw(c * hw[0] * hw[1], c * hw[0] * hw[1])
        if keep_input:
            self.keep(c * hw[0] * hw[1])

    def relu(self, elems: float, *, keep_output: bool) -> None:
        """ReLU (in place: still one read and one write)."""
        self._rw(elems, elems)
        if keep_output:
            self.keep(elems)

    def add(self, elems: float) -> None:
        """Residual add: two reads, one write."""
        self._rw(2 * elems, elems)

    def maxpool(self, c: int, kernel: int, stride: int, pad: int, hw: tuple[int, int]) -> tuple[int, int]:
        """Max pooling; keeps its int64 indices (its input is kept by whoever owns it)."""
        ho, wo = conv_out(hw[0], kernel, stride, pad), conv_out(hw[1], kernel, stride, pad)
        self._rw(c * hw[0] * hw[1], c * ho * wo)
        self.traffic += c * ho * wo * INDEX_BYTES
        self.keep(c * ho * wo, nbytes=INDEX_BYTES)
        return ho, wo

    def avgpool(self, in_elems: float, out_elems: float) -> None:
        """Average pooling: needs only shapes for backward."""
        self._rw(in_elems, out_elems)

    def linear(self, fin: int, fout: int, *, bias: bool = True, keep_input: bool) -> None:
        """A fully connected layer on one row per sample."""
        weights = fin * fout + (fout if bias else 0)
        self.params += weights
        self.macs += float(fin) * fout
        self._rw(fin, fout)
        self._gemm(2.0 * fin * fout, (fin + fout) * self.d, weights, fout / TILE)  # one row per sample
        if keep_input:
            self.keep(fin)

    def dropout(self, elems: float) -> None:
        """Dropout: reads and writes the tensor, writes and keeps a 1-byte mask."""
        self._rw(elems, elems)
        self.traffic += elems * MASK_BYTES
        self.keep(elems, nbytes=MASK_BYTES)

    def log_softmax(self, elems: float) -> None:
        """The loss's log-softmax over the logits; it keeps its output for backward."""
        self.keep(elems)

    def block(self, name: str, kind: str, *, output_elems: float, work_items: float) -> BlockCost:
        """The finished block's costs (FLOPs = 2 x multiply-adds)."""
        gemm_params = sum(w.weight_traffic for w in self.gemms) / self.d
        memory_kernels = self.kernels - len(self.gemms)
        parts = list(self.gemms)
        if memory_kernels > 0:
            parts.append(
                memory_work(
                    self.traffic - sum(w.traffic for w in self.gemms),
                    memory_kernels,
                    weight_traffic=(self.params - gemm_params) * self.d,
                )
            )
        return BlockCost(
            name=name,
            kind=kind,
            params=self.params,
            param_bytes=float(self.params * self.d),
            flops_fwd=2.0 * self.macs,
            activation_bytes=float(self.kept),
            output_bytes=float(output_elems * self.d),
            weight_traffic=float(self.params * self.d),
            activation_traffic=float(self.traffic),
            work_items=float(work_items),
            kernels=max(self.kernels, 1),
            parts=tuple(parts) if self.kernels else (),
        )
