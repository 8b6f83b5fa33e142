"""`gc.serve`: a KServe v2 (Open Inference Protocol) HTTP server for ONNX models.

    gc.serve("model.onnx")                  # model "model" at http://127.0.0.1:8000
    gc.serve("repo/", port=9000)            # every model of a Triton repository

The stock ``tritonclient.http`` client works against it, binary tensors included. The app
itself lives in ``graphc.serving.kserve``; ``create_app`` loads the models into it without starting a
server, and ``serve_app`` serves such an app (``serve`` is the two).
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable

from graphc.serving.kserve.app import (DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JSON_BYTES, DEFAULT_MAX_QUEUE,
                                       DEFAULT_MAX_REPLY_BYTES, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TENSOR_BYTES,
                                       DEFAULT_REQUEST_TIMEOUT)
from graphc.serving.kserve.repository import load_models
from graphc.serving.kserve.server import DEFAULT_READ_TIMEOUT

__all__ = ["DEFAULT_MAX_BODY_BYTES", "DEFAULT_MAX_JSON_BYTES", "DEFAULT_MAX_QUEUE", "DEFAULT_MAX_REPLY_BYTES",
           "DEFAULT_MAX_REQUEST_BYTES", "DEFAULT_MAX_TENSOR_BYTES", "DEFAULT_READ_TIMEOUT",
           "DEFAULT_REQUEST_TIMEOUT", "create_app", "serve", "serve_app"]


def create_app(model_or_path_or_repo: Any, backend: str = "auto", name: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
               max_queue: int = DEFAULT_MAX_QUEUE, max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
               request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
               max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
               allow_unchecked: bool = False, allow_uncalibrated: bool = False, max_inflight_bytes: int | None = None,
               **session_options: Any):
    """The FastAPI app serving ``model_or_path_or_repo`` (a ``gc.Model``, an ``.onnx`` file or a
    Triton repository folder); sessions are created here, once, with ``session_options``
    (``gc.Session``'s, e.g. ``threads``). The limits and ``allow_uncalibrated`` are ``serve``'s."""
    from graphc.serving.kserve.app import create_app as _create

    models = load_models(model_or_path_or_repo, name=name, backend=backend, allow_uncalibrated=allow_uncalibrated,
                         **session_options)
    return _create(models, max_body_bytes, max_json_bytes, max_queue, max_reply_bytes, request_timeout,
                   max_tensor_bytes, max_request_bytes, allow_unchecked, max_inflight_bytes)


def serve(model_or_path_or_repo: Any, host: str = "127.0.0.1", port: int = 8000, backend: str = "auto",
          name: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
          max_json_bytes: int = DEFAULT_MAX_JSON_BYTES, read_timeout: float = DEFAULT_READ_TIMEOUT,
          log_level: str = "warning", access_log: bool = False,
          on_ready: Callable[..., None] | None = None, max_queue: int = DEFAULT_MAX_QUEUE,
          max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES, request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
          max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
          allow_unchecked: bool = False, allow_uncalibrated: bool = False, max_inflight_bytes: int | None = None,
          **session_options: Any) -> None:
    """Serve until SIGINT or SIGTERM, then finish in-flight requests and return normally (a
    request whose body stops arriving, or a reply its client stops reading, for ``SHUTDOWN_IDLE``
    seconds is dropped; a run still going after ``SHUTDOWN_GRACE``, 30 s, is stopped and its
    request gets a 503). Near the process's descriptor limit each new connection has one closed:
    one whose headers have been arriving for ``HEAD_TIMEOUT`` (1 s), else the longest-idle one
    (``graphc.serving.kserve.connections``).

    Models load and the port is bound before anything else, so a bad model or a port in use
    raises (``gc.ModelLoadError``, ``graphc.errors.ServeError``) before the server starts.

    Args:
        model_or_path_or_repo: a ``gc.Model``, an ``.onnx`` file (served under its stem unless
            ``name``) or a Triton repository folder (every model under its folder name).
        host: the address to bind; loopback unless you mean to expose the server.
        backend: the ``gc.Session`` backend every model runs on.
        max_body_bytes: larger request bodies (also once decompressed) get 413 without being
            read in full.
        max_json_bytes: the largest JSON part of a request (JSON tensor data costs far more
            memory than its bytes; large tensors belong in the binary section).
        read_timeout: seconds a connection has to send a whole request (or, once connected, its
            first byte; or to read a reply it stopped reading) before it is closed.
        on_ready: called once the server accepts connections, with the ``(host, port)`` it listens
            on (for ``port=0``, the port the system chose) when it takes an argument.
        max_queue: the most infer requests held at once (being received, waiting, running or
            having their reply read: an unread reply keeps its place until ``read_timeout``);
            past it a request gets 503 from its headers alone, and its connection closes.
        max_reply_bytes: the largest reply body (an output's size may depend on the data); a
            request whose reply would be larger gets 400 naming the output, the reply unbuilt.
        request_timeout: seconds from a request's body being in to its answer (None: no limit);
            past them the model's run is stopped (numpy: before its next node; onnxruntime:
            ``RunOptions.terminate``) and the request gets 504 naming the model and the limit.
        max_tensor_bytes: the largest tensor a request's values may make a model allocate (a
            ConstantOfShape of a fed shape, a Range to a fed limit, and what shape inference
            finds downstream); larger gets 413 naming the node, the shape and the bytes, before
            it is allocated (``graphc.backends.value_sized``). On the ort backends a model whose
            value-sized ops are in Loop/If/Scan bodies or local functions cannot be checked before
            it runs, and is refused at load (``ModelLoadError``) unless ``allow_unchecked``.
        max_request_bytes: the most bytes such a model's main-graph tensors of known shape may
            hold at once for a request (a tensor from its producer to its last reader); more gets
            413 naming the node where they peak.
        allow_unchecked: serve models ``max_tensor_bytes`` cannot check, unbounded.
        allow_uncalibrated: serve a capture whose fake quantizations' observers never saw data (its
            model metadata records them: ``graphc.model.quantizers``; ``gc.optimize`` keeps the record),
            with the scales they were built with (1.0 unless set by hand); refused at load
            (``ModelLoadError`` naming the model, version and quantizations) by default.
        max_inflight_bytes: the most bytes of infer requests' bodies and replies the server holds
            at once (None: 4 times ``max_body_bytes``; at least ``max_body_bytes``). A request is
            counted from its headers (all of its ``Content-Length``; a chunked body as it arrives)
            until its reply is read or it fails; one that would pass the limit gets a 503 with
            ``retry-after: 1`` and ``connection: close``, its body unread.
        **session_options: given to every ``gc.Session`` (e.g. ``threads=1``).
    """
    serve_app(create_app(model_or_path_or_repo, backend=backend, name=name, max_body_bytes=max_body_bytes,
                         max_json_bytes=max_json_bytes, max_queue=max_queue, max_reply_bytes=max_reply_bytes,
                         request_timeout=request_timeout, max_tensor_bytes=max_tensor_bytes,
                         max_request_bytes=max_request_bytes, allow_unchecked=allow_unchecked,
                         allow_uncalibrated=allow_uncalibrated, max_inflight_bytes=max_inflight_bytes,
                         **session_options),
              host, port, read_timeout=read_timeout, log_level=log_level, access_log=access_log, on_ready=on_ready)


def serve_app(app: Any, host: str = "127.0.0.1", port: int = 8000, read_timeout: float = DEFAULT_READ_TIMEOUT,
              log_level: str = "warning", access_log: bool = False,
              on_ready: Callable[..., None] | None = None) -> None:
    """Serve ``app`` (``create_app``'s, its models loaded) as ``serve`` does, until SIGINT or
    SIGTERM; the port is bound first (in use: ``graphc.errors.ServeError``). The arguments are
    ``serve``'s."""
    from graphc.serving.kserve import server as kserver
    from graphc.serving.kserve.connections import raise_descriptor_limit

    # Every held connection is a descriptor: allow as many as the system does.
    raise_descriptor_limit()
    sock = kserver.listen(host, port)
    server = kserver.Server(kserver.config(app, read_timeout=read_timeout, log_level=log_level,
                                           access_log=access_log), on_ready)
    # uvicorn restores the handlers it found and re-raises the signal that stopped it; handlers
    # that ignore it let a signalled shutdown return (exit status 0) once requests are done.
    # (Signals can only be handled on the main thread.)
    previous = {} if threading.current_thread() is not threading.main_thread() else \
        {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
