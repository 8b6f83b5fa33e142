"""Command-line options that reach a backend, gathered in one place with the backends that act on
each. One given for a backend that ignores it (`graphc run --threads 4 -b numpy` ran on numpy's
one thread, silently) is refused where the user named that backend, and warned about and left out
where ``auto`` chose it."""

from __future__ import annotations

import warnings
from typing import Any

import typer

from graphc.cli.app import given

# option -> (its parameter name, the backends that act on it, what it asks of them)
BACKEND_OPTIONS = {
    "--threads": ("threads", ("ort-cpu", "ort-cuda"), "onnxruntime's intra-op threads"),
    "--cuda-graph": ("cuda_graph", ("ort-cuda",), "the CUDA provider's CUDA graphs"),
}


def threads_option(per: str = "") -> Any:
    """``--threads N`` (N >= 0), alike on every command that takes it; ``per`` says what each
    count is for (`` per model``)."""
    return typer.Option(None, "--threads", min=0, help=f"onnxruntime's intra-op threads{per} (-b ort-cpu or "
                        "ort-cuda: numpy has none; default or 0: onnxruntime's own count).")


def backend_options(ctx: typer.Context, backend: str) -> dict[str, Any]:
    """The command's ``BACKEND_OPTIONS`` given on its command line, as the keyword arguments of a
    Session, Trainer or server on ``backend``. One that backend ignores is an error naming the
    option and the backend; where ``backend`` is ``auto``, a warning, and it is left out."""
    options, chosen = {}, backend  # auto resolved at the first option given, once
    for option, (name, acting, what) in BACKEND_OPTIONS.items():
        if name not in ctx.params or not given(ctx, name):
            continue
        if chosen == "auto":
            from graphc.backends import get_backend

            chosen = get_backend("auto").name
        value = ctx.params[name]
        if chosen in acting:
            options[name] = value
            continue
        said = option if isinstance(value, bool) else f"{option} {value}"
        message = f"{said} sets {what}, which the {chosen} backend does not have (only -b {' and -b '.join(acting)})"
        if backend != "auto":
            raise ValueError(f"{message}: give -b {acting[0]}, or leave {option} out")
        warnings.warn(f"{message}; -b auto chose {chosen}, so {option} is left out", stacklevel=2)
    return options
