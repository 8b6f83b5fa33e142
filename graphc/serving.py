"""`gc.serve`: a KServe v2 (Open Inference Protocol) HTTP server for ONNX models.

    gc.serve("model.onnx")                  # model "model" at http://127.0.0.1:8000
    gc.serve("repo/", port=9000)            # every model of a Triton repository

The stock ``tritonclient.http`` client works against it, binary tensors included. The app
itself lives in ``graphc.kserve``; ``create_app`` builds it without starting a server.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from graphc.kserve.app import DEFAULT_MAX_BODY_BYTES
from graphc.kserve.repository import load_models

__all__ = ["DEFAULT_MAX_BODY_BYTES", "create_app", "serve"]


def create_app(model_or_path_or_repo: Any, backend: str = "auto", name: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, **session_options: Any):
    """The FastAPI app serving ``model_or_path_or_repo`` (a ``gc.Model``, an ``.onnx`` file or a
    Triton repository folder); sessions are created here, once, with ``session_options``
    (``gc.Session``'s, e.g. ``threads``)."""
    from graphc.kserve.app import create_app as _create

    models = load_models(model_or_path_or_repo, name=name, backend=backend, **session_options)
    return _create(models, max_body_bytes)


def _config(app: Any, host: str, port: int, log_level: str, access_log: bool):
    import uvicorn

    # uvloop (and asyncio) set TCP_NODELAY on every accepted connection, so replies are not held
    # back by Nagle's algorithm (tests/test_serve.py checks); connections stay alive between
    # requests. No proxy-header rewriting: the server is not meant to sit behind a proxy it trusts.
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                          timeout_graceful_shutdown=30, server_header=False, proxy_headers=False)


def serve(model_or_path_or_repo: Any, host: str = "127.0.0.1", port: int = 8000, backend: str = "auto",
          name: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
          log_level: str = "info", access_log: bool = False, **session_options: Any) -> None:
    """Serve until SIGINT or SIGTERM, then finish in-flight requests and return normally.

    Args:
        model_or_path_or_repo: a ``gc.Model``, an ``.onnx`` file (served under its stem unless
            ``name``) or a Triton repository folder (every model under its folder name).
        host: the address to bind; loopback unless you mean to expose the server.
        backend: the ``gc.Session`` backend every model runs on.
        max_body_bytes: larger request bodies get 413 without being read in full.
        **session_options: given to every ``gc.Session`` (e.g. ``threads=1``).
    """
    import uvicorn

    app = create_app(model_or_path_or_repo, backend=backend, name=name, max_body_bytes=max_body_bytes,
                     **session_options)
    server = uvicorn.Server(_config(app, host, port, log_level, access_log))
    if threading.current_thread() is not threading.main_thread():
        server.run()
        return
    # uvicorn restores the handlers it found and re-raises the signal that stopped it; handlers
    # that ignore it let a signalled shutdown return (exit status 0) once requests are done.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
