"""The infer endpoint as a plain ASGI handler: the hot path of the server.

``POST /v2/models/{name}[/versions/{v}]/infer`` skips FastAPI's routing, dependency solving and
response classes (a few hundred microseconds of Python per request, measured with
scripts/bench_serve.py): headers come straight from the ASGI scope, the body is read with a
size limit, and the reply goes out as two ASGI messages with ``Content-Length`` set.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import re
import traceback
import zlib
from typing import Any, Callable

from anyio import CapacityLimiter, to_thread

from graphc.errors import BackendUnavailable, GraphcError, RunCancelled
from graphc.serving.kserve.deadline import DEFAULT_REQUEST_TIMEOUT, Deadline
from graphc.serving.kserve.inflight import Claim, InflightBytes
from graphc.serving.kserve.protocol import ProtocolError, decode_request, encode_response, error_body
from graphc.serving.kserve.repository import ServedModel

INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")
# Every request decodes, runs and encodes on a worker thread, never on the event loop: a request
# with a small body can still run for seconds (a Loop whose trip count is an input), and other
# connections, health checks included, must not wait for it. The hop costs (scripts/bench_serve.py,
# two-layer net, batch 1, 2 shared CPUs; p50 and req/s, 1 client / 8 clients): fast requests run
# on the loop as before 0.220 ms, 4291 / 4571 req/s; the loop's default executor 0.283 ms,
# 3233 / 3849 req/s; anyio's to_thread 0.336 ms, 2623 / 3537 req/s. So light requests use the
# default executor (min(32, CPUs + 4) threads), and bodies over HEAVY_BYTES anyio's with a limiter, as
# do compressed bodies of any size (inflated on that thread: a bomb would otherwise hold the loop).
HEAVY_BYTES = 1 << 20
# Parsing JSON tensor data costs about 40 bytes of memory per byte of JSON (Python objects for
# every number, measured: a 95 MB body peaks at 4 GB), so the JSON part of a request has its own,
# smaller limit; large tensors belong in the binary section. Heavy requests also decode a few at
# a time, so many of them at once queue instead of multiplying the peak.
DEFAULT_MAX_BODY_BYTES = 256 << 20
DEFAULT_MAX_JSON_BYTES = 32 << 20
HEAVY_AT_ONCE = 4
# Infer requests held at once (being received, waiting for a thread, running or having their reply
# read); past it a request is refused with 503 from its headers, before its body is read, so a flood
# of them cannot hold memory or queue without end. 128 keeps a few threads' worth of work queued
# behind the running ones.
DEFAULT_MAX_QUEUE = 128
# The largest reply body: an output's size may depend on the data (a Range or Expand of a fed
# size), so a tiny request could ask for gigabytes; past it the request gets 400, the reply unbuilt.
DEFAULT_MAX_REPLY_BYTES = 1 << 30
# The largest tensor a request may make its model allocate where the request's values size it (a
# ConstantOfShape of a fed shape, a Range to a fed limit: 4 GB from a 60-byte request, and
# --max-queue of them at once), checked before it is allocated (``graphc.backends.value_sized``);
# past it the request gets 413. 4 GiB leaves room for large legitimate batches.
DEFAULT_MAX_TENSOR_BYTES = 4 << 30
# The most bytes such a model's main-graph tensors of known shape may hold at once for a request
# (each under the bound above, many of them add up), checked from the same shape inference.
DEFAULT_MAX_REQUEST_BYTES = 8 << 30
# A reply goes out this many bytes at a time (each a copy, which the transport may keep until it is
# sent): the written reply was a whole buffered in the transport and the request's --max-queue place
# freed at once, so a client that sent requests and read no replies held a 64 MB reply per connection
# for the read timeout, however many connections, past --max-queue (8 connections: +525 MB).
REPLY_CHUNK = 256 << 10
# Request bodies and replies held at once, by default: as many of the largest bodies as decode and run
# at once (``HEAVY_AT_ONCE``), so a flood of large requests runs as fast as before and holds no more
# (``inflight.py``); past it a request gets 503 before its body is read.
INFLIGHT_BODIES = HEAVY_AT_ONCE
# What a 503 that asks the client to come back says besides its body: the connection closes, as the
# request's body is never read.
_BUSY_HEADERS = [(b"connection", b"close"), (b"retry-after", b"1")]
_log = logging.getLogger("graphc.serve")


def error_reply(exc: Exception) -> tuple[int, str]:
    """HTTP status and message for an exception raised while answering a request."""
    if isinstance(exc, ProtocolError):
        return exc.status, str(exc)
    if isinstance(exc, GraphcError):
        return (503 if isinstance(exc, BackendUnavailable) else 400), f"{type(exc).__name__}: {exc}"
    _log.exception("internal error while answering a request")
    return 500, f"internal error: {type(exc).__name__}: {exc}"


class Limits:
    """What one request may cost: body bytes (also after decompression), bytes of JSON, bytes of
    its reply, bytes of one tensor its values size (``tensor``) and of those live at once (``live``),
    seconds from its body to its answer (``timeout``, None: no limit), and how many requests larger
    than ``HEAVY_BYTES`` (or compressed) decode and run at once; and how many infer requests the
    server holds at once (``queue``; ``held`` counts them) and the bytes of their bodies and replies
    (``inflight``; ``max_inflight_bytes`` None: ``INFLIGHT_BODIES`` times ``max_body_bytes``)."""

    def __init__(self, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
                 max_queue: int = DEFAULT_MAX_QUEUE, max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
                 request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
                 max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 max_inflight_bytes: int | None = None):
        self.body, self.json, self.queue, self.reply = max_body_bytes, max_json_bytes, max_queue, max_reply_bytes
        if max_inflight_bytes is None:
            max_inflight_bytes = INFLIGHT_BODIES * max_body_bytes
        elif not (isinstance(max_inflight_bytes, int) and max_inflight_bytes >= max_body_bytes):
            raise ValueError(f"max_inflight_bytes must be a number of bytes of at least max_body_bytes "
                             f"({max_body_bytes}), or a body the server takes could never be read; got "
                             f"{max_inflight_bytes!r}")
        self.inflight = InflightBytes(max_inflight_bytes)
        for option, value in (("max_tensor_bytes", max_tensor_bytes), ("max_request_bytes", max_request_bytes)):
            if not (isinstance(value, int) and value > 0):
                raise ValueError(f"{option} must be a positive number of bytes, got {value!r}")
        self.tensor, self.live = max_tensor_bytes, max_request_bytes
        if request_timeout is not None and not 0 < request_timeout < math.inf:  # NaN too
            raise ValueError(f"request_timeout must be a positive, finite number of seconds or None (no limit), "
                             f"got {request_timeout}")
        self.timeout = request_timeout
        self.heavy = CapacityLimiter(HEAVY_AT_ONCE)
        self.held = 0


def forget(exc: BaseException) -> None:
    """Free what a handled exception keeps alive. Its traceback's frames hold the request's body
    and arrays, often in a reference cycle (an awaited future holds the exception whose
    traceback holds the frame that holds the future) that only the cyclic GC would collect, so
    each failed large request would stay in memory until then. Clears those frames and the
    exceptions chained to it."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            traceback.clear_frames(exc.__traceback__)  # skips the frame still running (the caller's)
            exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def _headers(scope: dict[str, Any]) -> dict[bytes, bytes]:
    """The request's headers by lower-case name; a repeated one is the comma-joined list of its
    values (RFC 9110, 5.3), so that a length given twice is refused rather than the last one read."""
    found: dict[bytes, bytes] = {}
    for key, value in scope["headers"]:
        key = key.lower()
        found[key] = value if key not in found else found[key] + b", " + value
    return found


