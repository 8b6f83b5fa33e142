"""The infer endpoint as a plain ASGI handler: the hot path of the server.

``POST /v2/models/{name}[/versions/{v}]/infer`` skips FastAPI's routing, dependency solving and
response classes (a few hundred microseconds of Python per request, measured with
scripts/bench_serve.py): headers come straight from the ASGI scope, the body is read with a
size limit, and the reply goes out as two ASGI messages with ``Content-Length`` set.
"""

from __future__ import annotations

import logging
import re
import time
import zlib
from typing import Any, Callable

from anyio import to_thread

from graphc.errors import BackendUnavailable, GraphcError
from graphc.kserve.protocol import ProtocolError, decode_request, encode_response, error_body
from graphc.kserve.repository import ServedModel

INFER_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")
# Requests that a model answers faster than this, with bodies up to INLINE_BYTES, run on the
# event loop: the hop to a worker thread would cost more than the work. Slower or larger ones
# go to the thread pool so the loop stays free for other connections.
INLINE_SECONDS = 0.0005
INLINE_BYTES = 1 << 20
_log = logging.getLogger("graphc.serve")


def error_reply(exc: Exception) -> tuple[int, str]:
    """HTTP status and message for an exception raised while answering a request."""
    if isinstance(exc, ProtocolError):
        return exc.status, str(exc)
    if isinstance(exc, GraphcError):
        return (503 if isinstance(exc, BackendUnavailable) else 400), f"{type(exc).__name__}: {exc}"
    _log.exception("internal error while answering a request")
    return 500, f"internal error: {type(exc).__name__}: {exc}"


def _headers(scope: dict[str, Any]) -> dict[bytes, bytes]:
    return {key.lower(): value for key, value in scope["headers"]}


def _int_header(headers: dict[bytes, bytes], name: bytes, label: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    if not value.strip().isdigit():
        raise ProtocolError(f"bad {label} header {value.decode('latin-1')!r}")
    return int(value)


async def _read_body(headers: dict[bytes, bytes], receive: Callable, limit: int) -> bytes:
    """The body, refused with 413 as soon as Content-Length or the bytes read pass ``limit``."""
    declared = _int_header(headers, b"content-length", "Content-Length")
    if declared is not None and declared > limit:
        raise ProtocolError(f"request body of {declared} bytes exceeds the server's limit of {limit} bytes", 413)
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ProtocolError("the client disconnected before sending the whole body")
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        more = message.get("more_body", False)
        if size > limit:
            raise ProtocolError(f"request body exceeds the server's limit of {limit} bytes", 413)
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)  # one chunk: no copy at all
    encoding = headers.get(b"content-encoding", b"identity").decode("latin-1").strip().lower()
    if encoding in ("gzip", "deflate"):
        return _decompress(body, encoding, limit)
    if encoding != "identity":
        raise ProtocolError(f"unsupported Content-Encoding {encoding!r}; use gzip, deflate or none", 415)
    return body


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ProtocolError(f"request body is not valid {encoding} data: {exc}") from None
    if len(out) > limit:
        raise ProtocolError(f"decompressed request body exceeds the server's limit of {limit} bytes", 413)
    return out


def run_request(model: ServedModel, body: bytes, header_length: int | None) -> tuple[bytes, int | None]:
    """Decode, run and encode one request; remembers how long the model took."""
    start = time.perf_counter()
    request = decode_request(body, header_length)
    results = model.infer(request)
    reply = encode_response(model.name, model.version, request, results)
    model.recent_seconds = 0.8 * model.recent_seconds + 0.2 * (time.perf_counter() - start)
    return reply


async def _send(send: Callable, status: int, body: bytes, content_type: bytes,
                extra: list[tuple[bytes, bytes]] = ()) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def handle_infer(lookup: Callable[[str, str | None], ServedModel], limit: int, match: re.Match,
                       scope: dict[str, Any], receive: Callable, send: Callable) -> None:
    """Answer one infer request; every failure becomes ``{"error": ...}`` with a 4xx/5xx."""
    try:
        model = lookup(match["name"], match["version"])
        headers = _headers(scope)
        header_length = _int_header(headers, b"inference-header-content-length", "Inference-Header-Content-Length")
        body = await _read_body(headers, receive, limit)
        if model.recent_seconds < INLINE_SECONDS and len(body) <= INLINE_BYTES:
            payload, json_length = run_request(model, body, header_length)
        else:
            payload, json_length = await to_thread.run_sync(run_request, model, body, header_length)
    except Exception as exc:  # noqa: BLE001 - every failure is answered, never raised into uvicorn
        status, message = error_reply(exc)
        await _send(send, status, error_body(message), b"application/json")
        return
    if json_length is None:
        await _send(send, 200, payload, b"application/json")
    else:
        await _send(send, 200, payload, b"application/octet-stream",
                    [(b"inference-header-content-length", str(json_length).encode())])
