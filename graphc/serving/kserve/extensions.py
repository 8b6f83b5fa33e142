"""Triton's extensions of the KServe v2 protocol: the ones this server implements (``GET /v2``
lists them), and the request parameters and routes of the ones it does not, so that a request
for one is refused naming it instead of being answered as if it had not asked (a
``"classification": 2`` output came back as the raw tensor)."""

from __future__ import annotations

import re

# What ``GET /v2`` lists: the binary tensor data of infer requests and replies, and
# ``GET /v2/models/{name}/config``. (``POST /v2/repository/index`` is served too, but not the load
# and unload of Triton's model_repository extension, so that one is not listed.)
SUPPORTED = ("binary_tensor_data", "model_configuration")

# Parameters whose meaning Triton's extensions define, by the extension, per place in a request.
_SHARED_MEMORY = {name: "system_shared_memory or cuda_shared_memory" for name in (
    "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")}
REQUEST_PARAMETERS = {"sequence_id": "sequence", "sequence_start": "sequence", "sequence_end": "sequence",
                      "priority": "schedule_policy", "timeout": "schedule_policy"}
INPUT_PARAMETERS = dict(_SHARED_MEMORY)
OUTPUT_PARAMETERS = {"classification": "classification", **_SHARED_MEMORY}
# Triton's parameters extension keeps the names that start with it for Triton's own features (a
# decoupled model's ``triton_enable_empty_final_response``); Triton's HTTP endpoint refuses every one
# in a request with a 400, and tritonclient refuses to send one. This server implements none of them.
RESERVED_PREFIX = "triton_"

# Routes of Triton extensions this server does not implement, as (path pattern, extension).
_ROUTES = (
    (r"/v2/repository/models/[^/]+/(?:load|unload)", "model_repository"),  # only its index is served
    (r"/v2/models(?:/[^/]+(?:/versions/[^/]+)?)?/stats", "statistics"),
    (r"/v2/(?:models/[^/]+/)?trace/setting", "trace"),
    (r"/v2/logging", "logging"),
    (r"/v2/systemsharedmemory(?:/.*)?", "system_shared_memory"),
    (r"/v2/cudasharedmemory(?:/.*)?", "cuda_shared_memory"),
)


def unsupported_message(extension: str) -> str:
    """Why a request for ``extension`` is refused, with what the server has instead."""
    return f"this server does not implement Triton's {extension} extension ({_listed('ones')})"


def _listed(what: str) -> str:
    """Where a client finds the extensions this server implements (``what`` names them)."""
    return f"GET /v2 lists the {what} it does: {', '.join(SUPPORTED)}"


def reserved_message(name: str) -> str:
    """Why parameter ``name`` (it starts with ``RESERVED_PREFIX``) is refused."""
    return f"parameter {name!r}: Triton reserves the parameter names starting with {RESERVED_PREFIX!r} for its own " \
           f"features (its parameters extension), and this server implements none of them ({_listed('extensions')})"


def route_extension(path: str) -> str | None:
    """The unimplemented extension whose route ``path`` is, or None."""
    return next((extension for pattern, extension in _ROUTES if re.fullmatch(pattern, path)), None)