# Digits a length header may have: more is past any size (and past what ``int`` converts, 4300).
_MAX_DIGITS = 20


def _int_header(headers: dict[bytes, bytes], name: bytes, label: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    digits = value.strip()
    if not digits.isdigit() or len(digits.lstrip(b"0")) > _MAX_DIGITS:
        raise ProtocolError(f"bad {label} header {value.decode('latin-1')!r}: expected a byte count of at "
                            f"most {_MAX_DIGITS} digits")
    return int(digits)


class Busy(ProtocolError):
    """A 503 whose reply asks the client to retry (``retry-after``) and closes the connection."""

    def __init__(self, message: str):
        super().__init__(message, 503)


async def _read_body(headers: dict[bytes, bytes], receive: Callable, limit: int, json_limit: int,
                     header_length: int | None, claim: Claim) -> tuple[bytes, Callable[[bytes], bytes] | None]:
    """The body as it came, and for a compressed one the function that inflates it (to run off
    the event loop: a bomb takes a second of CPU to reach the limit); refused with 413 as soon as
    Content-Length, the bytes read or the decompressed bytes pass ``limit``, or the JSON part (the
    whole body without the binary extension) passes ``json_limit``; with ``Busy`` when ``claim``
    cannot take its bytes (a ``Content-Length``'s before a byte of it is read, a chunk's as it comes)."""
    if header_length is not None and header_length > json_limit:
        raise ProtocolError(f"the request's JSON header of {header_length} bytes exceeds the server's limit of "
                            f"{json_limit} bytes for JSON (--max-json-bytes)", 413)
    transfer = headers.get(b"transfer-encoding", b"chunked").decode("latin-1")
    if transfer.strip().lower() != "chunked":  # the HTTP parser takes "gzip, chunked" and only unchunks it
        raise ProtocolError(f"unsupported Transfer-Encoding {transfer!r}; send the body as it is or chunked "
                            "(compressed: with Content-Encoding)", 501)
    encoding = headers.get(b"content-encoding", b"identity").decode("latin-1").strip().lower()
    if encoding not in ("gzip", "deflate", "identity"):
        raise ProtocolError(f"unsupported Content-Encoding {encoding!r}; use gzip, deflate or none", 415)
    # A plain JSON body is all JSON: the smaller limit applies to its decoded size.
    decoded_limit = limit if header_length is not None else min(limit, json_limit)
    wire_limit = limit if encoding != "identity" else decoded_limit
    declared = _int_header(headers, b"content-length", "Content-Length")
    if declared is not None and declared > wire_limit:
        raise ProtocolError(_too_large(f"request body of {declared} bytes", wire_limit, header_length), 413)
    if declared is not None and not claim.take(declared):
        raise Busy(_over_budget(claim, f"{declared} bytes"))
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ProtocolError("the client disconnected before sending the whole body")
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        more = message.get("more_body", False)
        if size > wire_limit:
            raise ProtocolError(_too_large("request body", wire_limit, header_length), 413)
        if declared is None and not claim.take(len(chunks[-1])):
            raise Busy(_over_budget(claim, f"chunked body (at {size} bytes)"))
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)  # one chunk: no copy at all
    del chunks
    if encoding == "identity":
        return body, None
    return body, functools.partial(_decompress, encoding=encoding, limit=decoded_limit, header_length=header_length)


