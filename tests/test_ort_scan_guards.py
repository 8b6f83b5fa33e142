"""Scans onnxruntime 1.31 runs wrong or dies on, found by the control-flow fuzz
(tests/test_control_flow_fuzz.py), and the session copies that avoid them: a Scan body passing a
state or a scanned input straight out (``distinct_subgraph_outputs``), and a Scan of no steps on a
scanned axis other than 0 whose body declares no output shapes (``backends/scans.py`` with
``with_body_output_shapes``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.model.file import distinct_subgraph_outputs

H = '<ir_version: 9, opset_import: ["" : 18]>\n'
R = np.random.default_rng(5)


def _parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(H + text)
    onnx.checker.check_model(model, full_check=True)
    return model


def _passthrough_scan() -> onnx.ModelProto:
    """Final state ``a`` (the body passes its state out), scan outputs ``xs`` and ``a + xs[t]``."""
    return _parse('''g (float[2] a, float[3,2] xs) => (float[2] s, float[3,2] ys, float[3,2] zs) {
       s, ys, zs = Scan (a, xs) <body: graph = body (float[2] st, float[2] x) => (float[2] st, float[2] x, float[2] y)
           { y = Add(st, x) }, num_scan_inputs: int = 1>
    }''')


@pytest.mark.parametrize("level", ["all", "disable"])
def test_scan_body_passing_its_inputs_straight_out_runs_right(level):
    # onnxruntime gave the final state as zeros or NaN and the passed-through scan output as zeros or -xs
    a, xs = R.standard_normal(2).astype(np.float32), R.standard_normal((3, 2)).astype(np.float32)
    want = {"s": a, "ys": xs, "zs": a + xs}
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(_passthrough_scan(), backend=backend, graph_optimization_level=level).run({"a": a, "xs": xs})
        for k, v in want.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-6, err_msg=f"{backend} {k}")


def test_only_scan_bodies_passing_inputs_out_get_identities():
    fixed = distinct_subgraph_outputs(_passthrough_scan())
    body = fixed.graph.node[0].attribute[0].g
    assert [n.op_type for n in body.node] == ["Add", "Identity", "Identity"]
    assert not {o.name for o in body.output} & {i.name for i in body.input}
    onnx.checker.check_model(fixed, full_check=True)
    # a Loop's body passing its carry straight out runs right on onnxruntime: left as it is
    loop = _parse('''g (float[2] a) => (float[2] out) {
       m = Constant <value = int64 {2}> ()
       out = Loop (m, , a) <body: graph = body (int64 i, bool c, float[2] s) => (bool c, float[2] s) { }>
    }''')
    assert distinct_subgraph_outputs(loop) is loop


def _empty_scan(axis: int) -> onnx.ModelProto:
    """A Scan over axis ``axis`` of ``xs`` whose body declares no shape for its scan output."""
    full = [2, 3]
    full.insert(axis, 0)
    model = _parse(f'''g (float[1] a, float[{",".join(map(str, full))}] xs) => (float[1] s, float[?,?,?] ys) {{
       s, ys = Scan (a, xs) <body: graph = body (float[1] st, float[2,3] x) => (float[1] st2, float[2,3] y)
           {{ st2 = Identity(st)
              y = Neg(x) }}, num_scan_inputs: int = 1, scan_input_axes: ints = [{axis}], scan_output_axes: ints = [2]>
    }}''')
    model.graph.node[0].attribute[0].g.output[1].type.tensor_type.ClearField("shape")
    return model


_RUN = """
import sys, numpy as np, onnx, graphc as gc
model = onnx.load(sys.argv[1])
feeds = {"a": np.ones(1, np.float32), "xs": np.zeros([int(d) for d in sys.argv[2].split(",")], np.float32)}
for level in ("all", "disable"):
    out = gc.Session(model, backend="ort-cpu", graph_optimization_level=level).run(feeds)
    print(level, out["s"].tolist(), out["ys"].shape)
