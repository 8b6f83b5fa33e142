"""The FastAPI app speaking KServe v2 / the Open Inference Protocol over REST.

Routes: ``GET /v2/health/live``, ``/v2/health/ready``, ``GET /v2``,
``GET /v2/models/{name}[/versions/{v}]``, ``.../ready``, ``POST .../infer`` and Triton's
``POST /v2/repository/index``. Every error is a 4xx/5xx with ``{"error": "..."}``. Infer
requests take a fast path (``graphc.kserve.infer``) in front of FastAPI's router.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from graphc.errors import GraphcError
from graphc.kserve.infer import INFER_PATH, error_reply, handle_infer
from graphc.kserve.protocol import ProtocolError
from graphc.kserve.repository import ServedModel

DEFAULT_MAX_BODY_BYTES = 256 << 20


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


class KServeApp(FastAPI):
    """A FastAPI app whose ``POST .../infer`` requests skip the router (see ``infer.py``)."""

    def __init__(self, registry: ModelRegistry, max_body_bytes: int, **kwargs: Any):
        super().__init__(**kwargs)
        self.registry, self.max_body_bytes = registry, max_body_bytes

        # The same handler as routes too (an ASGI callable, not a request function), so the
        # router answers other methods on these paths with 405, and a mounted app still infers.
        for path in ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"):
            self.router.add_route(path, _AsgiEndpoint(self._infer), methods=["POST"])

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and await self._infer(scope, receive, send):
            return
        await super().__call__(scope, receive, send)

    async def _infer(self, scope: Any, receive: Any, send: Any) -> bool:
        path, root = scope["path"], scope.get("root_path", "")
        match = INFER_PATH.fullmatch(path[len(root):] if root and path.startswith(root) else path)
        if match:
            await handle_infer(self.registry.get, self.max_body_bytes, match, scope, receive, send)
        return match is not None


class _AsgiEndpoint:
    def __init__(self, handler: Any):
        self.handler = handler

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.handler(scope, receive, send)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, f"invalid request: {exc.errors()}")

    # Handlers for these two run inside the app; the one for Exception (a 500) runs in
    # Starlette's outermost middleware, which re-raises after replying.
    for kind in (ProtocolError, GraphcError, Exception):
        app.add_exception_handler(kind, lambda _, exc: _error(*error_reply(exc)))


def create_app(models: dict[str, ServedModel], max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> KServeApp:
    """The KServe v2 app for already-loaded models (see ``graphc.serving.create_app`` to load)."""
    from graphc import __version__

    registry = ModelRegistry(models)
    app = KServeApp(registry, max_body_bytes, title="graphc KServe v2 server", version=__version__,
                    docs_url=None, redoc_url=None, openapi_url=None)
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

    return app
