"""The bytes a server's infer requests hold at once (``--max-inflight-bytes``).

``--max-body-bytes`` bounds one request and ``--max-queue`` how many are held, but not their product:
32 requests of 41 MB at once held 1.26 GB more than the idle server (scripts/bench_serve_flood.py).
Each request claims its body's bytes from one budget before it reads them (all of a
``Content-Length`` from its headers, a chunked body's as its chunks arrive), trades them for its
reply's bytes once its model has answered, and gives everything back when it ends, whichever way.
"""

from __future__ import annotations


class InflightBytes:
    """A server's budget of request and reply bytes held at once: ``held`` of ``limit``."""

    def __init__(self, limit: int):
        self.limit, self.held = limit, 0

    def claim(self) -> Claim:
        return Claim(self)


class Claim:
    """One request's share of an ``InflightBytes``. Used from the event loop only: no lock."""

    def __init__(self, budget: InflightBytes):
        self.budget, self.bytes = budget, 0

    def take(self, n: int) -> bool:
        """Take ``n`` more bytes if the budget has room; False (nothing taken) if it has not."""
        if self.budget.held + n > self.budget.limit:
            return False
        self.hold(n)
        return True

    def hold(self, n: int) -> None:
        """Count ``n`` bytes that already exist (a built reply), room or not."""
        self.bytes += n
        self.budget.held += n

    def release(self) -> None:
        """Give back every byte taken."""
        self.budget.held -= self.bytes
        self.bytes = 0
