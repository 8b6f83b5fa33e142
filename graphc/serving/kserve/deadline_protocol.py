"""The connection protocol that keeps the server up (``server.config`` runs it under uvicorn).

uvicorn (0.54) times out only idle keep-alive connections (``timeout_keep_alive``); nothing bounds
a connection that sends part of its headers, part of its body, or nothing at all, so enough of
them hold every descriptor. ``DeadlineProtocol`` adds that bound to uvicorn's httptools protocol.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import time
import weakref
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from graphc.serving.kserve.connections import HEAD_TIMEOUT, Connections
from graphc.serving.kserve.protocol import ProtocolError, error_body
from graphc.serving.kserve.throttled_log import ThrottledLog

DEFAULT_READ_TIMEOUT = 30.0
# At shutdown, seconds a request still arriving may go without sending a byte before it is closed.
SHUTDOWN_IDLE = 2.0
# The most bytes of a request that are not body: its request line and headers, and of a chunked
# body its chunk framing and trailers beyond the body's own size. httptools bounds none of them, so
# a client could send gigabytes of headers or trailers within the read timeout, all held; above it
# a 431. (Node allows 16 KiB of headers, Go 1 MiB.)
MAX_HEAD_BYTES = 64 << 10
# The longest URL (request target) httptools parses: its parse_url holds offsets in 16 bits. A longer
# one failed in uvicorn's callback, a 400 "User callback error"; it gets a 414 naming the limit.
MAX_URL_BYTES = 65535
# After a client's FIN, seconds between the interim replies that find out whether it only half-closed
# (it reads them, and its reply after them) or is gone (its kernel answers them with a reset).
PEER_PROBE_INTERVAL = 0.5
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# How every reply written to a connection starts (uvicorn's ``STATUS_LINE``, 100 Continue's too):
# HTTP/1.0's probes send it ahead, a byte at a time.
_REPLY_START = b"HTTP/1.1 "
# A reply to a request still arriving (an error found from its headers or its first bytes, as a 413
# from Content-Length, or a 408) closes the connection in stages, as RFC 9112 (9.6) says a server
# should: the reply says ``connection: close``, the server shuts its sending side once the reply is
# out (the client reads it to its end, then EOF), reads and drops what still arrives for at most
# LINGER_SECONDS (or the read timeout, if shorter) and LINGER_BYTES, then closes; a client still
# sending then gets a reset. Closing at once resets a client that sends its whole body before it
# reads (most do): its send fails, and some systems drop the reply it had not read (Linux keeps
# it). Reading to the body's end (uvicorn) read an endless chunked body for the whole read timeout
# (7.3 GB in 3 s on loopback), then answered it a second time, with a 408. nginx lingers the same
# way, for up to 30 s (lingering_time); 2 s and 64 MiB let a client on a fast link finish sending a
# body twice the default --max-json-bytes and read its 413, while one that sends for ever is reset
# after about 70 MB, 0.05 s on loopback.
LINGER_SECONDS = 2.0
LINGER_BYTES = 64 << 20


def closing_reply(status: int, message: str, head: bytes = b"") -> bytes:
    """The bytes of a JSON error reply that closes its connection; ``head``: more header lines."""
    body = error_body(message)
    return b"%s%scontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (
        STATUS_LINE[status], head, len(body), body)


_TIMEOUT_REPLY = closing_reply(408, "request not received in time")
_HEAD_LATE = closing_reply(408, f"the request line and headers took over {HEAD_TIMEOUT:g} s while the server holds "
                                   f"the most connections its descriptor limit allows")
_HEAD_TOO_LARGE = closing_reply(431, f"the request line and headers (trailers included) exceed the server's limit "
                                        f"of {MAX_HEAD_BYTES} bytes")


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol that closes a connection when a request (headers and body) is
    not in within ``read_timeout`` seconds of its first byte, when a new connection sends nothing
    for that long, or when the client stops reading a reply for that long. A request cut off
    in its headers or its body gets a 408 first; one that sends more than ``MAX_HEAD_BYTES`` bytes
    besides its body (and as many as its body), a 431; one whose URL is past ``MAX_URL_BYTES``, a
    414. At shutdown, a request whose body is still
    arriving is closed once it sends nothing for ``SHUTDOWN_IDLE`` seconds, and a reply the
    client stops reading is dropped after as long: uvicorn would wait for them, so a stalled
    client held the shutdown for the whole read timeout. Behind pipelined requests still being
    answered, the 400, 408 or 431 of the request after them waits for their replies (uvicorn sent
    it first); a client that half-closes still gets the replies of the requests it sent whole.
    A FIN reads the same whether the client half-closed or closed its socket (``MSG_PEEK`` included,
    and TCP keepalive probes carry no new data, so a closed socket does not answer them with a
    reset), so while such a request runs the server sends a probe every ``PEER_PROBE_INTERVAL``
    seconds: a closed socket answers with a reset, the write after it loses the connection, and
    the app stops the run. HTTP/1.1 gets ``100 Continue``; HTTP/1.0 (no 1xx, RFC 9110, 15.2) the
    reply's own first bytes, ``HTTP/1.1 `` (every reply's status line starts so), one a probe, left
    out of the reply when it is written (``_Lingering.write``): after its nine probes (4 s) it is
    not probed again, so a client that half-closed and closes later runs on.
    A connection closed while a request is still arriving lingers (``LINGER_SECONDS``, above).
    Past ``connections``' cap a new connection has a late or idle one closed; with none, its first
    request gets a 503 and it closes at once."""

    def __init__(self, *args: Any, read_timeout: float = DEFAULT_READ_TIMEOUT,
                 log: ThrottledLog, connections: Connections, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.logger = log
        self._connections = connections
        self._over_cap = False  # opened past the cap with no idle connection to close: checked again at its first byte
        self.read_timeout = read_timeout
        self._read_deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None
        self._idle_deadline: asyncio.TimerHandle | None = None  # armed at shutdown, reset by each byte
        self._write_wait = read_timeout  # seconds a reply may go unread; SHUTDOWN_IDLE once shutting down
        self._other_bytes = self._body_bytes = 0  # of the request being received
        self._completed = False  # a request ended in the data being parsed
        self._in_body = False  # the newest request's head is in, its body not yet
        self._running: Any = None  # the cycle whose app runs (later pipelined ones wait in ``pipeline``)
        self._deferred: bytes | None = None  # a closing reply due once earlier requests are answered
        self._peer_probe: asyncio.TimerHandle | None = None  # after a FIN, while a reply is due
        self._ahead = 0  # bytes of _REPLY_START sent as HTTP/1.0 probes, left out of the next write
        self._arriving = False  # a request has begun and not ended: more of it may come
        self._head_since = 0.0  # when the newest request's first byte came (time.monotonic())
        self._linger: asyncio.TimerHandle | None = None  # ends the linger after a close (LINGER_SECONDS)
        self._dropped = 0  # bytes read and dropped while lingering
        self._raw: asyncio.Transport = None  # type: ignore[assignment]  # uvicorn's is _Lingering(_raw)
        self._data = b""  # what data_received is parsing

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._raw = transport
        super().connection_made(_Lingering(transport, self))  # type: ignore[arg-type]
        self._read_deadline = self.loop.call_later(self.read_timeout, self._expire)
        self._over_cap = not self._connections.opened(self)

    def idle(self) -> bool:
        """Between requests: none arriving, running or queued, no reply being written or closing."""
        return not self._arriving and self._quiet()

    def head_since(self) -> float | None:
        """When the request whose head is arriving began, with no reply due ahead of it; else None."""
        return self._head_since if self._arriving and not self._in_body and self._quiet() else None

    def _quiet(self) -> bool:
        """No request running or queued, no reply due or being written, not closing."""
        return not (self._answering() or self._deferred is not None or self.transport.is_closing()
                    or self._raw.get_write_buffer_size())

    def evict(self) -> None:
        """Close this connection, idle or late in its head (a 408), for a new one (``Connections``):
        at once, no linger, as the descriptor is what the new one needs."""
        late = self.head_since() is not None
        self.logger.warning(f"closing the {'connections late in their headers' if late else 'longest-idle connections'} "
                            f"for new ones: %d open, the most the descriptor limit leaves room for",
                            len(self._connections))
        if late:
            self._raw.write(_HEAD_LATE)
        self._raw.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arriving, self._head_since = True, time.monotonic()
        if self._read_deadline is None:  # a later request on a kept-alive connection: its own deadline
            self._read_deadline = self.loop.call_later(self.read_timeout, self._expire)

    def on_url(self, url: bytes) -> None:
        """uvicorn's; a URL past ``MAX_URL_BYTES`` is refused (414) as soon as it gets there."""
        super().on_url(url)
        if len(self.url) > MAX_URL_BYTES:
            raise ProtocolError(f"the request line is too long: its URL exceeds the server's limit of {MAX_URL_BYTES} "
                                f"bytes ({len(self.url)} bytes read); send large data in a POST request's body", 414)

    def on_headers_complete(self) -> None:
        """uvicorn's; an HTTP/1.0 request's ``Expect: 100-continue`` is ignored, as RFC 9110 (10.1.1)
        says a server must (uvicorn sent ``100 Continue``, a 1xx no HTTP/1.0 client takes, 15.2). A
        request with a body that asks to switch protocols (``Connection: upgrade``, as ``curl --http2``
        sends) is refused with a 400: httptools ends such a request at its headers, so the app answered
        an empty body and the body's bytes were dropped (and the requests pipelined after it)."""
        if self.parser.get_http_version() == "1.0":
            self.expect_100_continue = False
        if self.parser.should_upgrade() and not self._should_upgrade():
            headers = dict(self.headers)
            if headers.get(b"content-length", b"0").strip(b" 0") or b"transfer-encoding" in headers:
                raise ProtocolError(f"the request asks to switch protocols (Upgrade: "
                                    f"{headers.get(b'upgrade', b'').decode('latin-1')!r}) and has a body, which this "
                                    "HTTP/1.1 server cannot read after such a request; send it without Upgrade "
                                    "(curl: without --http2)")
        super().on_headers_complete()
        self._in_body = True

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._running = cycle
        super()._start_asgi_task(cycle, functools.partial(self._closing_if_early, cycle, app))

    async def _closing_if_early(self, cycle: Any, app: Any, scope: Any, receive: Any, send: Any) -> None:
        """Run ``app``; a reply it starts while its request's body is still arriving closes the
        connection (``connection: close``, then a linger): the rest of the body is never read."""
        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start" and cycle is self.cycle and self._in_body:
                cycle.keep_alive = False
            await send(message)

        await app(scope, receive, sending)

    def on_response_complete(self) -> None:
        """uvicorn's, which resumes reading and starts the next pipelined request; while requests
        still wait behind that one, reading stays paused. (uvicorn read on after every reply, so a
        client that pipelined requests faster than they were answered queued a read's worth more each
        time, without end.)"""
        super().on_response_complete()
        if self.pipeline and not self.transport.is_closing():
            self.flow.pause_reading()
        self._connections.active(self)
        if self._deferred is not None and not self._answering() and not self.transport.is_closing():
            self.transport.write(self._deferred)
            self.transport.close()

    def eof_received(self) -> bool | None:
        """The client shut its side down (its requests sent, as HTTP/1.0 tools and ``nc -N`` do):
        the requests it sent whole are answered, then the connection closes. (uvicorn closed it at
        once, dropping every reply not yet written.) One whose body or head was cut off never runs.
        While lingering: nothing more comes, close now."""
        if self._linger is not None:
            return None
        self._drop_incomplete()
        newest = self.pipeline[0][0] if self.pipeline else self._running
        if self._in_body or newest is None or newest.response_complete:
            return None  # nothing left to answer (or the running request's body was cut): close now
        newest.keep_alive = False  # its reply closes the connection
        self._cancel("_read_deadline")
        self._cancel("_idle_deadline")
        self._probe_peer()
        return True

    def _probe_peer(self) -> None:
        """While the running request's reply has not started, send a probe, again every
        ``PEER_PROBE_INTERVAL`` seconds: ``100 Continue`` (interim: HTTP/1.1 clients skip it, RFC
        9110, 15.2), to HTTP/1.0 the next byte of ``_REPLY_START`` while one is left. A peer that
        closed its socket resets the connection, and the write after the reset loses it."""
        running = self._running
        legacy = running is not None and running.scope["http_version"] == "1.0"
        if self.transport.is_closing() or running is None or running.response_started \
                or (legacy and self._ahead == len(_REPLY_START)):
            self._peer_probe = None
            return
        if legacy:
            self._raw.write(_REPLY_START[self._ahead:self._ahead + 1])
            self._ahead += 1
        else:
            self.transport.write(_CONTINUE)
        self._peer_probe = self.loop.call_later(PEER_PROBE_INTERVAL, self._probe_peer)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_body = self._arriving = False
        self._other_bytes = self._body_bytes = 0
        self._completed = True
        self._cancel("_read_deadline")
        self._cancel("_idle_deadline")

    def data_received(self, data: bytes) -> None:
        if self._linger is not None:  # dropped unparsed; past LINGER_BYTES the connection goes
            self._dropped += len(data)
            if self._dropped > LINGER_BYTES:
                self._raw.abort()
            return
        if self._deferred is not None:  # the parser stopped at an error; the connection closes soon
            return
        self._connections.active(self)
        if self._over_cap:
            self._over_cap = False
            if not self._connections.admit(self):  # refused unread, closed at once: no linger past the cap
                self._raw.write(closing_reply(503, f"the server holds the most connections its descriptor limit "
                                                   f"allows ({self._connections.cap}), none idle or late; try again later",
                                              b"retry-after: 1\r\n"))
                self._raw.close()
                return
        body_before, self._completed, self._data = self._body_bytes, False, data
        super().data_received(data)
        self._data = b""
        # The bytes after a request that ended in ``data`` belong to the next one, uncounted (at most
        # one read's worth).
        if not self._completed:
            self._other_bytes += len(data) - (self._body_bytes - body_before)
            if self._other_bytes > MAX_HEAD_BYTES + self._body_bytes and not self.transport.is_closing():
                self._reply_and_close(_HEAD_TOO_LARGE)
        if self._idle_deadline is not None:
            self._idle_deadline.cancel()
            self._idle_deadline = self.loop.call_later(SHUTDOWN_IDLE, self._expire)

    def _unsupported_upgrade_warning(self) -> None:
        """httptools stopped at a request (bodiless) asking to switch protocols; it is answered over
        HTTP/1.1, and what followed it in ``data`` is parsed now (uvicorn dropped it: a request pipelined
        behind it was never answered, and it logged advice to install a WebSocket library)."""
        self.logger.warning("a request asked to switch protocols (Upgrade); answered over HTTP/1.1")
        rest = self._data[sys.exc_info()[1].args[0]:]
        if rest:
            self.data_received(rest)

    def shutdown(self) -> None:
        """uvicorn's: close an idle connection, let a request it runs finish; and a request the
        app is still reading (not one queued behind another) gets ``SHUTDOWN_IDLE`` seconds a byte."""
        super().shutdown()
        receiving = self._read_deadline is not None and not self.pipeline
        if receiving and self.cycle is not None and not self.cycle.response_complete:
            self._idle_deadline = self.loop.call_later(SHUTDOWN_IDLE, self._expire)
        self._write_wait = SHUTDOWN_IDLE
        if self._write_deadline is not None:  # a reply the client is not reading
            self._arm_write_deadline()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._arm_write_deadline()

    def _arm_write_deadline(self) -> None:
        self._cancel("_write_deadline")
        self._write_deadline = self.loop.call_later(self._write_wait, self._abort)

    def _abort(self) -> None:
        """The client stopped reading its reply: drop the connection and the reply buffered for it
        (``close`` waits for the buffer to go out, so an unread reply held both for good)."""
        self.transport.abort()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel("_write_deadline")

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.closed(self)
        self._cancel("_read_deadline")
        self._cancel("_write_deadline")
        self._cancel("_idle_deadline")
        self._cancel("_peer_probe")
        self._cancel("_linger")
        running = self._running
        super().connection_lost(exc)
        # uvicorn tells only the newest request; one running ahead of pipelined ones is told too
        if running is not None and running is not self.cycle and not running.response_complete:
            _tell_disconnected(running)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's reply to a request its HTTP parser refuses, as ``{"error": ...}`` like every
        other error, naming what the parser found (it is called while handling the parser's error);
        a callback's ``ProtocolError`` with its own status (a 414)."""
        found = sys.exc_info()[1]
        found = found.__context__ if isinstance(found.__context__, ProtocolError) else found  # a callback's
        head = b"".join(b"%s: %s\r\n" % pair for pair in self.server_state.default_headers)
        status = found.status if isinstance(found, ProtocolError) else 400
        self._reply_and_close(closing_reply(status, f"invalid HTTP request: {found}" if found is not None and str(found)
                                            else msg, head))

    def _cancel(self, name: str) -> None:
        handle = getattr(self, name)
        if handle is not None:
            handle.cancel()
            setattr(self, name, None)

    def _expire(self) -> None:
        if not self.transport.is_closing():
            self._reply_and_close(_TIMEOUT_REPLY)

    def _answering(self) -> bool:
        """Whether requests received whole still wait for their replies."""
        return bool(self.pipeline) or (self._running is not None and not self._running.response_complete)

    def _drop_incomplete(self) -> None:
        """Forget the newest request if it is still arriving and queued behind another: it never runs."""
        if self._in_body and self.cycle is not self._running and self.pipeline:
            self.pipeline.popleft()  # uvicorn queues each pipelined request on the left
            self.cycle = self.pipeline[0][0] if self.pipeline else self._running  # what shutdown acts on
            self._in_body = False

    def _reply_and_close(self, reply: bytes) -> None:
        """``reply`` is for the request still arriving. Behind requests received whole and not yet
        answered (pipelined), it waits for their replies, in order; otherwise send it when no reply
        is under way (the request is still in its head, or the app still waits for its body), then
        close. The app then reads a disconnect, and uvicorn drops whatever it sends."""
        self._drop_incomplete()
        if not self._in_body and self._answering():
            self._deferred = reply
            self._cancel("_read_deadline")
            self._cancel("_idle_deadline")
            self.flow.pause_reading()
            return
        # the request still arriving was answered (or is being answered) by the app: never a second reply
        answered = self._in_body and self.cycle.response_started
        if self._write_deadline is None and not answered:
            self.transport.write(reply)
        self.transport.close()

    def _close(self) -> None:
        """Close the connection (uvicorn's ``transport.close()`` too); while a request is still
        arriving, linger first: shut the sending side once the reply is out, and read and drop
        what comes for ``min(LINGER_SECONDS, read_timeout)`` seconds or ``LINGER_BYTES`` bytes. An
        app still reading that request's body reads a disconnect now: it never gets the rest (it
        read none until the linger ended, holding its ``--max-queue`` place 2 s past a 408)."""
        if self._linger is not None:
            return
        if not self._arriving or self._raw.is_closing():
            self._raw.close()
            return
        for name in ("_read_deadline", "_idle_deadline", "_peer_probe"):
            self._cancel(name)
        if self.cycle is not None and not self.cycle.response_started:
            _tell_disconnected(self.cycle)
        self._linger = self.loop.call_later(min(LINGER_SECONDS, self.read_timeout), self._raw.abort)
        if self._raw.can_write_eof():  # a TLS transport cannot shut one side: it lingers without
            self._raw.write_eof()
        self.flow.resume_reading()


def _tell_disconnected(cycle: Any) -> None:
    """The app running ``cycle`` reads a disconnect at its next ``receive()``."""
    cycle.disconnected = True
    cycle.message_event.set()


class _Lingering:
    """A connection's transport as uvicorn and ``DeadlineProtocol`` see it: ``close`` is the
    protocol's (it may linger), a lingering connection reads as closing, and ``write`` leaves out
    what HTTP/1.0 probes sent ahead."""

    def __init__(self, transport: asyncio.Transport, protocol: DeadlineProtocol):
        # A weak proxy: the protocol holds this transport, and the cycle kept every closed connection
        # with its last request (a 64 KiB head: 1.2 MB of header objects) until the cyclic GC ran;
        # 400 such requests grew the server by 1 GB.
        self._transport, self._protocol = transport, weakref.proxy(protocol)

    def close(self) -> None:
        self._protocol._close()

    def write(self, data: bytes) -> None:
        """Write ``data``, less the bytes of its start that HTTP/1.0 probes sent ahead."""
        ahead, self._protocol._ahead = self._protocol._ahead, 0
        self._transport.write(data[ahead:] if ahead else data)

    def is_closing(self) -> bool:
        return self._protocol._linger is not None or self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
