"""The FastAPI app speaking KServe v2 / the Open Inference Protocol over REST.

Routes: ``GET /v2/health/live``, ``/v2/health/ready``, ``GET /v2``,
``GET /v2/models/{name}[/versions/{v}]``, ``.../ready``, ``POST .../infer`` and Triton's
``POST /v2/repository/index``. Every error is a 4xx/5xx with ``{"error": "..."}``.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

from anyio import to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from graphc.errors import BackendUnavailable, GraphcError
from graphc.kserve.protocol import ProtocolError, decode_request, encode_response
from graphc.kserve.repository import ServedModel

DEFAULT_MAX_BODY_BYTES = 256 << 20
HEADER_LENGTH = "inference-header-content-length"
# Requests that a model answers faster than this, with bodies up to INLINE_BYTES, run on the
# event loop: the hop to a worker thread would cost more than the work (measured with
# scripts/bench_serve.py). Slower or larger ones go to the thread pool so the loop stays free.
INLINE_SECONDS = 0.002
INLINE_BYTES = 1 << 20


class ModelRegistry:
    """Look-ups by name and optional version, failing with a 404 that lists what exists."""

    def __init__(self, models: dict[str, ServedModel]):
        self.models = models

    def get(self, name: str, version: str | None = None) -> ServedModel:
        model = self.models.get(name)
        if model is None:
            raise ProtocolError(f"unknown model {name!r}; this server has {', '.join(sorted(self.models)) or 'none'}", 404)
        if version not in (None, "", model.version):
            raise ProtocolError(f"model {name!r} has no version {version!r}; it serves version {model.version}", 404)
        return model


async def _read_body(request: Request, limit: int) -> bytes | bytearray:
    """The body, refused with 413 as soon as Content-Length or the bytes read pass ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ProtocolError(f"bad Content-Length header {declared!r}")
        if int(declared) > limit:
            raise ProtocolError(f"request body of {declared} bytes exceeds the server's limit of {limit} bytes", 413)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ProtocolError(f"request body exceeds the server's limit of {limit} bytes", 413)
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding in ("gzip", "deflate"):
        return _decompress(body, encoding, limit)
    if encoding != "identity":
        raise ProtocolError(f"unsupported Content-Encoding {encoding!r}; use gzip, deflate or none", 415)
    return body


def _decompress(body: bytearray, encoding: str, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ProtocolError(f"request body is not valid {encoding} data: {exc}") from None
    if len(out) > limit:
        raise ProtocolError(f"decompressed request body exceeds the server's limit of {limit} bytes", 413)
    return out


def _header_length(request: Request) -> int | None:
    value = request.headers.get(HEADER_LENGTH)
    if value is None:
        return None
    if not value.strip().isdigit():
        raise ProtocolError(f"bad Inference-Header-Content-Length header {value!r}")
    return int(value)


def _infer(model: ServedModel, body: bytes | bytearray, header_length: int | None) -> Response:
    """Decode, run and encode one request; remembers how long the model took."""
    start = time.perf_counter()
    request = decode_request(body, header_length)
    results = model.infer(request)
    payload, json_length = encode_response(model.name, model.version, request, results)
    model.recent_seconds = 0.8 * model.recent_seconds + 0.2 * (time.perf_counter() - start)
    if json_length is None:
        return Response(payload, media_type="application/json")
    return Response(payload, media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(json_length)})


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProtocolError)
    async def _protocol(_: Request, exc: ProtocolError) -> JSONResponse:
        return _error(exc.status, str(exc))

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, f"invalid request: {exc.errors()}")

    @app.exception_handler(GraphcError)
    async def _graphc(_: Request, exc: GraphcError) -> JSONResponse:
        return _error(503 if isinstance(exc, BackendUnavailable) else 400, f"{type(exc).__name__}: {exc}")

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")


def create_app(models: dict[str, ServedModel], max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The KServe v2 app for already-loaded models (see ``graphc.serving.create_app`` to load)."""
    from graphc import __version__

    registry = ModelRegistry(models)
    app = FastAPI(title="graphc KServe v2 server", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.registry = registry
    _install_error_handlers(app)

    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        return {"name": "graphc", "version": __version__, "extensions": ["binary_tensor_data"]}

    @app.post("/v2/repository/index")
    async def repository_index() -> list[dict[str, str]]:
        return [{"name": m.name, "version": m.version, "state": "READY"} for m in models.values()]

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None) -> dict[str, Any]:
        return registry.get(name, version).metadata

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None) -> dict[str, Any]:
        return {"name": registry.get(name, version).name, "ready": True}

    async def infer(request: Request) -> Response:
        # A plain Starlette route: the hot path skips FastAPI's per-request dependency solving.
        model = registry.get(request.path_params["name"], request.path_params.get("version"))
        header_length = _header_length(request)
        body = await _read_body(request, max_body_bytes)
        if model.recent_seconds < INLINE_SECONDS and len(body) <= INLINE_BYTES:
            return _infer(model, body, header_length)
        return await to_thread.run_sync(_infer, model, body, header_length)

    for path in ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"):
        app.router.add_route(path, infer, methods=["POST"])
    app.router.routes[:] = sorted(app.router.routes, key=lambda r: not getattr(r, "path", "").endswith("/infer"))

    return app
