"""The FastAPI app speaking KServe v2 / the Open Inference Protocol over REST.

Routes: ``GET /v2/health/live``, ``/v2/health/ready``, ``GET /v2``,
``GET /v2/models/{name}[/versions/{v}]``, ``.../ready``, ``POST .../infer``, Triton's
``GET .../config`` and ``POST /v2/repository/index`` and ``GET /openapi.json``, which describes them all (the infer
operation from ``graphc.serving.kserve.schemas``); ``HEAD`` wherever ``GET``. Every error, an unexpected one included, is a
4xx/5xx with ``{"error": "..."}`` (a 405 with ``Allow``). Infer requests take a fast path (``graphc.serving.kserve.infer``) in
front of FastAPI's router.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from graphc.errors import GraphcError, ModelLoadError, first_few
from graphc.serving.kserve import schemas
from graphc.serving.kserve.extensions import SUPPORTED, route_extension, unsupported_message
from graphc.serving.kserve.infer import (DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JSON_BYTES, DEFAULT_MAX_QUEUE,
                                         DEFAULT_MAX_REPLY_BYTES, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TENSOR_BYTES,
                                         DEFAULT_REQUEST_TIMEOUT, INFER_PATH, Limits, error_reply, forget, handle_infer,
                                         send_reply)
from graphc.serving.kserve.protocol import ProtocolError, brief
from graphc.serving.kserve.repository import ServedModel

__all__ = ["DEFAULT_MAX_BODY_BYTES", "DEFAULT_MAX_JSON_BYTES", "DEFAULT_MAX_QUEUE", "DEFAULT_MAX_REPLY_BYTES",
           "DEFAULT_MAX_REQUEST_BYTES", "DEFAULT_MAX_TENSOR_BYTES", "DEFAULT_REQUEST_TIMEOUT", "KServeApp",
           "create_app", "versions_phrase"]


def versions_phrase(numbers: list[str]) -> str:
    """``version 1`` or ``versions 2, 3``: served versions as the 404s and ``graphc serve``'s lines say them."""
    return f"version{'s' if len(numbers) > 1 else ''} {', '.join(numbers)}"


class ModelRegistry:
    """Look-ups by name and optional version (none: the highest served), failing with a 404
    that lists what exists."""

    def __init__(self, models: dict[str, dict[str, ServedModel]]):
        self.models = models

    def get(self, name: str, version: str | None = None) -> ServedModel:
        versions = self.models.get(name)
        if versions is None:
            raise ProtocolError(f"unknown model {name!r}; this server has {', '.join(sorted(self.models)) or 'none'}", 404)
        latest = versions[next(reversed(versions))]
        if not version:
            return latest
        model = versions.get(version)
        if model is None:
            served = versions_phrase(list(versions))
            rule = latest.left_out.get(version)
            if rule is not None:
                raise ProtocolError(f"model {name!r} version {version!r} is in the repository but not served: "
                                    f"{rule} serves {served}", 404)
            raise ProtocolError(f"model {name!r} has no version {version!r}; it serves {served}", 404)
        return model


class KServeApp(FastAPI):
    """A FastAPI app whose ``POST .../infer`` requests skip the router (see ``infer.py``)."""

    def __init__(self, registry: ModelRegistry, limits: Limits, **kwargs: Any):
        super().__init__(**kwargs)
        self.registry, self.limits = registry, limits
        # a path with a trailing slash is a 404: Starlette's 307 to the path without it took its
        # Location from the Host header, which the client names (a forged Host sent clients elsewhere)
        self.router.redirect_slashes = False

        # The same handler as routes too (an ASGI callable, not a request function), so the
        # router answers other methods on these paths with 405, and a mounted app still infers.
        for path in ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"):
            self.router.add_route(path, _AsgiEndpoint(self._infer), methods=["POST"])

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if (b"expect", b"100-continue") in ((k, v.lower()) for k, v in scope["headers"]):
            receive, send = _closing_unless_continued(receive, send)
        if scope["method"] == "POST" and await self._infer(scope, receive, send):
            return
        if scope["method"] == "HEAD":  # answered as GET (RFC 9110, 9.1); uvicorn sends no body for HEAD
            scope = {**scope, "method": "GET"}
        started = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await super().__call__(scope, receive, tracked)
        except Exception as exc:  # noqa: BLE001 - Starlette re-raises after its 500 reply; uvicorn never sees it
            if not started:
                await send_reply(send, *error_reply(exc))
            forget(exc)

    async def _infer(self, scope: Any, receive: Any, send: Any) -> bool:
        path, root = scope["path"], scope.get("root_path", "")
        match = INFER_PATH.fullmatch(path[len(root):] if root and path.startswith(root) else path)
        if match:
            await handle_infer(self.registry.get, self.limits, match, scope, receive, send)
        return match is not None


    def openapi(self) -> dict[str, Any]:
        """FastAPI's description of the routes, plus the infer operation (a plain ASGI route)."""
        if self.openapi_schema is None:
            schema = super().openapi()
            _describe_infer(schema)
            self.openapi_schema = schema
        return self.openapi_schema


