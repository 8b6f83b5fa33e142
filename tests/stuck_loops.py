"""Loop models whose bodies run no node in onnxruntime 1.31, which checks ``RunOptions.terminate``
only before a node (so a cancelled run of them went through its whole trip count): ``STUCK`` maps
a case to a builder; each model is y = x after n iterations (n and x float32[1] fed)."""

from __future__ import annotations

from onnx import TensorProto, helper

# uncancelled, ~10 s on onnxruntime (0.5 us an iteration of the fastest such body): a run that
# cannot be stopped fails a time check instead of holding a thread for good
LONG_TRIPS = 2 * 10**7


def _model(graph, functions=()):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], functions=list(functions))
    model.ir_version = 8
    return model


def _bool(name, value=True):
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.BOOL, [], [value]))


def _loop(nodes=(), outputs=("c", "v"), n="n", x="x", y="y", scope=""):
    """A Loop node: ``y`` = ``x`` after ``n`` iterations of a body of ``nodes`` whose outputs
    (condition, carry) are ``outputs`` (the body's inputs are i, c and v, after ``scope``)."""
    info = helper.make_tensor_value_info
    body = helper.make_graph(list(nodes), "body", [info(f"{scope}i", TensorProto.INT64, []),
                                                   info(f"{scope}c", TensorProto.BOOL, []),
                                                   info(f"{scope}v", TensorProto.FLOAT, [1])],
                             [info(f"{scope}{outputs[0]}", TensorProto.BOOL, []),
                              info(f"{scope}{outputs[1]}", TensorProto.FLOAT, [1])])
    return helper.make_node("Loop", [n, "go", x], [y], body=body)


def _loop_graph(nodes, functions=()):
    info = helper.make_tensor_value_info
    return _model(helper.make_graph([_bool("go"), *nodes], "loop", [info("n", TensorProto.INT64, []),
                                                                    info("x", TensorProto.FLOAT, [1])],
                                    [info("y", TensorProto.FLOAT, [1])]), functions)


def empty_body_loop():
    """y = x after n iterations of a body with no nodes (its outputs are its inputs)."""
    return _loop_graph([_loop()])


# Loop bodies that run no node in onnxruntime: none, only Constants (initializers at load), nodes
# that read no body input (constant-folded from level basic), an Identity nothing reads (dropped);
# then such bodies under an If's branch, inside another Loop's body, in a local function.
def _nested_in_if():
    info = helper.make_tensor_value_info
    branch = helper.make_graph([_loop(y="y_then")], "then", [], [info("y_then", TensorProto.FLOAT, [1])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["y_else"])], "else", [],
                              [info("y_else", TensorProto.FLOAT, [1])])
    return _loop_graph([helper.make_node("If", ["go"], ["y"], then_branch=branch, else_branch=other)])


def _nested_in_loop():
    """An outer Loop of one iteration whose body runs the empty-body Loop (n iterations) on its carry."""
    once = helper.make_node("Constant", [], ["once"], value=helper.make_tensor("once", TensorProto.INT64, [], [1]))
    return _loop_graph([once, _loop([_loop(x="v", y="w", scope="inner_")], outputs=("c", "w"), n="once")])


def _in_function():
    function = helper.make_function("local", "endless", ["n", "go", "x"], ["y"], [_loop()],
                                    [helper.make_opsetid("", 17)])
    model = _loop_graph([helper.make_node("endless", ["n", "go", "x"], ["y"], domain="local")], [function])
    model.opset_import.append(helper.make_opsetid("local", 1))
    return model


STUCK = {
    "empty": empty_body_loop,
    "constants": lambda: _loop_graph([_loop([_bool("t")], outputs=("t", "v"))]),
    "folded": lambda: _loop_graph([_loop([_bool("f", False), helper.make_node("Not", ["f"], ["t"])],
                                         outputs=("t", "v"))]),
    "unread-identity": lambda: _loop_graph([_loop([helper.make_node("Identity", ["v"], ["u"])])]),
    "in-if": _nested_in_if,
    "in-loop": _nested_in_loop,
    "in-function": _in_function,
}