def _over_budget(claim: Claim, what: str) -> str:
    budget = claim.budget
    return (f"the server holds {budget.held} bytes of requests and replies in flight, and this request's {what} "
            f"would pass its limit of {budget.limit} bytes (--max-inflight-bytes); retry later")


def _too_large(what: str, limit: int, header_length: int | None) -> str:
    option = "--max-body-bytes" if header_length is not None else "--max-json-bytes (or send tensors as binary data)"
    return f"{what} exceeds the server's limit of {limit} bytes ({option})"


def _decompress(body: bytes, encoding: str, limit: int, header_length: int | None) -> bytes:
    """Inflate at most ``limit + 1`` bytes: a bomb costs the limit, never its decoded size."""
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        message = f"request body is not valid {encoding} data: {exc}"
    else:
        if len(out) > limit:
            del out
            raise ProtocolError(_too_large("decompressed request body", limit, header_length), 413)
        if inflater.eof and not inflater.unused_data:
            return out
        del out
        message = (f"request body is {encoding} data cut short" if not inflater.eof else
                   f"request body has {len(inflater.unused_data)} bytes after its {encoding} stream")
    raise ProtocolError(message)


def run_request(model: ServedModel, body: bytes, header_length: int | None, max_reply_bytes: int | None,
                inflate: Callable[[bytes], bytes] | None, deadline: Deadline,
                max_tensor_bytes: int | None = None, max_request_bytes: int | None = None) -> tuple[bytes, int | None]:
    """Inflate (with ``inflate``, if given), decode, run and encode one request (a reply over
    ``max_reply_bytes`` is a ``ProtocolError``; a ``deadline`` that passes before the run ends, a 504, one
    cancelled by the client's disconnect, a 400 no one reads;
    a tensor over ``max_tensor_bytes`` or tensors live at once over ``max_request_bytes``, a 413)."""
    try:
        deadline.check("while the request waited for a worker thread")
        if inflate is not None:
            body = inflate(body)
        request = decode_request(body, header_length)
        results = model.infer(request, deadline, max_tensor_bytes, max_request_bytes)
    except RunCancelled as exc:
        why = str(exc)
    else:
        return encode_response(model.name, model.version, request, results, max_reply_bytes)
    raise deadline.exceeded(model.name, why)


async def send_reply(send: Callable, status: int, message: str, extra: list[tuple[bytes, bytes]] = ()) -> None:
    """An error reply: ``{"error": message}`` with ``status`` (and ``extra`` headers)."""
    await _send(send, status, error_body(message), b"application/json", extra)


