"""List torch's public names (and keywords) that graphc's DSL does not provide, namespace by namespace.

    .venv/bin/python scripts/reach_sweep.py [keywords | NAMESPACE ...]

Compares names only (no values) against the installed torch. ``keywords``: the parameters of torch's
``nn.functional`` functions and ``nn`` module constructors that graphc's same-named ones lack (a C function's read
off its docstring). The namespaces: ``torch.nn`` module classes, ``torch.nn.functional``, ``torch.Tensor``
methods, ``torch`` callables, ``torch.linalg``, ``torch.fft``, ``torch.special``, ``torch.nn.init``,
``torch.nn.utils`` (and ``parametrize``, ``parametrizations``, ``rnn``), ``torch.distributions`` and
``torch.optim`` / ``lr_scheduler`` classes. Skipped: torch's private and typing names, the helpers its modules
import, and the Tensor methods of ``SKIP`` (internals, sparse, quantized, memory layout, removed). A missing name
whose absence a test already explains (``tests/test_torch_names.py``, ``tests/test_torch_nn_coverage.py``,
``tests/test_optim_torch_rest.py``) is counted, not listed. Needs torch.
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re
import sys

import torch
import torch.distributions as D
import torch.nn.utils.parametrizations  # noqa: F401 - the submodules swept below
import torch.nn.utils.parametrize  # noqa: F401
import torch.nn.utils.rnn  # noqa: F401
import torch.optim.lr_scheduler  # noqa: F401

import graphc as gc

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the tests' lists of absent names, and their own imports

SKIP = {  # torch.Tensor methods outside a model's numerics, by why
    "torch internals": "apply_ map_ map2_ as_subclass module_load hash_tensor slice_inverse is_distributed index",
    "sparse layouts": "ccol_indices col_indices crow_indices row_indices coalesce is_coalesced dense_dim sparse_dim "
                      "indices values to_dense smm sspaddmm sparse_mask sparse_resize_ sparse_resize_and_clear_ "
                      "resize_as_sparse_ to_sparse to_sparse_bsc to_sparse_bsr to_sparse_coo to_sparse_csc "
                      "to_sparse_csr to_mkldnn",
    "quantized / nested": "q_scale q_zero_point q_per_channel_axis q_per_channel_scales q_per_channel_zero_points "
                          "qscheme int_repr dequantize to_padded_tensor",
    "storage, memory and devices": "data_ptr const_data_ptr stride dim_order is_pinned pin_memory is_shared "
                                   "share_memory_ record_stream is_set_to set_ resize resize_ resize_as resize_as_ "
                                   "as_strided_ new_empty_strided get_device storage storage_offset storage_type "
                                   "untyped_storage ipu mtia xpu",
    "removed from torch": "eig symeig lstsq solve reinforce",
}
_SKIPPED = {n for names in SKIP.values() for n in names.split()}
_HELPERS = re.compile(r"_.*|Any|Callable|Optional|Union|Literal|ParamSpec|NamedTuple|Self|TypeVar|auto|contextmanager|"
                      r"deepcopy|overload|deprecated|warn|cast|Tensor|Module|Parameter|Optimizer|Number|Size|dtype|"
                      r"device|DType|ScalingType|SwizzleType|Enum|Iterable|PackedSequence_|bind|copy_method_params|"
                      r"OpaqueBase|is_opaque_reference_type|is_traceable_wrapper_subclass|"
                      r"get_swap_module_params_on_conversion")  # typing, and torch's helpers its modules import


def _gc(path: str):
    """graphc's module or attribute at the dotted ``path`` (None where there is none)."""
    try:
        return importlib.import_module(path)
    except ImportError:
        obj = gc
        for part in path.split(".")[1:]:
            obj = getattr(obj, part, None)
        return obj


def _callable(v) -> bool:
    return callable(v) and not inspect.ismodule(v)


def _module_class(v) -> bool:
    return inspect.isclass(v) and issubclass(v, torch.nn.Module)


def _distribution(v) -> bool:
    return inspect.isclass(v) and issubclass(v, (D.Distribution, D.transforms.Transform, D.constraints.Constraint))


def _optim_class(v) -> bool:
    return inspect.isclass(v) and issubclass(v, (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler))


