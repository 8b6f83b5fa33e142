"""Running the app under uvicorn so that it stays up: a deadline on every connection
(``deadline_protocol.DeadlineProtocol``), a listening socket bound before anything says "serving", and as many
file descriptors as the system allows.
"""

from __future__ import annotations

import errno
import inspect
import logging
import socket
from typing import Any, Callable

import uvicorn

from graphc.errors import ServeError
from graphc.serving.kserve.connections import Connections, connection_cap
from graphc.serving.kserve.deadline_protocol import DEFAULT_READ_TIMEOUT, DeadlineProtocol
from graphc.serving.kserve.throttled_log import ThrottledLog

# At shutdown, seconds the requests in flight have to be answered; uvicorn then cancels them, and each gets
# a 503 and has its model's run stopped (``infer.py``).
SHUTDOWN_GRACE = 30.0
DEFAULT_BACKLOG = 4096


def listen(host: str, port: int, backlog: int = DEFAULT_BACKLOG) -> socket.socket:
    """A TCP socket listening on ``host:port``; a port in use or a bad address is a ``ServeError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=backlog)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            message = f"port {port} on {host} is already in use; choose another with --port"
        else:
            message = f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    raise ServeError(message)


class Server(uvicorn.Server):
    """``uvicorn.Server`` that calls ``on_ready((host, port))`` with the address it listens on
    (the port the system chose for port 0) once it accepts connections; a callback that takes
    no argument (as before the address was given) is called without it. At shutdown it logs the
    warnings ``config``'s ``ThrottledLog`` left out since it last logged each (``flush``)."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[..., None] | None = None):
        super().__init__(config)
        self.on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_ready is not None:
            address = tuple(self.servers[0].sockets[0].getsockname()[:2])
            self.on_ready(*([address] if _takes_an_argument(self.on_ready) else []))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        log = getattr(self.config.http, "log", None)  # ``config``'s ThrottledLog
        if log is not None:
            log.flush()


def _takes_an_argument(fn: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: give it the address
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters)


def config(app: Any, read_timeout: float = DEFAULT_READ_TIMEOUT, backlog: int = DEFAULT_BACKLOG,
           log_level: str = "warning", access_log: bool = False) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` with ``DeadlineProtocol``.

    uvloop (and asyncio) set TCP_NODELAY on every accepted connection, so replies are not held
    back by Nagle's algorithm (tests/test_serve.py checks). Idle keep-alive connections close
    after ``min(5, read_timeout)`` s. No proxy-header rewriting: the server is not meant to sit
    behind a proxy it trusts. A connection's warnings about what its client sent are logged at
    most once per ``WARNING_INTERVAL`` seconds each (``ThrottledLog``). The connections held stay
    below the descriptor limit (``connections.Connections``).
    """

    log = ThrottledLog(logging.getLogger("uvicorn.error"))
    connections = Connections(connection_cap())

    def protocol(**kwargs: Any) -> DeadlineProtocol:
        return DeadlineProtocol(read_timeout=read_timeout, log=log, connections=connections, **kwargs)

    protocol.log = log  # Server.shutdown flushes it

    return uvicorn.Config(app, http=protocol, log_level=log_level, access_log=access_log, backlog=backlog,
                          timeout_keep_alive=min(5, read_timeout), timeout_graceful_shutdown=SHUTDOWN_GRACE,
                          server_header=False, proxy_headers=False)