async def _send(send: Callable, status: int, body: bytes, content_type: bytes,
                extra: list[tuple[bytes, bytes]] = ()) -> None:
    """Send a reply ``REPLY_CHUNK`` bytes at a time, then an empty last message: the server waits
    before each message while its client has not read what it was sent, so this returns once all
    but the last ``REPLY_CHUNK`` bytes and the transport's buffer (64 KiB) are out, and the
    request holds its ``--max-queue`` place until then (or until its read timeout drops the
    connection)."""
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    for start in range(0, len(body), REPLY_CHUNK):
        await send({"type": "http.response.body", "body": body[start:start + REPLY_CHUNK], "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _until_disconnect(receive: Callable, deadline: Deadline) -> None:
    """Stop ``deadline``'s run when the client disconnects: once the body is in, ``receive`` waits
    for nothing else. A client gone mid-run held its worker thread (and on numpy the model, so
    every later request to it) until the run ended or --request-timeout passed."""
    while (await receive())["type"] != "http.disconnect":
        pass
    deadline.disconnect()


async def handle_infer(lookup: Callable[[str, str | None], ServedModel], limits: Limits, match: re.Match,
                       scope: dict[str, Any], receive: Callable, send: Callable) -> None:
    """Answer one infer request, or refuse it with 503 and ``connection: close`` without reading its
    body when ``limits.queue`` requests are already held (or its body would pass ``limits.inflight``)."""
    if limits.held >= limits.queue:
        await send_reply(send, 503, f"the server holds its limit of {limits.queue} infer requests at once "
                                    "(--max-queue); retry later", _BUSY_HEADERS)
        return
    limits.held += 1
    claim = limits.inflight.claim()
    try:
        await _answer(lookup, limits, match, scope, receive, send, claim)
    finally:
        limits.held -= 1
        claim.release()


async def _answer(lookup: Callable[[str, str | None], ServedModel], limits: Limits, match: re.Match,
                  scope: dict[str, Any], receive: Callable, send: Callable, claim: Claim) -> None:
    """Answer one infer request; every failure becomes ``{"error": ...}`` with a 4xx/5xx, and
    frees what the request allocated before the reply goes out. ``claim`` holds its body's bytes,
    then its reply's."""
    try:
        model = lookup(match["name"], match["version"])
        headers = _headers(scope)
        header_length = _int_header(headers, b"inference-header-content-length", "Inference-Header-Content-Length")
        body, inflate = await _read_body(headers, receive, limits.body, limits.json, header_length, claim)
        loop = asyncio.get_running_loop()
        deadline = Deadline(limits.timeout)
        timer = None if limits.timeout is None else loop.call_later(limits.timeout, deadline.cancel)
        watcher = loop.create_task(_until_disconnect(receive, deadline))
        try:
            if len(body) > HEAVY_BYTES or inflate is not None:  # compressed: any size once inflated
                payload, json_length = await to_thread.run_sync(run_request, model, body, header_length, limits.reply,
                                                                inflate, deadline, limits.tensor, limits.live,
                                                                limiter=limits.heavy)
            else:
                payload, json_length = await loop.run_in_executor(None, run_request, model, body, header_length,
                                                                  limits.reply, None, deadline, limits.tensor,
                                                                  limits.live)
        except asyncio.CancelledError:  # the server's shutdown stopped waiting for this request
            deadline.cancel()  # else its thread runs on to the model's end, and the process cannot exit until then
            raise ProtocolError(f"the server is shutting down and stopped the run of model {model.name!r} before "
                                "it answered (its time for requests in flight ran out); retry on a server that is up",
                                503) from None
        finally:
            watcher.cancel()
            if timer is not None:
                timer.cancel()
        del body
        claim.release()  # the body and the arrays decoded from it are gone; the reply is held until it is read
        claim.hold(len(payload))
    except Exception as exc:  # noqa: BLE001 - every failure is answered, never raised into uvicorn
        status, message = error_reply(exc)
        extra = _BUSY_HEADERS if isinstance(exc, Busy) else ()
        forget(exc)
        body = None  # the request's bytes go now, not when this coroutine ends
        claim.release()
        await send_reply(send, status, message, extra)
        return
    if json_length is None:
        await _send(send, 200, payload, b"application/json")
    else:
        await _send(send, 200, payload, b"application/octet-stream",
                    [(b"inference-header-content-length", str(json_length).encode())])