NAMESPACES = {  # name -> (torch's, graphc's, which of torch's names count)
    "nn": (torch.nn, "graphc.nn", _module_class),
    "nn.functional": (torch.nn.functional, "graphc.nn.functional", _callable),
    "Tensor": (torch.Tensor, "graphc.Tensor", _callable),
    "torch": (torch, "graphc", _callable),
    "linalg": (torch.linalg, "graphc.linalg", _callable),
    "fft": (torch.fft, "graphc.fft", _callable),
    "special": (torch.special, "graphc.special", _callable),
    "nn.init": (torch.nn.init, "graphc.nn.init", _callable),
    "nn.utils": (torch.nn.utils, "graphc.nn.utils", _callable),
    "nn.utils.parametrize": (torch.nn.utils.parametrize, "graphc.nn.utils.parametrize", _callable),
    "nn.utils.parametrizations": (torch.nn.utils.parametrizations, "graphc.nn.utils.parametrizations", _callable),
    "nn.utils.rnn": (torch.nn.utils.rnn, "graphc.nn.utils.rnn", _callable),
    "distributions": (D, "graphc.distributions", _distribution),
    "optim": (torch.optim, "graphc.optim", _optim_class),
    "optim.lr_scheduler": (torch.optim.lr_scheduler, "graphc.optim.lr_scheduler", _optim_class),
}


def explained(space: str) -> set[str]:
    """The names of ``space`` a test lists as absent with the reason."""
    if space == "torch":
        from tests.test_torch_names import _reason
        return {n for n in dir(torch) if _reason(n)}
    if space in ("nn", "nn.functional"):
        from tests.test_torch_nn_coverage import NOT_FUNCTIONS, NOT_MODULES
        return set(NOT_MODULES if space == "nn" else NOT_FUNCTIONS)
    if space == "optim":
        from tests.test_optim_torch_rest import ABSENT
        return set(ABSENT)
    return set()


def missing(space: str) -> tuple[list[str], int]:
    """torch's names of ``space`` that graphc lacks and no test explains, and how many a test explains."""
    torch_obj, gc_path, keep = NAMESPACES[space]
    gc_obj = _gc(gc_path)
    names = {n for n in dir(torch_obj) if not _HELPERS.fullmatch(n) and keep(getattr(torch_obj, n, None))}
    lacking = {n for n in names if gc_obj is None or not hasattr(gc_obj, n)}
    if space == "Tensor":
        lacking -= _SKIPPED
    known = explained(space)
    return sorted(lacking - known), len(lacking & known)


def _parameters(fn, name: str) -> set[str] | None:
    """``fn``'s parameter names, from its signature or (a C function) its docstring's ``name(...)`` (over lines);
    None where it takes ``**kwargs`` or neither says."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        found = re.search(rf"^\s*{name}\(([^)]*)\)", fn.__doc__ or "", re.M)
        args = [a.split("=")[0].strip(" *\n") for a in found.group(1).split(",")] if found else []
        return {a for a in args if a.isidentifier()} or None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind is not p.VAR_POSITIONAL}


def missing_keywords() -> list[str]:
    """``F.name: [keywords]`` / ``nn.Name: [keywords]`` torch takes and graphc's same-named function or module
    constructor does not (``device``/``dtype`` of the modules aside)."""
    found = []
    for prefix, torch_ns, gc_ns in (("F", torch.nn.functional, _gc("graphc.nn.functional")),
                                    ("nn", torch.nn, _gc("graphc.nn"))):
        for name in sorted(n for n in dir(torch_ns) if not _HELPERS.fullmatch(n) and hasattr(gc_ns, n)):
            t, g = getattr(torch_ns, name), getattr(gc_ns, name)
            if prefix == "nn":
                if not _module_class(t):
                    continue
                t, g = t.__init__, g.__init__
            elif inspect.isclass(t) or not _callable(t):
                continue
            want, have = _parameters(t, name), _parameters(g, name)
            lacking = sorted(want - have - {"device", "dtype"}) if want and have is not None else []
            if lacking:
                found.append(f"{prefix}.{name}: {lacking}")
    return found


def main(argv: list[str]) -> None:
    total = 0
    if not argv or "keywords" in argv:
        keywords = missing_keywords()
        print(f"keywords: {len(keywords)} functions/modules lack some" + "".join(f"\n  {k}" for k in keywords))
    for space in [a for a in argv if a != "keywords"] or ([] if argv else NAMESPACES):
        names, known = missing(space)
        total += len(names)
        note = f" ({known} more listed absent with the reason in tests)" if known else ""
        print(f"{space}: {len(names)} missing{note}" + (f"\n  {' '.join(names)}" if names else ""))
    print(f"total: {total} missing")


if __name__ == "__main__":
    main(sys.argv[1:])
