"""onnxruntime backends: "ort-cpu" (CPUExecutionProvider) and "ort-cuda" (CUDAExecutionProvider).

Sessions are built from the model's bytes (a model over protobuf's 2 GiB limit: from a temporary file
with external data), stamped with the lowest IR version its opsets need (onnxruntime 1.31 refuses IR 14).
Each session records which execution provider runs each node (``session.record_ep_graph_assignment_info``)
and, on a device, how many host/device copy nodes onnxruntime inserted. Values that should stay on the
device (the Trainer's params and optimizer state) go through ``to_device`` / ``run_bound`` (IOBinding).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from graphc.backends import (batchnorm, bfloat16, denormals, doubles, dropout, fusions, graph_order, integers,
                             loop_bodies, narrow_casts, opsets, pad_axes, pools, recurrent, scans)
from graphc.backends.cpu_model import cpu_kernels, race_free
from graphc.backends.graph_order import session_order
from graphc.backends.iobinding import Bindings
from graphc.backends.ort_serialize import serialize_for_ort
from graphc.backends.base import BackendInfo
from graphc.backends.cancel import CancelToken
from graphc.errors import BackendError, BackendUnavailable, RunCancelled
from graphc.model import RECOMPUTED_KEY, node_label, node_source
from graphc.model.file import distinct_subgraph_outputs, unique_node_names, with_body_output_shapes
from graphc.model.inferred import SharedTypes
from graphc.model.dtypes import to_onnx

_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
           "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}
# Domains onnxruntime has kernels for; a node in any other domain cannot run.
_KNOWN_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc", "ai.onnx.training"}
_COPY_OPS = {"MemcpyToHost", "MemcpyFromHost"}
_ORT_QUIET = 4  # session log severity fatal: run-time errors reach the caller as BackendError, so
# onnxruntime's own copy of them (and its "nodes placed on CPU" warnings) would be noise.


def _ort():
    import onnxruntime

    return onnxruntime


# -- availability ----------------------------------------------------------------------------------

class _CaptureOutput:
    """Capture what onnxruntime prints while probing: its C++ logger writes to fd 2, ``preload_dlls`` to stdout."""

    def __enter__(self) -> _CaptureOutput:
        self._tmp = tempfile.TemporaryFile()
        try:
            self._saved: int | None = os.dup(2)
            os.dup2(self._tmp.fileno(), 2)
        except OSError:  # no usable fd 2 (a detached daemon): nothing to capture there
            self._saved = None
        self._stdout = contextlib.redirect_stdout(io.StringIO())
        self._printed = self._stdout.__enter__()
        self.text = ""
        return self

    def __exit__(self, *exc: object) -> None:
        self._stdout.__exit__(None, None, None)
        if self._saved is not None:
            os.dup2(self._saved, 2)
            os.close(self._saved)
        self._tmp.seek(0)
        self.text = self._printed.getvalue() + self._tmp.read().decode("utf-8", "replace")
        self._tmp.close()


def _tiny_model() -> bytes:
    h = onnx.helper
    graph = h.make_graph([h.make_node("Add", ["x", "x"], ["y"], name="probe")], "probe",
                         [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _load_failure(log: str) -> str:
    """The useful part of onnxruntime's provider-load error log."""
    for pattern in (r"with error: ([^\n\x1b]+)", r"(Failed to load lib[^:\n]+)", r"(Failed to create CUDAExecutionProvider[^\n\x1b]*?\.)",
                    r"\] ([^\n\x1b]+)"):
        m = re.search(pattern, log)
        if m:
            return m.group(1).strip()
    return "the session fell back to CPUExecutionProvider"


