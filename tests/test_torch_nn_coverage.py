"""Every ``torch.nn`` module class and ``torch.nn.functional`` function of torch 2.13 has a ``gc.nn`` /
``gc.nn.functional`` name, and every public ``torch.nn.Module`` method and attribute a ``gc.nn.Module`` one, but
for the few listed here with the reason."""

from __future__ import annotations

import inspect

import pytest

import graphc as gc
import graphc.nn.functional as F

torch = pytest.importorskip("torch")

NOT_MODULES = {  # torch.nn module classes graphc leaves out, and why
    "Container": "deprecated since torch 1.0 (Sequential and ModuleList replace it)",
}
NOT_FUNCTIONS = {  # torch.nn.functional callables that are not functions a user calls on Tensors
    "Optional": "typing", "assert_int_or_pair": "torch's argument helper", "boolean_dispatch": "torch's helper",
    "handle_torch_function": "torch's override protocol", "has_torch_function": "torch's override protocol",
    "has_torch_function_unary": "torch's override protocol", "has_torch_function_variadic": "torch's override protocol",
    "scaled_mm": "float8 matmul with scaling recipes: no ONNX float8 training path",
    "scaled_grouped_mm": "float8 grouped matmul with scaling recipes: no ONNX float8 training path",
}

NOT_MODULE_METHODS = {  # public torch.nn.Module names gc.nn.Module leaves out, and why
    "T_destination": "torch's typing variable for state_dict's destination",
    "call_super_init": "torch's class flag for multiple-inheritance __init__ chains",
    "dump_patches": "torch's class flag for upgrading pickled modules",
    "compile": "torch.compile in place; graphc is the compiler: gc.capture(module) and gc.Session",
    "share_memory": "torch.multiprocessing shared storage; graphc's workers get the arrays they need "
                    "(graphc.runtime.distributed)",
    "to_empty": "materialises meta-device parameters; graphc's are drawn when the module is initialised",
    "ipu": "a device move to hardware graphc has no backend for (cpu() and cuda() change nothing: "
           "the backend chooses the device)",
    "mtia": "a device move to hardware graphc has no backend for",
    "xpu": "a device move to hardware graphc has no backend for",
    "get_extra_state": "Python state in state_dict; graphc's state_dict holds arrays only",
    "set_extra_state": "Python state in state_dict; graphc's state_dict holds arrays only",
    "register_state_dict_pre_hook": "state_dict hooks: graphc's state_dict is arrays by key, to edit after",
    "register_state_dict_post_hook": "state_dict hooks: graphc's state_dict is arrays by key, to edit after",
    "register_load_state_dict_pre_hook": "load_state_dict hooks: rename or convert the keys before loading",
    "register_load_state_dict_post_hook": "load_state_dict hooks: read the IncompatibleKeys it returns",
}


def test_every_torch_nn_module_class_has_a_gc_nn_name():
    names = {n for n, v in vars(torch.nn).items()
             if not n.startswith("_") and inspect.isclass(v) and issubclass(v, torch.nn.Module)}
    assert sorted(n for n in names if not hasattr(gc.nn, n)) == sorted(NOT_MODULES)


def test_every_torch_nn_functional_function_has_a_gc_nn_functional_name():
    names = {n for n, v in vars(torch.nn.functional).items()
             if not n.startswith("_") and callable(v) and not inspect.isclass(v) and not inspect.ismodule(v)}
    assert sorted(n for n in names if not hasattr(F, n)) == sorted(NOT_FUNCTIONS)


def test_every_public_torch_nn_module_method_has_a_gc_nn_module_name():
    names = {n for n in dir(torch.nn.Module) if not n.startswith("_")}
    assert sorted(n for n in names if not hasattr(gc.nn.Module, n)) == sorted(NOT_MODULE_METHODS)