"""


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_scan_of_no_steps_with_undeclared_body_shapes_runs(tmp_path: Path, axis):
    # unguarded (the body's shapes unknown), onnxruntime failed it on axis 0 and killed the
    # process with SIGFPE on axes 1 and 2: run in a child process
    model = _empty_scan(axis)
    onnx.save(model, tmp_path / "m.onnx")
    shape = [2, 3]
    shape.insert(axis, 0)
    done = subprocess.run([sys.executable, "-c", _RUN, str(tmp_path / "m.onnx"), ",".join(map(str, shape))],
                          check=False, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.split("\n")[:2] == [f"{level} [1.0] (2, 3, 0)" for level in ("all", "disable")]
    got = gc.Session(model, backend="numpy").run({"a": np.ones(1, np.float32), "xs": np.zeros(shape, np.float32)})
    assert got["ys"].shape == (2, 3, 0) and got["s"].tolist() == [1.0]


def test_body_output_shapes_come_from_inference_else_the_declared_output():
    from graphc.model.file import with_body_output_shapes

    model = _empty_scan(1)
    inferred = with_body_output_shapes(model).graph.node[0].attribute[0].g.output[1]
    assert [d.dim_value for d in inferred.type.tensor_type.shape.dim] == [2, 3]
    assert not model.graph.node[0].attribute[0].g.output[1].type.tensor_type.HasField("shape")  # not changed
    body = model.graph.node[0].attribute[0].g
    body.node[1].op_type, body.node[1].domain = "Unknown", "custom"  # nothing infers its shape
    model.opset_import.add(domain="custom", version=1)
    model.graph.output[1].type.tensor_type.shape.dim[0].dim_value = 2  # ys declared [2, ?, ?]
    declared = with_body_output_shapes(model).graph.node[0].attribute[0].g.output[1]
    assert [d.dim_value for d in declared.type.tensor_type.shape.dim] == [2, 0]  # less axis 2; 0: unknown
    plain = _passthrough_scan()
    assert with_body_output_shapes(plain) is plain


@pytest.mark.parametrize("level", ["all", "disable"])
def test_scan_body_whose_output_shape_nobody_infers_runs(level):
    # onnxruntime refuses the Scan ("Subgraph must have the shape set for all outputs but st2 did
    # not"): onnx's inference leaves Tanh of a Loop's result unshaped; the state takes the body input's
    model = _parse('''g (float[2] a, float[3,2] xs) => (float[2] s) {
       m = Constant <value = int64 {2}> ()
       c = Loop (m, , a) <body: graph = lb (int64 i, bool k, float[2] v) => (bool k2, float[2] v2) {
           k2 = Identity(k)
           v2 = Neg(v) }>
       s = Scan (a, xs) <body: graph = body (float[2] st, float[2] x) => (float[2] st2) { st2 = Tanh(c) },
           num_scan_inputs: int = 1>
    }''')
    model.graph.node[2].attribute[0].g.output[0].type.tensor_type.ClearField("shape")
    a = R.standard_normal(2).astype(np.float32)
    got = gc.Session(model, backend="ort-cpu", graph_optimization_level=level).run({"a": a, "xs": np.ones((3, 2), np.float32)})
    np.testing.assert_allclose(got["s"], np.tanh(a), rtol=1e-6)


def test_scans_in_an_if_branch_whose_lengths_inference_knows_run_unguarded():
    # guarded, onnxruntime's optimizer folded the guards' Ifs in the branch and lost a value
    # ("Missing Input: s1"): lengths onnx's shape inference knows are left unguarded
    from graphc.backends import scans

    model = _parse('''g (float b, bool p) => (float out) {
       out = If (p) <else_branch: graph = e () => (float o2) { o2 = Identity (b) },
                     then_branch: graph = t () => (float o) {
          k = Constant <value = float[3] {0.25, -0.5, 1.0}> ()
          v = Add (b, k)
          s1 = Scan (v, v) <body: graph = b1 (float[3] st, float x) => (float[3] st2) { st2 = Identity (st) },
                            num_scan_inputs: int = 1>
          o = Scan (b, s1) <body: graph = b2 (float s, float x) => (float y) { y = Add (s, x) }, num_scan_inputs: int = 1>
       }>
    }''')
    assert scans.guard_empty(model) is model
    for p in (True, False):
        got = gc.Session(model, backend="ort-cpu").run({"b": np.float32(0.5), "p": np.array(p)})
        np.testing.assert_allclose(got["out"], 0.5 + (0.75 + 0.0 + 1.5 if p else 0.0), rtol=1e-6)  # b + sum(v)


def _function_scan(body: str) -> onnx.ModelProto:
    """A model calling local function ``f``, which holds a Scan whose body (``body``, output ``st2``
    and scan output ``y``) declares no output shapes."""
    model = onnx.parser.parse_model('<ir_version: 9, opset_import: ["" : 18, "local" : 1]>\n' + '''
    g (float[2] a, float[3,2] xs) => (float[2] s, float[3,2] ys) { s, ys = local.f (a, xs) }
    <domain: "local", opset_import: ["" : 18]>
    f (a, xs) => (s, ys) {
       m = Constant <value = int64 {2}> ()
       c = Loop (m, , a) <body: graph = lb (int64 i, bool k, float[2] v) => (bool k2, float[2] v2) {
           k2 = Identity(k)
           v2 = Neg(v) }>
       s, ys = Scan (a, xs) <body: graph = body (float[2] st, float[2] x) => (st2, y) {''' + body + '''},
           num_scan_inputs: int = 1>
    }''')
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("level", ["all", "disable"])
def test_scan_body_in_a_local_function_gets_its_output_shapes(level):
    # model_graphs builds a function's graphs anew, so the shapes had landed on copies and
    # onnxruntime refused the Scan ("... must have the shape set for all outputs but _inlfunc_f_st2 did not")
    from graphc.model.file import with_body_output_shapes

    model = _function_scan("st2 = Tanh(c)\n y = Mul(x, a)")
    body = with_body_output_shapes(model).functions[0].node[2].attribute[0].g
    # st2: nobody infers it, it takes the body input's; y (of f's input a): inferred with a typed as at f's call
    assert [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in body.output] == [[2], [2]]
    assert not model.functions[0].node[2].attribute[0].g.output[0].type.tensor_type.HasField("shape")
    a, xs = R.standard_normal(2).astype(np.float32), R.standard_normal((3, 2)).astype(np.float32)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend, graph_optimization_level=level).run({"a": a, "xs": xs})
        np.testing.assert_allclose(got["s"], np.tanh(a), rtol=1e-6, err_msg=backend)
        np.testing.assert_allclose(got["ys"], xs * a, rtol=1e-6, err_msg=backend)


def _function_scan_of(axis: int) -> onnx.ModelProto:
    """A model calling local function ``f``, which scans ``xs`` (of a fed length) over ``axis``:
    final state ``a + sum(xs)``, scan output ``xs * a``."""
    xs = "float[N,2]" if axis == 0 else "float[2,N]"
    model = onnx.parser.parse_model('<ir_version: 9, opset_import: ["" : 18, "local" : 1]>\n' + f'''
    g (float[2] a, {xs} xs) => (float[2] s, float[N,2] ys) {{ s, ys = local.f (a, xs) }}
    <domain: "local", opset_import: ["" : 18]>
    f (a, xs) => (s, ys) {{
       s, ys = Scan (a, xs) <body: graph = body (float[2] st, float[2] x) => (float[2] st2, float[2] y) {{
           st2 = Add(st, x)
           y = Mul(x, a) }}, num_scan_inputs: int = 1, scan_input_axes: ints = [{axis}]>
    }}''')
    onnx.checker.check_model(model, full_check=True)
    return model


_RUN_FUNCTION = """
import sys, numpy as np, onnx, graphc as gc
model, axis = onnx.load(sys.argv[1]), int(sys.argv[2])
a = np.array([1.0, 2.0], np.float32)
for n in (0, 3):
    xs = np.arange(2 * n, dtype=np.float32).reshape((n, 2) if axis == 0 else (2, n))
    steps = xs if axis == 0 else xs.T
    for level in ("all", "disable"):
        out = gc.Session(model, backend="ort-cpu", graph_optimization_level=level).run({"a": a, "xs": xs})
        np.testing.assert_allclose(out["s"], a + steps.sum(0))
        np.testing.assert_allclose(out["ys"], (steps * a).reshape(n, 2))
        print(n, level, out["ys"].shape)
"""


@pytest.mark.parametrize("axis", [0, 1])
def test_scan_of_no_steps_in_a_local_function_runs(tmp_path: Path, axis):
    # the guard skipped local functions: onnxruntime failed the Scan ("Invalid dim0_offset of 0")
    # on axis 0 and killed the process with SIGFPE on axis 1: run in a child process
    onnx.save(_function_scan_of(axis), tmp_path / "m.onnx")
    done = subprocess.run([sys.executable, "-c", _RUN_FUNCTION, str(tmp_path / "m.onnx"), str(axis)], check=False,
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.split("\n")[:4] == ["0 all (0, 2)", "0 disable (0, 2)", "3 all (3, 2)", "3 disable (3, 2)"]
    from graphc.backends import scans

    guarded = scans.guard_empty(_function_scan_of(axis))
    assert [n.op_type for n in guarded.functions[0].node][-1] == "If"
    onnx.checker.check_model(guarded, full_check=True)
