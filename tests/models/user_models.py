"""User model factories for the tests, referenced as ``user_models:NAME`` (tests/models on sys.path)."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

NOT_CALLABLE = 3


def build(width: int = 16, input: int = 8, classes: int = 4) -> nn.Sequential:
    """Three named blocks: fc1 (Linear + ReLU), fc2 (Linear + ReLU), out (Linear -> logits)."""
    return nn.Sequential(
        OrderedDict(
            fc1=nn.Sequential(nn.Linear(input, width), nn.ReLU()),
            fc2=nn.Sequential(nn.Linear(width, width), nn.ReLU()),
            out=nn.Linear(width, classes),
        )
    )


def build_list(width: int = 16) -> list[nn.Module]:
    """A plain list of blocks with a regression output ``[B, 1]``."""
    return [nn.Linear(8, width), nn.Tanh(), nn.Linear(width, 1)]


def build_conv(channels: int = 4) -> nn.Sequential:
    """Images ``[3, 8, 8]`` -> a feature map (regression to a fixed pattern)."""
    return nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(), nn.Conv2d(channels, 2, 3, padding=1))


def not_modules() -> str:
    return "not a model"


def list_with_a_number() -> list[object]:
    return [nn.Linear(8, 8), 3]


def empty() -> list[nn.Module]:
    return []


def broken() -> nn.Sequential:
    raise RuntimeError("the factory itself is broken")


class TwoOutputs(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


def returns_tuple() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 8), TwoOutputs(), nn.Linear(8, 2))


def do_not_chain() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.Linear(8, 2))


def shared_tokens(vocab: int = 11, width: int = 8, seq: int = 5):
    """Token ids in (int64), a user loss (mean cross-entropy), and one Linear used by two blocks
    (``first`` and ``again``): a ModelSpec with a shared layer."""
    import torch.nn.functional as F  # noqa: N812

    from hetplan.models.spec import ModelSpec

    shared = nn.Linear(width, width)
    blocks = nn.Sequential(
        OrderedDict(
            embed=nn.Embedding(vocab, width),
            first=nn.Sequential(shared, nn.Tanh()),
            middle=nn.Sequential(nn.Linear(width, width), nn.Tanh()),
            again=nn.Sequential(shared, nn.Tanh()),
            out=nn.Linear(width, vocab),
        )
    )

    def sample(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, vocab, (seq,), generator=g)
        return ids, (ids * 3 + 1) % vocab

    def loss(y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(y.flatten(0, 1), t.flatten())

    return ModelSpec(blocks, loss=loss, reduction="mean", sample=sample)


def shared_four(width: int = 16) -> nn.Sequential:
    """The issue's four-block model whose first and third blocks share one layer."""
    shared = nn.Linear(width, width)
    return nn.Sequential(shared, nn.Tanh(), shared, nn.Linear(width, 4))


def spec_tuple_loss():
    from hetplan.models.spec import ModelSpec

    return ModelSpec(
        [nn.Linear(4, 2)],
        loss=lambda y, t: (y - t).pow(2),
        sample=lambda g: (torch.randn(4, generator=g), torch.zeros(2)),
    )


def spec_loss_without_sample():
    from hetplan.models.spec import ModelSpec

    return ModelSpec([nn.Linear(4, 2)], loss=lambda y, t: y.sum())


def spec_bad_reduction():
    from hetplan.models.spec import ModelSpec

    return ModelSpec(
        [nn.Linear(4, 2)], loss=lambda y, t: y.sum(), reduction="avg", sample=lambda g: (torch.randn(4), torch.zeros(2))
    )


def spec_tuple_block():
    from hetplan.models.spec import ModelSpec

    return ModelSpec(
        [nn.Linear(4, 4), TwoOutputs(), nn.Linear(4, 2)],
        loss=lambda y, t: y.sum(),
        sample=lambda g: (torch.randn(4, generator=g), torch.zeros(2)),
    )
