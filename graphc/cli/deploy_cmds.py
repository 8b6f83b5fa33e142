"""`graphc deploy triton` and `graphc serve`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from graphc.cli.app import (allow_uncalibrated_option, app, check_dtype_options, check_writable_at, console,
                            deploy_app, keep_io_types_option, naming_opset, one_line_warnings)
from graphc.cli.backend_options import backend_options, threads_option
from graphc.cli.interrupted import wrote
from graphc.errors import InputError
from graphc.fileio import missing


@deploy_app.command("triton")
def triton_cmd(
    ctx: typer.Context,
    model: Path = typer.Argument(..., metavar="MODEL.onnx", help="The .onnx model."),
    repo: Path = typer.Option(..., "--repo", metavar="DIR", help="The Triton model repository folder."),
    name: str = typer.Option(..., "--name", help="The model's name (its folder in the repository)."),
    max_batch_size: int = typer.Option(0, "--max-batch-size", min=0, help="> 0: Triton batches along dim 0 (must be symbolic)."),
    gpu: bool = typer.Option(False, "--gpu", help="Run instances on the GPU (KIND_GPU) instead of the CPU."),
    dynamic_batching: bool = typer.Option(False, "--dynamic-batching", help="Let Triton merge requests (needs --max-batch-size)."),
    opset: Optional[int] = typer.Option(None, "--opset", help="The ai.onnx opset to write (default: the model's, at most 17)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", metavar="float16|bfloat16", help="float16 or bfloat16: deploy the model converted "
                                        "(gc.convert_float; default: as it is)."),
    keep_io_types: bool = keep_io_types_option(True, ": TYPE_FP32 in the config, so clients send what the "
                                               "float32 model took (--no-keep-io-types: TYPE_FP16/TYPE_BF16)."),
    allow_uncalibrated: bool = allow_uncalibrated_option("Write"),
) -> None:
    """Write MODEL into a Triton model repository.

    Writes REPO/NAME/config.pbtxt and REPO/NAME/VERSION/model.onnx (version 1, or one above the
    highest already there).

    Example:

    \b
    graphc deploy triton trained.onnx --repo repo --name net
    """
    from graphc.passes.precision import RangeWarning
    from graphc.serving import deploy

    check_deployable(model)
    check_writable_at(repo, "--repo", folder=True)
    check_dtype_options(ctx, dtype)
    if dynamic_batching and max_batch_size <= 0:
        raise InputError(f"--dynamic-batching lets Triton merge requests along dim 0, which needs --max-batch-size "
                         f"N > 0 too (got {'no --max-batch-size' if max_batch_size == 0 else max_batch_size})")
    with one_line_warnings(RangeWarning), naming_opset(opset):
        folder = deploy.triton(model, repo, name, max_batch_size=max_batch_size, instance="gpu" if gpu else "cpu",
                               dynamic_batching=dynamic_batching, opset=opset, dtype=dtype,
                               keep_io_types=keep_io_types, allow_uncalibrated=allow_uncalibrated)
    wrote(folder)
    versions = deploy.triton_versions(folder)
    kept = f" (versions {', '.join(map(str, versions[:-1]))} kept; Triton serves the highest)" if len(versions) > 1 else ""
    console.print(escape(f"wrote {folder / 'config.pbtxt'} and version {versions[-1]}: "
                         f"{folder / str(versions[-1]) / 'model.onnx'}{kept}"), highlight=False, soft_wrap=True)


def check_deployable(model: Path, then: str = "deploy") -> None:
    """Refuse training artifacts or a checkpoint given as MODEL.onnx, saying to export it first and
    ``then`` (the command) the file (read as a model, a folder was only "not a file"; by serve, a
    repository with no models)."""
    from graphc.cli.inspect_training import training_kind

    kind = training_kind(model)
    if kind is not None:
        what = "training artifacts" if kind == "artifacts" else "a checkpoint"
        raise InputError(f"{model}: {what}, not an ONNX model; write its inference model first: graphc export "
                         f"{model} -o model.onnx, then {then} model.onnx")


@app.command("serve")
def serve_cmd(
    ctx: typer.Context,
    source: Path = typer.Argument(..., metavar="MODEL.onnx|REPO", help="An .onnx model or a Triton repository folder."),
    name: Optional[str] = typer.Option(None, "--name", help="Serve the model under this name (a repository: serve only it)."),
    host: str = typer.Option("127.0.0.1", "--host", metavar="ADDRESS", help="Address to bind (loopback by default)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port (0: any free one)."),
    backend: str = typer.Option("auto", "--backend", "-b", help="numpy, ort-cpu, ort-cuda or auto."),
    threads: Optional[int] = threads_option(" per model"),
    max_body_bytes: Optional[int] = typer.Option(None, "--max-body-bytes", help="Largest request body, also once decompressed (413 above; default 256 MiB)."),
    max_json_bytes: Optional[int] = typer.Option(None, "--max-json-bytes", help="Largest JSON part of a request (413 above; default 32 MiB)."),
    max_queue: Optional[int] = typer.Option(None, "--max-queue", help="Most infer requests held at once (503 above; default 128)."),
    max_reply_bytes: Optional[int] = typer.Option(None, "--max-reply-bytes", help="Largest reply body (400 above; default 1 GiB)."),
    max_tensor_bytes: Optional[int] = typer.Option(None, "--max-tensor-bytes", help="Largest tensor a request's values may size (413 above; default 4 GiB)."),
    max_request_bytes: Optional[int] = typer.Option(None, "--max-request-bytes", help="Most bytes of tensors such a model may hold at once for a request (413 above; default 8 GiB)."),
    max_inflight_bytes: Optional[int] = typer.Option(None, "--max-inflight-bytes", help="Most bytes of request bodies and replies held at once, all requests together (503 with Retry-After above, the body unread; default 4 x --max-body-bytes)."),
    allow_unchecked: bool = typer.Option(False, "--allow-unchecked", help="Serve models whose value-sized tensors the backend cannot bound before running them (ort: ops in Loop/If/Scan bodies), unbounded."),
    read_timeout: Optional[float] = typer.Option(None, "--read-timeout", metavar="SECONDS", help="Seconds a connection has to send a whole request (default 30)."),
    request_timeout: Optional[float] = typer.Option(None, "--request-timeout", metavar="SECONDS", help="Seconds a model has to answer a received request, then 504 (default 120; 0: no limit)."),
    allow_uncalibrated: bool = allow_uncalibrated_option("Serve"),
) -> None:
    """Serve a model or a Triton repository over HTTP (KServe v2).

    Answers the KServe v2 / Open Inference Protocol until SIGINT or SIGTERM. Once it listens it
    prints the address, then one line per model: the versions it serves, the backend, and the
    versions on disk its version_policy leaves out. A saved capture whose fake quantizations never saw data (optimized or not, or such a file placed in a
    repository by hand) is refused at load (exit 2) unless --allow-uncalibrated.

    Example (the repository graphc deploy triton wrote):

    \b
    graphc serve repo --port 8000
    """
    from graphc.backends import get_backend
    from graphc.serving import serve as serving

    if not source.exists():
        raise FileNotFoundError(f"{source}: {missing(source, 'model file or repository folder')}")
    check_deployable(source, then="serve")
    options = backend_options(ctx, backend)
    limits = {key: value for key, value in (("max_body_bytes", max_body_bytes), ("max_json_bytes", max_json_bytes),
                                            ("max_queue", max_queue), ("max_reply_bytes", max_reply_bytes),
                                            ("max_tensor_bytes", max_tensor_bytes), ("max_request_bytes", max_request_bytes),
                                            ("max_inflight_bytes", max_inflight_bytes),
                                            ("read_timeout", read_timeout)) if value is not None}
    for key, value in limits.items():
        if value <= 0:
            raise ValueError(f"--{key.replace('_', '-')} must be positive, got {value}")
    body_cap = limits.get("max_body_bytes", serving.DEFAULT_MAX_BODY_BYTES)
    if limits.get("max_inflight_bytes", body_cap) < body_cap:
        raise ValueError(f"--max-inflight-bytes must be at least --max-body-bytes ({body_cap}), or a body the server "
                         f"takes could never be read; got {max_inflight_bytes}")
    timeouts = {"read_timeout": limits.pop("read_timeout")} if "read_timeout" in limits else {}
    if request_timeout is not None:
        if not 0 <= request_timeout < math.inf:  # NaN too
            raise ValueError(f"--request-timeout must be 0 (no limit) or a finite number of seconds, got {request_timeout}")
        limits["request_timeout"] = request_timeout or None
    served = serving.create_app(source, backend=backend, name=name, allow_unchecked=allow_unchecked,
                                allow_uncalibrated=allow_uncalibrated, **limits, **options)

    def ready(address: tuple[str, int]) -> None:
        chosen = get_backend(backend).name  # what the models' sessions resolved "auto" to
        shown = backend if chosen == backend else f"{backend}: {chosen}"
        bound = f"[{address[0]}]" if ":" in address[0] else address[0]
        console.print(escape(f"serving {source} on http://{bound}:{address[1]}/v2 (backend {shown}); Ctrl-C stops"),
                      highlight=False, soft_wrap=True)
        for line in served_lines(served.registry.models):
            console.print(escape(line), highlight=False, soft_wrap=True)

    serving.serve_app(served, host, port, on_ready=ready, **timeouts)
    console.print(escape(f"stopped serving {source}"), highlight=False, soft_wrap=True)


def served_lines(models: dict[str, dict[str, Any]]) -> list[str]:
    """One line per served model (``load_models``' name -> version -> ``ServedModel``): its
    versions, the backend its sessions run on, and the versions on disk its version_policy leaves
    out, e.g. ``  model b: versions 2, 3 on numpy; version 1 left out by ...``."""
    from graphc.serving.kserve.app import versions_phrase

    lines = []
    for name, versions in models.items():
        newest = versions[next(reversed(versions))]
        line = f"  model {name}: {versions_phrase(list(versions))} on {newest.session.backend}"
        if newest.left_out:  # one policy per model: every left-out version has the same rule
            line += f"; {versions_phrase(list(newest.left_out))} left out by {next(iter(newest.left_out.values()))}"
        lines.append(line)
    return lines