@functools.cache
def probe_cuda(device_id: int = 0) -> tuple[bool, str]:
    """Can a real session get CUDAExecutionProvider? (available, reason). Cached per device.

    onnxruntime-gpu without CUDA/cuDNN libraries logs an error and silently runs on CPU, so
    asking for the provider proves nothing: build a tiny session and look at what it got.
    """
    ort = _ort()
    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        return False, (f"no CUDA provider in this onnxruntime build (providers: {', '.join(providers)}); "
                       "install onnxruntime-gpu")
    options = ort.SessionOptions()
    options.log_severity_level = 4
    with _CaptureOutput() as captured:
        try:
            if hasattr(ort, "preload_dlls"):  # finds NVIDIA's pip wheels (the `cuda` extra)
                ort.preload_dlls(directory="")
            session = ort.InferenceSession(_tiny_model(), options, providers=[
                ("CUDAExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"])
            got = session.get_providers()
        except Exception as exc:  # noqa: BLE001 - any failure means "not available", with why
            return False, f"CUDA provider failed to load: {str(exc).strip().splitlines()[0]}"
    if "CUDAExecutionProvider" not in got:
        return False, f"CUDA provider failed to load: {_load_failure(captured.text)}"
    return True, ""


# -- backends ----------------------------------------------------------------------------------------

class _OrtBackend:
    name = ""
    device = ""
    provider = ""

    def info(self) -> BackendInfo:
        try:
            _ort()
        except ImportError as exc:
            available, reason = False, f"onnxruntime is not installed ({exc})"
        else:
            available, reason = self._availability()
        return BackendInfo(name=self.name, available=available, device=self.device, reason=reason)

    def _availability(self) -> tuple[bool, str]:
        """(available, reason) once onnxruntime imports."""
        raise NotImplementedError

    def prepare(self, model: onnx.ModelProto, *, threads: int | None = None,
                graph_optimization_level: str | int = "all", device_id: int = 0,
                providers_options: Mapping[str, Any] | None = None, keep_recomputation: bool = False,
                mem_pattern: bool | None = None, exact_arena: bool = False, cuda_graph: bool = False,
                flush_denormals: bool = False, profile: str | None = None,
                optimized_graph: bool = False, cpu_arena: bool = True,
                graph_order: bool | None = None) -> OrtExecutable:
        """Build an onnxruntime session. An op onnxruntime cannot run fails here.
        ``keep_recomputation``: the model recomputes values on purpose (``generate(...,
        recompute=True)``; on by itself for a model holding a checkpoint region's copy, marked
        ``RECOMPUTED_KEY``: ``gc.grad`` of a model with regions): common-subexpression elimination, which would merge
        the copies back, is off, and nodes run in priority order (ready nodes in graph order), so
        each copy runs where the graph places it, just before its reader (for every train step, that order lost
        to onnxruntime's default: ResNet-18 at batch 32, 64 px, 1.030x / 1.041x the step time,
        Trainers interleaved, built second / first). ``mem_pattern``: onnxruntime's memory pattern (one block
        planned for all intermediates, sized on the first run); ``graph_order`` (CPU): run the graph onnxruntime
        optimizes in the given graph's order (``graph_order``); by default the pattern on and the order off; for a
        model holding region copies, ``graph_order.session_order``'s choice per device (the reverse on the CPU; on
        CUDA the pattern off, onnxruntime's order); the Trainer turns the pattern off for train_step
        (``graphc.runtime.trainer``). ``exact_arena``: the session's arena grows
        by exactly what is asked, not by powers of two: on the CPU the process's shared arena
        (``_exact_cpu_arena``), on CUDA the provider's own
        (``EXACT_CUDA_ARENA``, unless ``providers_options`` sets its strategy).
        ``cuda_graph``: on the CUDA provider, let runs given a ``graph_id`` be captured and replayed
        as CUDA graphs (``graphc.runtime.cuda_graph`` says what that asks of the model and the
        runs); onnxruntime refuses the session where a compute node would run on the CPU.
        ``flush_denormals``: on the CPU, denormal floats count as zero in and out of every kernel,
        in the session's threads and in the calling thread while it runs (``denormals``); the
        Trainer's default (see ``graphc.runtime.trainer``). ``profile``: a file prefix;
        onnxruntime's profiler records every run, ``end_profiling`` writes the trace.
        ``optimized_graph``: keep the graph onnxruntime runs, after its optimizations, as
        ``OrtExecutable.optimized_graph`` (the Trainer decides from it which outputs it may write
        in place, ``graphc.passes.training.in_place``). ``cpu_arena=False``: no CPU memory arena
        (``exact_arena`` then has no effect on the CPU): every buffer goes back to the system when
        freed, where an arena keeps its largest size for the session's life (a server's request
        for a value-sized tensor of 4 GB held 4 GB for good); a run of a small model costs about
        10 us more."""
        if cuda_graph and self.device != "cuda":
            raise ValueError(f"cuda_graph needs the CUDA provider (backend 'ort-cuda'), not {self.name!r}")
        _check_domains(model, self.name)
        model = opsets.within_reach(unique_node_names(with_body_output_shapes(model)), self.name)
        # one shape inference serves the rewrites until one of them changes the model (SharedTypes)
        types_of = SharedTypes()
        model = batchnorm.lower_training_mode(model, self.name, types_of)
        model = integers.lower(doubles.lower_double(model, self.device, types_of), types_of)
        model = scans.guard_empty(recurrent.with_full_params(model))
        model = pools.explicit_pads(model, types_of)
        model = distinct_subgraph_outputs(pad_axes.without_axes(model, types_of))  # the rewrites' bodies too
        model = loop_bodies.terminable(model)  # RunOptions.terminate (cancel=) reaches every Loop
        ort = _ort()
        options = ort.SessionOptions()
        options.log_severity_level = _ORT_QUIET
        options.graph_optimization_level = _optimization_level(graph_optimization_level)
        if profile is not None:
            options.enable_profiling, options.profile_file_prefix = True, str(profile)
        if threads is not None:
            if int(threads) < 0:
                raise ValueError(f"threads must be >= 0 (0: onnxruntime's default), got {threads}")
            options.intra_op_num_threads = int(threads)
        options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        if self.device == "cpu":
            model = narrow_casts.lower_for_cpu(race_free(model, options), types_of)  # as a Triton CPU instance's file
            if options.graph_optimization_level != ort.GraphOptimizationLevel.ORT_DISABLE_ALL:
                model = cpu_kernels(model, options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                     types_of)
        flush_denormals = bool(flush_denormals) and self.device == "cpu"
        if flush_denormals:
            options.add_session_config_entry("session.set_denormal_as_zero", "1")
        if not cpu_arena:
            options.enable_cpu_mem_arena = False
        elif exact_arena and self.device == "cpu" and _exact_cpu_arena():
            options.add_session_config_entry("session.use_env_allocators", "1")
        disabled = dropout.eliminating(model) + pools.fusion_refused(model) + fusions.fusion_refused(model, types_of)
        copies = any(p.key == RECOMPUTED_KEY for n in model.graph.node for p in n.metadata_props)
        if keep_recomputation or copies:
            options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
            disabled += ("CommonSubexpressionElimination",)
        options.enable_mem_pattern, in_graph_order = session_order(self.device, copies, mem_pattern, graph_order)
        provider_options = {**({"device_id": int(device_id)} if self.device == "cuda" else {}),
                            **({"enable_cuda_graph": "1"} if cuda_graph else {}),
                            **(EXACT_CUDA_ARENA if exact_arena and self.device == "cuda" else {}),
                            **dict(providers_options or {})}
        return OrtExecutable(self, model, options, provider_options, int(device_id), tuple(dict.fromkeys(disabled)),
                             cuda_graph, flush_denormals, optimized_graph, in_graph_order)


class CpuBackend(_OrtBackend):
    """onnxruntime's CPU execution provider (any onnxruntime build has it)."""

    name = "ort-cpu"
    device = "cpu"
    provider = "CPUExecutionProvider"

    def _availability(self) -> tuple[bool, str]:
        return True, ""


class CudaBackend(_OrtBackend):
    """onnxruntime's CUDA execution provider, available only when a real session gets it."""

    name = "ort-cuda"
    device = "cuda"
    provider = "CUDAExecutionProvider"

    def _availability(self) -> tuple[bool, str]:
        return probe_cuda(0)


# The CUDA provider's arena grows by exactly what is asked (the Trainer's train_step): measured on
# an H200, graphed steps at batch 32, 128 px, GPU memory held after 5 steps (MB, against PyTorch
# eager's): ResNet-50 3,330 -> 2,582 (2,226), EfficientNet-B0 2,918 -> 2,138 (1,952), ViT-Ti
# 2,896 -> 2,686 (2,320), ResNet-18 1,532 -> 1,556 (1,324); step times within noise (ResNet-50
# 35.8 vs 35.9 ms, EfficientNet 39.4 vs 40.7, ViT 17.6 vs 17.7, ResNet-18 16.2 vs 16.3).
EXACT_CUDA_ARENA = {"arena_extend_strategy": "kSameAsRequested"}


@functools.cache
def _exact_cpu_arena() -> bool:
    """Register, once per process, onnxruntime's shared CPU arena, growing by exactly what is asked
    (``kSameAsRequested``): True if sessions may use it; False where onnxruntime refuses, and
    sessions keep arenas of their own. A session's own arena
    doubles as it grows; a train step's peak RSS with the exact one, 2 threads, 64 px: ResNet-50
    at batch 32 1,205 -> 1,142 MB, at batch 2 816 -> 782, the GPT of bench_zoo at batch 32 916 ->
    900 (PyTorch eager: 1,048, 782, 968); step times within noise (Trainers with and without it
    interleaved in one process, ms: 1,210 vs 1,248, 234 vs 246, 1,429 vs 1,395). onnxruntime
    keeps it for the process; its blocks serve every session that uses it, one after another."""
    ort = _ort()
    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    try:
        ort.create_and_register_allocator(info, ort.OrtArenaCfg({"arena_extend_strategy": 1}))
    except (RuntimeError, ort.capi.onnxruntime_pybind11_state.Fail):  # an onnxruntime that refuses
        return False
    return True


def _optimization_level(level: str | int):
    ort = _ort()
    if isinstance(level, int) and not isinstance(level, bool) and 0 <= level < len(_LEVELS):
        level = list(_LEVELS)[level]
    if level not in _LEVELS:
        raise ValueError(f"graph_optimization_level must be one of {', '.join(_LEVELS)}, got {level!r}")
    return getattr(ort.GraphOptimizationLevel, _LEVELS[level])


def _check_domains(model: onnx.ModelProto, backend: str) -> None:
    local_functions = {(f.domain, f.name) for f in model.functions}
    for index, node in enumerate(model.graph.node):
        if node.domain not in _KNOWN_DOMAINS and (node.domain, node.op_type) not in local_functions:
            raise BackendError(f"{backend} cannot run op '{node.domain}::{node.op_type}' "
                               f"({node_label(node.name, index)}{_at(node)}): onnxruntime has no kernels for "
                               f"domain {node.domain!r}")


def _at(node: onnx.NodeProto | None) -> str:
    source = node_source(node) if node is not None else None
    return f", at {source}" if source else ""


# -- executable ---------------------------------------------------------------------------------------

class OrtExecutable:
    """One onnxruntime InferenceSession plus its placement and IOBinding helpers."""

    def __init__(self, backend: _OrtBackend, model: onnx.ModelProto, options: Any,
                 provider_options: dict[str, Any], device_id: int, disabled_optimizers: Sequence[str] = (),
                 cuda_graph: bool = False, flush_denormals: bool = False, optimized_graph: bool = False,
                 in_graph_order: bool = False):
        ort = _ort()
        self._flush = flush_denormals
        # a run that names no graph must not be captured as graph 0 and replayed on other inputs
        self._default_graph = -1 if cuda_graph else None
        self.backend_name = backend.name
        self.device = backend.device
        self.device_id = device_id
        self._nodes = list(model.graph.node)
        providers: list[Any] = [(backend.provider, provider_options)]
        if backend.provider != "CPUExecutionProvider":
            providers.append("CPUExecutionProvider")  # ops without a CUDA kernel run on CPU
        with tempfile.TemporaryDirectory(prefix="graphc-ort-") as tmp:
            data = serialize_for_ort(model, Path(tmp))
            optimized = Path(tmp) / "optimized.onnx"
            if backend.device != "cpu" or optimized_graph or in_graph_order:  # to count the copy nodes onnxruntime inserts
                options.optimized_model_filepath = str(optimized)
                # initializers of 1 KiB or more (frozen weights) go to a side file (read by in_graph_order's session)
                options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                                 "optimized.data")
                options.add_session_config_entry(
                    "session.optimized_model_external_initializers_min_size_in_bytes", "1024")
            graph = None  # the graph onnxruntime runs, where it wrote one: graph_order's sorted one
            try:  # the first session of the process sets its builder's flush mode for good: not here
                with denormals.flushing(False):
                    if in_graph_order:
                        optimized, graph = graph_order.optimized_in_order(ort, data, options, providers,
                                                                          disabled_optimizers, model, optimized)
                    self.session = ort.InferenceSession(str(optimized) if in_graph_order else data, options,
                                                        providers, disabled_optimizers=list(disabled_optimizers) or None)
            except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
                raise self._error(exc, "cannot load") from None
            if graph is None and optimized.is_file():
                graph = onnx.load(str(optimized), load_external_data=False).graph
        self.copy_nodes = sum(n.op_type in _COPY_OPS for n in graph.node) if graph is not None else 0
        # the graph onnxruntime runs (None unless asked for, or where onnxruntime wrote none)
        self.optimized_graph = graph if optimized_graph else None
        if backend.provider not in self.session.get_providers():
            raise BackendUnavailable(f"{backend.name}: onnxruntime did not give the session "
                                     f"{backend.provider} (it got {self.session.get_providers()})")
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        bf16 = any(v.type == bfloat16.TYPE for v in self.session.get_inputs() + self.session.get_outputs())
        self._run = functools.partial(bfloat16.run, self.session, _ort()) if bf16 else self.session.run
        self._placement = {node.name: sub.ep_name for sub in self.session.get_provider_graph_assignment_info()
                           for node in sub.get_nodes()}
        self._bindings = Bindings(self.session, ort.OrtValue, self.device, self.device_id)

    @property
    def placement(self) -> dict[str, str]:
        """Node name (in onnxruntime's optimized graph) -> execution provider that runs it."""
        return dict(self._placement)

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None,
            cancel: CancelToken | None = None) -> dict[str, np.ndarray]:
        names = list(outputs) if outputs is not None else self.output_names
        contiguous = {k: np.asarray(v, order="C") for k, v in feeds.items()}
        options = self._run_options(None)
        if cancel is not None:
            options = cancel.watch(options or _ort().RunOptions())
            options.log_severity_level = 4  # a terminated run is not an error to log (severity 3)
        try:
            with denormals.flushing(self._flush):
                values = self._run(names, contiguous, options)
        except Exception as exc:  # noqa: BLE001
            if cancel is not None and cancel.cancelled:
                raise RunCancelled(f"the {self.backend_name} run was terminated (RunOptions.terminate)") from None
            raise self._error(exc, "failed while running") from None
        return dict(zip(names, values))

    # -- device residency ---------------------------------------------------------------------
    def to_device(self, array: np.ndarray, owned: bool = False) -> Any:
        """An OrtValue on this session's device: a private copy, except of an ``owned``
        C-contiguous array on the CPU, which the OrtValue wraps as it is."""
        keep = owned and self.device == "cpu" and array.flags.c_contiguous and array.flags.writeable
        return bfloat16.to_device(_ort(), array, keep, self.device, self.device_id)

    def to_host(self, handle: Any) -> np.ndarray:
        return bfloat16.to_array(handle) if hasattr(handle, "numpy") else np.asarray(handle)

    def empty_like(self, handle: Any) -> Any:
        """A new OrtValue on this session's device, of ``handle``'s shape and dtype (contents undefined)."""
        dtype = to_onnx(handle.data_type().removeprefix("tensor(").removesuffix(")"))  # bfloat16 has no numpy type here
        return _ort().OrtValue.ortvalue_from_shape_and_type(handle.shape(), dtype, self.device, self.device_id)

    def run_bound(self, feeds: Mapping[str, Any], host_outputs: Sequence[str],
                  device_outputs: Sequence[str] = (), into: Mapping[str, Any] | None = None,
                  graph_id: int | None = None, keep: bool = False) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Run with IOBinding (``iobinding``): handles are bound as they are, host arrays are
        copied in; device outputs stay on the device as OrtValues (written into the OrtValue
        ``into`` holds for one, else allocated), host outputs come back as numpy arrays.
        ``graph_id``: on a session prepared with ``cuda_graph``, the CUDA graph this run is
        captured as or replays (-1: none). ``keep``: where ``into`` holds a handle for every
        device output, keep the binding (two at most) and run it again when the same handles
        come back (``forget_bindings`` drops them): Trainer steps interleaved, batch 2, 64 px,
        against binding anew, RegNetY-400MF 0.981x the step time, MobileNetV3-small 0.975x,
        EfficientNet-B0 0.980x (300-350 carried tensors each), ResNet-18 1.00x (130)."""
        given = into or {}
        binding, arrays = self._bindings.bind(feeds, host_outputs, device_outputs, given, graph_id, keep)
        try:
            with denormals.flushing(self._flush):
                self.session.run_with_iobinding(binding, self._run_options(graph_id))
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, "failed while running") from None
        del arrays  # bound host arrays: alive until the run is done
        return self._bindings.results(binding, host_outputs, device_outputs, given)

    def forget_bindings(self) -> None:
        """Drop the bindings ``run_bound(keep=True)`` kept, and their hold on the handles."""
        self._bindings.forget()

    def end_profiling(self) -> Path:
        """Stop the profiler of a session prepared with ``profile``; the trace's path (JSON)."""
        return Path(self.session.end_profiling())

    def _run_options(self, graph_id: int | None) -> Any:
        graph_id = self._default_graph if graph_id is None else graph_id
        if graph_id is None:
            return None
        options = _ort().RunOptions()
        options.add_run_config_entry("gpu_graph_id", str(int(graph_id)))
        return options

    def _error(self, exc: Exception, what: str) -> BackendError:
        """Map an onnxruntime error to BackendError naming node, op and source line."""
        message = re.sub(r"^\[ONNXRuntimeError\] : \d+ : ", "", str(exc).strip())
        m = re.search(r"[Nn]ode(?:\. Name)?[:\s]*[\(']([^'\)]*)['\)]|node with name '([^']*)'", message)
        # a node without a name is '' there: named by its index if the only one of an op the message names
        found = [(node_label(n.name, i), n) for i, n in enumerate(self._nodes) if m and n.name == m[m.lastindex]
                 and (n.name or re.search(rf"\b{re.escape(n.op_type)}\b", message))]
        if len(found) != 1:
            return BackendError(f"{self.backend_name} {what} the model: {message}")
        label, node = found[0]
        # drop onnxruntime's "/onnxruntime_src/...cc:91 ns::Function(args) " prefix
        detail = re.sub(r"^/\S+:\d+ .*?\) (?=\w)", "", re.split(r"Status Message:\s*", message)[-1])
        return BackendError(f"{self.backend_name} {what} {label} ({node.op_type}{_at(node)}): {detail}")
