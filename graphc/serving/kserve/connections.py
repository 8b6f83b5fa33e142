"""How many connections a server holds open: below its process's descriptor limit, a late or idle
connection making room for each new one.

Every connection is a file descriptor. Once a process holds its ``RLIMIT_NOFILE``, uvloop (libuv)
accepts each new connection and closes it at once: idle connections (a client that connected and
sent nothing, or one between requests) shut new clients out until their deadlines close them, up to
the read timeout (30 s by default). Holding connections below the limit, and closing the
longest-idle one for each new connection past it, keeps a new client served. A client that sends its
request line and then its headers a byte at a time (slowloris) is busy, not idle: one whose head
has been arriving for ``HEAD_TIMEOUT`` seconds is closed first.
"""

from __future__ import annotations

import os
import resource
import time
from collections import OrderedDict
from typing import Protocol

# Descriptors kept for what the process opens once it is configured, beyond those open then (the
# models' files, read and closed by then, the listening socket, logs): the event loop's own (10 with
# uvloop), a module imported lazily, connections closed but not yet released (2 at most measured
# under 400 reconnecting clients). Models hold none once loaded: graphc serve holds 14 descriptors
# besides its connections on numpy with one model or the 14 of tests/data/zoo, 17 on ort-cpu (its
# telemetry database). A fixed reserve of 64 kept 47 of 256 unused, and was too few for a process
# that holds more files of its own when it serves an app (``serve_app``).
HEADROOM_DESCRIPTORS = 32
# Seconds a request's line and headers may take to arrive before, past the cap, the connection is
# closed for a new one (ahead of idle ones). A client sends its head in one write, in one round trip
# on any link; 400 slowloris clients under ``ulimit -n 256`` held every connection for the 30 s read
# timeout, the other clients getting 503s or resets.
HEAD_TIMEOUT = 1.0


class Connection(Protocol):
    def idle(self) -> bool: ...

    def head_since(self) -> float | None:
        """When (``time.monotonic()``) its request's head began arriving; None if none is."""

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


def open_descriptors() -> int:
    """How many descriptors this process holds (Linux's ``/proc/self/fd``, else ``/dev/fd``)."""
    for listing in ("/proc/self/fd", "/dev/fd"):
        if os.path.isdir(listing):
            return len(os.listdir(listing)) - 1  # less the listing's own
    raise OSError("neither /proc/self/fd nor /dev/fd lists this process's descriptors")


def connection_cap() -> int | None:
    """The most connections this process may hold: its soft ``RLIMIT_NOFILE`` less the
    descriptors it holds now and ``HEADROOM_DESCRIPTORS``; None when the limit is infinite."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    return max(1, soft - open_descriptors() - HEADROOM_DESCRIPTORS)


class Connections:
    """A server's open connections, least recently active first. Past ``cap``, each new one has
    one closed (``evict``): the one whose request's head has been arriving longest, if for
    ``HEAD_TIMEOUT`` seconds, else the longest-idle one (between requests); never one whose
    request's body is arriving, one running or queued, or a reply still being written."""

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
        """Whether ``conn`` is within the cap, once another connection is closed if it is not."""
        if self.cap is None or len(self._open) <= self.cap:
            return True
        victim = self._late_head(conn) or next((o for o in self._open if o is not conn and o.idle()), None)
        if victim is None:
            return False
        del self._open[victim]
        victim.evict()
        return True

    def _late_head(self, conn: Connection) -> Connection | None:
        """The connection other than ``conn`` whose head has been arriving longest, if for
        ``HEAD_TIMEOUT`` seconds."""
        late = time.monotonic() - HEAD_TIMEOUT
        heads = [(since, other) for other in self._open
                 if other is not conn and (since := other.head_since()) is not None and since <= late]
        return min(heads, key=lambda pair: pair[0])[1] if heads else None

    def active(self, conn: Connection) -> None:
        """``conn`` did something (received bytes, finished a reply): it is idle the least."""
        if conn in self._open:
            self._open.move_to_end(conn)

    def closed(self, conn: Connection) -> None:
        self._open.pop(conn, None)
