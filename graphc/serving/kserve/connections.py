"""How many connections a server holds open: below its process's descriptor limit, the
longest-idle connection making room for each new one.

Every connection is a file descriptor. Once a process holds its ``RLIMIT_NOFILE``, uvloop (libuv)
accepts each new connection and closes it at once: idle connections (a client that connected and
sent nothing, or one between requests) shut new clients out until their deadlines close them, up to
the read timeout (30 s by default). Holding connections below the limit, and closing the
longest-idle one for each new connection past it, keeps a new client served.
"""

from __future__ import annotations

import resource
from collections import OrderedDict
from typing import Protocol

# Descriptors kept for everything but connections (the listening socket, the event loop's, logs,
# what the models' backends open), at most a quarter of the limit. graphc serve holds 14 besides its
# connections with a model on numpy, 17 on ort-cpu.
RESERVED_DESCRIPTORS = 64


class Connection(Protocol):
    def idle(self) -> bool: ...

    def evict(self) -> None: ...


def raise_descriptor_limit() -> int:
    """Raise this process's soft limit on open files to the hard limit; returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # a sandbox may refuse; the soft limit stays
            pass
    return soft


def connection_cap() -> int | None:
    """The most connections this process may hold: its soft ``RLIMIT_NOFILE`` less
    ``RESERVED_DESCRIPTORS`` (at most a quarter of it); None when the limit is infinite."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    return max(1, soft - min(RESERVED_DESCRIPTORS, soft // 4))


class Connections:
    """A server's open connections, least recently active first. Past ``cap``, each new one has
    the longest-idle one closed (``evict``): one between requests, not one with a request arriving,
    running or queued, or a reply still being written."""

    def __init__(self, cap: int | None):
        self.cap = cap
        self._open: OrderedDict[Connection, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, conn: Connection) -> bool:
        """Count ``conn`` in; False when it is over the cap with no idle connection to close."""
        self._open[conn] = None
        return self.admit(conn)

    def admit(self, conn: Connection) -> bool:
        """Whether ``conn`` is within the cap, once the longest-idle other connection is closed if it
        is not."""
        if self.cap is None or len(self._open) <= self.cap:
            return True
        for other in self._open:
            if other is not conn and other.idle():
                del self._open[other]
                other.evict()
                return True
        return False

    def active(self, conn: Connection) -> None:
        """``conn`` did something (received bytes, finished a reply): it is idle the least."""
        if conn in self._open:
            self._open.move_to_end(conn)

    def closed(self, conn: Connection) -> None:
        self._open.pop(conn, None)
