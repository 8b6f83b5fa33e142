"""Every ``torch.nn`` module class and ``torch.nn.functional`` function of torch 2.13 has a ``gc.nn`` /
``gc.nn.functional`` name, but for the few listed here with the reason."""

from __future__ import annotations

import inspect

import pytest

import graphc as gc
import graphc.nn.functional as F

torch = pytest.importorskip("torch")

NOT_MODULES = {  # torch.nn module classes graphc leaves out, and why
    "Container": "deprecated since torch 1.0 (Sequential and ModuleList replace it)",
    "DataParallel": "multi-device replication; graphc's data parallelism is "
                    "graphc.runtime.distributed.DistributedTrainer's",
}
NOT_FUNCTIONS = {  # torch.nn.functional callables that are not functions a user calls on Tensors
    "Optional": "typing", "assert_int_or_pair": "torch's argument helper", "boolean_dispatch": "torch's helper",
    "handle_torch_function": "torch's override protocol", "has_torch_function": "torch's override protocol",
    "has_torch_function_unary": "torch's override protocol", "has_torch_function_variadic": "torch's override protocol",
    "scaled_mm": "float8 matmul with scaling recipes: no ONNX float8 training path",
    "scaled_grouped_mm": "float8 grouped matmul with scaling recipes: no ONNX float8 training path",
}


def test_every_torch_nn_module_class_has_a_gc_nn_name():
    names = {n for n, v in vars(torch.nn).items()
             if not n.startswith("_") and inspect.isclass(v) and issubclass(v, torch.nn.Module)}
    assert sorted(n for n in names if not hasattr(gc.nn, n)) == sorted(NOT_MODULES)


def test_every_torch_nn_functional_function_has_a_gc_nn_functional_name():
    names = {n for n, v in vars(torch.nn.functional).items()
             if not n.startswith("_") and callable(v) and not inspect.isclass(v) and not inspect.ismodule(v)}
    assert sorted(n for n in names if not hasattr(F, n)) == sorted(NOT_FUNCTIONS)
