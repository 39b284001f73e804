"""One error type that carries a place: the file, the field path and the reason.

The CLI turns a :class:`HetplanError` into a single line and exit code 2, so every bad input a user
can make is reported the same way, without a traceback::

    raise HetplanError("expected a bandwidth such as '100Gbps'", file="c.yaml", field="network.bandwidth")
    # c.yaml: network.bandwidth: expected a bandwidth such as '100Gbps'
"""

from __future__ import annotations

__all__ = ["HetplanError"]


class HetplanError(Exception):
    """A user-facing error: ``file: field: reason`` (parts that are unknown are left out)."""

    def __init__(self, reason: str, *, file: str | None = None, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.file = file
        self.field = field

    def located(self, *, file: str | None = None, field: str | None = None) -> HetplanError:
        """Return a copy that fills in the place where this error did not know it yet."""
        return HetplanError(self.reason, file=self.file or file, field=self.field or field)

    def __str__(self) -> str:
        parts = [p for p in (self.file, self.field) if p]
        parts.append(self.reason)
        return ": ".join(parts)
