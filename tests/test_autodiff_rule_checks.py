"""The autodiff driver checks its rules (issue 13, item 4), as JAX's ``ct_check`` does: a rule that
returns too few or too many gradients, or one of the wrong dtype or static shape, is an error
naming the op, the node and the input; broadcasting is undone by the driver, not by rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

import graphc as gc
from graphc.passes.autodiff import registry
from graphc.passes.autodiff.registry import RULES, GradRule

try:
    from test_autodiff_models import mlp_model
except ImportError:  # tests/ collected as a package
    from tests.test_autodiff_models import mlp_model


RULES_BEFORE = dict(RULES)  # the registered rules, to wrap or re-register


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((5, 4)), "onehot": np.eye(3)[[0, 1, 2, 0, 1]]}


def _grad_with_relu_rule(monkeypatch, fn, **flags):
    """gc.grad of the MLP (float64, x[N,4] -> Relu of h1[N,8]) with Relu's rule swapped for ``fn``."""
    monkeypatch.setitem(RULES, "Relu", GradRule("Relu", fn, **flags))
    return gc.grad(gc.load(mlp_model()), "loss")


def test_too_few_gradients_is_an_error_naming_the_op(monkeypatch):
    with pytest.raises(gc.AutodiffError, match=r"gradient rule of Relu \(node 'relu'\) returned 0 gradient\(s\) "
                                               r"for the node's 1 input"):
        _grad_with_relu_rule(monkeypatch, lambda g, node, dy: ())


def test_too_many_gradients_is_an_error_naming_the_op(monkeypatch):
    with pytest.raises(gc.AutodiffError, match=r"Relu \(node 'relu'\) returned 2 gradient\(s\) for the node's 1"):
        _grad_with_relu_rule(monkeypatch, lambda g, node, dy: (dy, dy))


def test_wrong_dtype_is_an_error_naming_op_input_expected_and_got(monkeypatch):
    def float32_grad(g, node, dy):
        return (g.op("Cast", dy, to=int(ir.DataType.FLOAT)),)

    with pytest.raises(gc.AutodiffError, match=r"Relu \(node 'relu'\) returned for input 0 \('h1'\) a gradient of "
                                               r"dtype FLOAT; expected DOUBLE"):
        _grad_with_relu_rule(monkeypatch, float32_grad)


def test_wrong_static_shape_is_an_error_naming_op_input_expected_and_got(monkeypatch):
    def flat_grad(g, node, dy):
        return (g.const(np.zeros(8)),)

    with pytest.raises(gc.AutodiffError, match=r"Relu \(node 'relu'\) returned for input 0 \('h1'\) a gradient of "
                                               r"shape \[8\]; expected \['N', 8\]"):
        _grad_with_relu_rule(monkeypatch, flat_grad)


def test_a_trailing_none_for_an_omitted_optional_input_is_allowed(monkeypatch):
    swapped = _grad_with_relu_rule(monkeypatch, lambda g, node, dy: RULES_BEFORE["Relu"].fn(g, node, dy) + (None,))
    reference = gc.grad(gc.load(mlp_model()), "loss")
    feeds = _feeds()
    got = gc.Session(swapped, backend="numpy").run(feeds)
    want = gc.Session(reference, backend="numpy").run(feeds)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)


def test_the_driver_undoes_broadcasting_for_a_rule_that_declares_it(monkeypatch):
    """A rule that returns the output-shaped gradient for a broadcast input (Add's bias [8] of
    x@W [N,8]) gets it summed by the driver; without declaring it, the shape check catches it."""
    model = gc.load(mlp_model())
    grads = gc.grad(model, "loss", wrt=["fc1.bias"])  # fc1.bias reaches the loss through Add
    out = gc.Session(grads, backend="numpy").run(_feeds())
    assert out["fc1.bias_grad"].shape == (8,)
    monkeypatch.setitem(RULES, "Add", GradRule("Add", RULES_BEFORE["Add"].fn))  # same rule, no broadcast flag
    with pytest.raises(gc.AutodiffError, match=r"gradient rule of Add \(node 'fc1_bias'\) returned for input 1 \('fc1.bias'\) a gradient of "
                                               r"shape \['N', 8\]; expected \[8\]"):
        gc.grad(model, "loss", wrt=["fc1.bias"])


def test_no_rule_undoes_broadcasting_itself():
    rules = sorted(Path(registry.__file__).parent.glob("rules_*.py"))
    assert rules
    offenders = [p.name for p in rules if "sum_to(" in p.read_text()]
    assert offenders == [], f"rules undo broadcasting themselves (the driver does it): {offenders}"


class _ReluNet(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(4, 3, dtype="float64")

    def forward(self, x):
        return {"out": gc.relu(self.fc(x))}


def test_an_error_inside_a_rule_names_the_node_and_its_source_line(monkeypatch):
    # a float32 operand in a float64 rule said only "operand dtypes differ (float vs double)"
    def mixed(g, node, dy):
        return (g.mul(dy, g.const(np.ones(3, np.float32))),)

    monkeypatch.setitem(RULES, "Relu", GradRule("Relu", mixed))
    model = gc.capture(_ReluNet(), x=gc.spec("float64", ("N", 4)))
    with pytest.raises(gc.AutodiffError, match=r"the gradient rule of Relu \(node '[^']*' \(defined at "
                                               r"\S*test_autodiff_rule_checks.py:\d+\)\) failed: operand dtypes differ"):
        gc.grad(model, gc.losses.mse("out", label="y"))
