"""WaveSync's bookkeeping on one device, against a scripted parameter server (no processes): its own
unapplied waves are added back onto what it pulls, and an overflow is pushed as one and backs the
scale off only for the other workers' overflows."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hetplan.runtime.sync.param_server import Pulled
from hetplan.runtime.sync.wave_sync import WaveSync


@dataclass
class ScriptedServer:
    """Answers pulls from a script of (version, weights, skipped clocks so far); records pushes."""

    replies: list[Pulled]
    pushes: list[tuple[int, torch.Tensor, bool]] = field(default_factory=list)
    total_bytes: int = 0

    def push(self, clock: int, flat: torch.Tensor, *, overflow: bool = False) -> None:
        self.pushes.append((clock, flat.clone(), overflow))

    def pull(self, min_version: int) -> Pulled:
        reply = self.replies.pop(0)
        assert reply.version >= min_version
        return reply

    def stop(self) -> None:
        pass


def test_a_worker_ahead_adds_its_own_unapplied_waves_to_what_it_pulls() -> None:
    w0, w1 = torch.zeros(3), torch.full((3,), 10.0)
    server = ScriptedServer([Pulled(0, w0.clone(), 0), Pulled(1, w1.clone(), 0)])
    sync = WaveSync(server, wave=1, staleness=1)  # type: ignore[arg-type]
    g0, g1 = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5, 0.5, 0.5])
    first = sync.after_step(0, w0, g0, lr=0.1, to_mean=2.0)
    # version 0 lacks clock 0: its own local update of clock 0 is added back
    torch.testing.assert_close(first.weights, w0 - 0.2 * g0)
    assert first.pulled and sync.log[-1]["waves_ahead"] == 1 and sync.log[-1]["own_waves"] == 1
    second = sync.after_step(1, first.weights, g1, lr=0.1, to_mean=2.0)
    # version 1 holds clock 0 (the server's step replaces the local one); clock 1 is still its own
    torch.testing.assert_close(second.weights, w1 - 0.2 * g1)
    assert [c for c, _, _ in server.pushes] == [0, 1]
    torch.testing.assert_close(server.pushes[1][1], g1)  # the gradient is pushed, not the update


def test_an_overflow_is_pushed_and_backs_off_for_the_others_only() -> None:
    w = torch.ones(2)
    server = ScriptedServer([Pulled(1, w.clone(), 1), Pulled(2, w.clone(), 2), Pulled(3, w.clone(), 2)])
    sync = WaveSync(server, wave=1, staleness=0)  # type: ignore[arg-type]
    own = sync.after_step(0, w, None, lr=0.1, to_mean=1.0)  # this pipeline overflowed
    assert server.pushes[0][2] and torch.equal(server.pushes[0][1], torch.zeros(2))
    assert own.skipped and own.backoff == 0  # its own overflow: the executor backed off already
    other = sync.after_step(1, w, torch.ones(2), lr=0.1, to_mean=1.0)
    assert not server.pushes[1][2]
    assert other.skipped and other.backoff == 1  # another worker's overflow skipped clock 1
    fine = sync.after_step(2, w, torch.ones(2), lr=0.1, to_mean=1.0)
    assert not fine.skipped and fine.backoff == 0