def _component(schema: dict[str, Any], model: type, mode: str = "validation") -> dict[str, str]:
    """Put ``model``'s JSON schema (and its definitions) in the components; returns a $ref."""
    body = model.model_json_schema(ref_template="#/components/schemas/{model}", mode=mode)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(body.pop("$defs", {}))
    components[model.__name__] = body
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _describe_infer(schema: dict[str, Any]) -> None:
    request, response = _component(schema, schemas.InferRequest), _component(schema, schemas.InferResponse)
    error = {"content": {"application/json": {"schema": _component(schema, schemas.ErrorResponse)}}}
    binary = {"schema": {"type": "string", "format": "binary"}}
    header = {"name": "Inference-Header-Content-Length", "in": "header", "required": False,
              "schema": {"type": "integer", "minimum": 0},
              "description": "Binary tensor extension: the JSON header's length; raw tensors follow it."}
    for path, versioned in (("/v2/models/{name}/infer", False), ("/v2/models/{name}/versions/{version}/infer", True)):
        params = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]
        if versioned:
            params.append({"name": "version", "in": "path", "required": True, "schema": {"type": "string"}})
        schema["paths"].setdefault(path, {})["post"] = {
            "summary": "Run the model", "operationId": "infer_versioned" if versioned else "infer",
            "parameters": [*params, header],
            "requestBody": {"required": True,
                            "content": {"application/json": {"schema": request}, "application/octet-stream": binary}},
            "responses": {"200": {"description": "The outputs (JSON, or JSON header + raw tensors)",
                                  "content": {"application/json": {"schema": response},
                                              "application/octet-stream": binary}},
                          **{code: {"description": why, **error} for code, why in (
                              ("400", "Malformed request"), ("404", "Unknown model or version"),
                              ("413", "Body or JSON larger than the server's limit, or a tensor the request's "
                                      "values size over --max-tensor-bytes"),
                              ("415", "Unsupported Content-Encoding"), ("500", "Internal error"),
                              ("501", "Unsupported Transfer-Encoding"),
                              ("503", "Backend unavailable, the server holds --max-queue requests or "
                                      "--max-inflight-bytes of bodies and replies, or it is shutting down"),
                              ("504", "The model did not answer within --request-timeout"))}},
        }


def _closing_unless_continued(receive: Any, send: Any) -> tuple[Any, Any]:
    """``receive`` and ``send`` for a request that waits for ``100 Continue`` (the server sends it
    when the app first reads the body): answered without it, the client never sends the body, so
    the reply says ``connection: close``; the connection would otherwise wait for that body, and
    read the client's next request as it."""
    continued = False

    async def reading() -> Any:
        nonlocal continued
        continued = True
        return await receive()

    async def sending(message: dict[str, Any]) -> None:
        headers = message.get("headers", ())
        if message["type"] == "http.response.start" and not continued and (b"connection", b"close") not in headers:
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return reading, sending


class _AsgiEndpoint:
    def __init__(self, handler: Any):
        self.handler = handler

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.handler(scope, receive, send)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": brief(message)}, status_code=status)


def _sent_path(scope: dict[str, Any]) -> str:
    """The request target's path as the client sent it: ``*`` for ``OPTIONS *`` (not Starlette's
    ``/*``), escapes kept (``a%2Fb``, not the ``a/b`` the router matched)."""
    raw = scope.get("raw_path")  # optional in ASGI
    return scope["path"] if raw is None else raw.decode("latin-1")


def _no_endpoint(method: str, path: str) -> str:
    """The 404 for a path no route takes, with the likely fix: the path without its trailing
    slash, the Triton extension the path belongs to, or, off ``/v2`` (a browser's ``GET /``), where the
    routes are."""
    extension = route_extension(path)
    if extension is not None:
        return f"no endpoint {method} {path}: {unsupported_message(extension)}"
    if path.startswith("/v2/") and path.endswith("/"):
        return f"no endpoint {method} {path} (a trailing slash is not redirected: {path.rstrip('/')})"
    if path == "/v2" or path.startswith("/v2/"):
        return f"no endpoint {method} {path}"
    return f"no endpoint {method} {path}: the server's routes are under /v2 (GET /openapi.json lists them)"


_ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": schemas.ErrorResponse}}


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        message, allow, target = str(exc.detail), None, _sent_path(request.scope)
        if exc.status_code == 404 and message == "Not Found":  # the router's: no route for the path
            message = _no_endpoint(request.method, target)
        if exc.headers and "Allow" in exc.headers:  # a 405 must say what is allowed (RFC 9110, 15.5.6)
            methods = set(exc.headers["Allow"].split(", "))
            allow = ", ".join(sorted(methods | ({"HEAD"} if "GET" in methods else set())))
            message = f"method {request.method} is not allowed on {target}; it takes {allow}"
        reply = _error(exc.status_code, message)
        if allow is not None:
            reply.headers["Allow"] = allow
        return reply

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, f"invalid request: {exc.errors()}")

    # Handlers for these two run inside the app; the one for Exception (a 500) runs in
    # Starlette's outermost middleware, which re-raises after replying (KServeApp swallows it).
    for kind in (ProtocolError, GraphcError, Exception):
        app.add_exception_handler(kind, lambda _, exc: _error(*error_reply(exc)))


def create_app(models: dict[str, dict[str, ServedModel]], max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               max_json_bytes: int = DEFAULT_MAX_JSON_BYTES, max_queue: int = DEFAULT_MAX_QUEUE,
               max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
               request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
               max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
               max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, allow_unchecked: bool = False,
               max_inflight_bytes: int | None = None) -> KServeApp:
    """The KServe v2 app for already-loaded models, name -> version -> model as
    ``repository.load_models`` returns them (see ``graphc.serving.serve.create_app`` to load).
    ``ModelLoadError`` for a model whose value-sized tensors its backend cannot bound before it
    runs them (``gc.Session.unbounded_nodes``), unless ``allow_unchecked``."""
    from graphc import __version__

    if not allow_unchecked:
        _require_bounded(models)
    registry = ModelRegistry(models)
    app = KServeApp(registry, Limits(max_body_bytes, max_json_bytes, max_queue, max_reply_bytes, request_timeout,
                                     max_tensor_bytes, max_request_bytes, max_inflight_bytes),
                    title="graphc KServe v2 server", version=__version__, docs_url=None, redoc_url=None)
    _install_error_handlers(app)

    @app.get("/v2/health/live", response_model=schemas.Live)
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready", response_model=schemas.Ready)
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.get("/v2", response_model=schemas.ServerMetadata)
    async def server_metadata() -> dict[str, Any]:
        return {"name": "graphc", "version": __version__, "extensions": list(SUPPORTED)}

    @app.post("/v2/repository/index", response_model=list[schemas.RepositoryEntry])
    async def repository_index() -> list[dict[str, str]]:
        return [{"name": m.name, "version": m.version, "state": "READY"}
                for versions in models.values() for m in versions.values()]

    @app.get("/v2/models/{name}", response_model=schemas.ModelMetadata, responses=_ERRORS,
             response_model_exclude_unset=True)  # a real tensor's metadata has no parameters
    @app.get("/v2/models/{name}/versions/{version}", response_model=schemas.ModelMetadata, responses=_ERRORS,
             operation_id="model_metadata_versioned", response_model_exclude_unset=True)
    async def model_metadata(name: str, version: str | None = None) -> dict[str, Any]:
        return registry.get(name, version).metadata

    @app.get("/v2/models/{name}/config", response_model=dict[str, Any], responses=_ERRORS,
             summary="Model configuration (Triton)")
    @app.get("/v2/models/{name}/versions/{version}/config", response_model=dict[str, Any], responses=_ERRORS,
             operation_id="model_config_versioned", summary="Model configuration (Triton)")
    async def model_config(name: str, version: str | None = None) -> dict[str, Any]:
        """Triton's ``ModelConfig`` as JSON: the model folder's config.pbtxt completed from the
        model's inputs and outputs, or derived from them where there is none."""
        return registry.get(name, version).config

    @app.get("/v2/models/{name}/ready", response_model=schemas.ModelReady, responses=_ERRORS)
    @app.get("/v2/models/{name}/versions/{version}/ready", response_model=schemas.ModelReady, responses=_ERRORS,
             operation_id="model_ready_versioned")
    async def model_ready(name: str, version: str | None = None) -> dict[str, Any]:
        return {"name": registry.get(name, version).name, "ready": True}

    return app


def _require_bounded(models: dict[str, dict[str, ServedModel]]) -> None:
    """``ModelLoadError`` naming the first model version, and its nodes, that --max-tensor-bytes
    cannot bound on its backend."""
    for name, versions in models.items():
        for version, model in versions.items():
            nodes = model.session.unbounded_nodes
            if nodes:
                where = first_few([f"{node} in {place}" for node, place in nodes], 5, "; ", "; ...")
                raise ModelLoadError(
                    f"model {name!r} version {version}: --max-tensor-bytes cannot bound what its value-sized nodes "
                    f"make on {model.session.backend} before they run ({where}); "
                    "serve it with --backend numpy, which checks each such node as it runs, or with "
                    "--allow-unchecked to serve it unbounded")
