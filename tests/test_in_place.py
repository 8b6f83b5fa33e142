"""Carried train_step outputs written into their own input's buffer
(``passes/training/in_place.py``, used by the Trainer on onnxruntime).

Oracles: hand-built graphs whose answer follows from the rule, and the same Trainer run with
every output ping-ponged between two buffers (bit-equal results)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest

import graphc as gc
from backend_params import ORT
from graphc.passes.training.in_place import in_place_outputs
from trainer_models import BNNet, blobs

F = onnx.TensorProto.FLOAT


def graph(nodes, inputs=("x", "g")):
    return oh.make_graph(nodes, "g", [oh.make_tensor_value_info(n, F, [4]) for n in inputs],
                         [oh.make_tensor_value_info("x.next", F, [4]), oh.make_tensor_value_info("y", F, [4])])


def test_in_place_only_when_every_reader_runs_before_the_write():
    chain = [oh.make_node("Mul", ["x", "g"], ["t"]), oh.make_node("Add", ["x", "t"], ["x.next"]),
             oh.make_node("Neg", ["t"], ["y"])]
    assert in_place_outputs(graph(chain), {"x.next": "x"}) == {"x.next"}
    # x is read by a node that does not lead to the write: it may run after it
    late = [*chain[:2], oh.make_node("Neg", ["x"], ["y"])]
    assert in_place_outputs(graph(late), {"x.next": "x"}) == set()
    # ... also through a view of x (Reshape aliases its input)
    shape = oh.make_node("Constant", [], ["s"], value=oh.make_tensor("s", onnx.TensorProto.INT64, [1], [4]))
    view = [shape, oh.make_node("Reshape", ["x", "s"], ["v"]), *chain[:2], oh.make_node("Neg", ["v"], ["y"])]
    assert in_place_outputs(graph(view), {"x.next": "x"}) == set()
    # the writer must be elementwise over x's size
    matmul = [shape, oh.make_node("MatMul", ["x", "g"], ["t"]), oh.make_node("Expand", ["x", "s"], ["x.next"]),
              oh.make_node("Neg", ["t"], ["y"])]
    assert in_place_outputs(graph(matmul), {"x.next": "x"}) == set()
    # a writer that does not read x may be any node once every reader of x runs before it (the
    # Split of a flat group's small params stepped as one)
    split = [oh.make_node("Concat", ["x", "g"], ["xg"], axis=0),
             oh.make_node("Split", ["xg"], ["x.next", "rest"], axis=0), oh.make_node("Neg", ["rest"], ["y"])]
    assert in_place_outputs(graph(split), {"x.next": "x"}) == {"x.next"}
    assert in_place_outputs(graph([*split[:2], oh.make_node("Neg", ["x"], ["y"])]), {"x.next": "x"}) == set()
    # a view's writer is the node that makes what it views: here Neg, which may run before the Shape of x
    late_view = [oh.make_node("Neg", ["g"], ["t"]), oh.make_node("Shape", ["x"], ["xs"]),
                 oh.make_node("Reshape", ["t", "xs"], ["x.next"]), oh.make_node("Neg", ["t"], ["y"])]
    assert in_place_outputs(graph(late_view), {"x.next": "x"}) == set()
    viewed = [oh.make_node("Shape", ["x"], ["xs"]), oh.make_node("Reshape", ["g", "xs"], ["gv"]),
              oh.make_node("Neg", ["gv"], ["t"]), oh.make_node("Reshape", ["t", "xs"], ["x.next"]),
              oh.make_node("Neg", ["t"], ["y"])]
    assert in_place_outputs(graph(viewed), {"x.next": "x"}) == {"x.next"}
    # a Transpose of x is read through: onnxruntime fuses a MatMul of it into a FusedMatMul reading x
    transposed = [oh.make_node("Transpose", ["x"], ["xt"]), oh.make_node("Neg", ["xt"], ["n"]),
                  oh.make_node("Add", ["x", "n"], ["x.next"]), oh.make_node("Neg", ["xt"], ["y"])]
    assert in_place_outputs(graph(transposed), {"x.next": "x"}) == set()


def test_a_linear_weight_whose_forward_the_gradients_do_not_need_trains_in_place_as_in_numpy():
    """``sum(fc(emb(i)))``: the loss's forward MatMul of ``fc.weight``'s Transpose is no ancestor of
    the update (the gradients do not need it), and onnxruntime fuses it into a FusedMatMul reading
    ``fc.weight`` itself, which it ran after the update had written ``fc.weight.next`` into that
    buffer: the step reported -7.36 for -2.50, while its params were right."""
    rng = np.random.default_rng(0)
    indices = np.array([[0, 2, 2, 4], [5, 2, 0, 4]])

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.fc = gc.nn.Embedding(6, 3, dtype="float64"), gc.nn.Linear(3, 1, dtype="float64")

        def forward(self, i):
            return self.fc(self.emb(i)).sum()

    net = Net()
    net.emb.weight = gc.nn.Parameter(rng.normal(size=(6, 3)), dtype="float64")
    arts = gc.training.generate(gc.capture(net, i=indices), "output", gc.optim.SGD(0.125))
    want = [gc.Trainer(arts, backend="numpy").step({"i": indices})]
    trainer = gc.Trainer(arts, backend="ort-cpu")
    assert "fc.weight.next" not in trainer._in_place
    np.testing.assert_allclose(trainer.step({"i": indices}), want[0], rtol=1e-12)


def pointers(trainer):
    """Each carried input with a ``.next`` output -> its buffer's address."""
    return {name: trainer._state[name].data_ptr() for name in trainer._feeds.values()}


@pytest.mark.parametrize("backend", ORT)
@pytest.mark.parametrize("fused", [True, False])
def test_in_place_outputs_keep_their_buffer_and_match_ping_pong(fused, backend):
    model = gc.capture(BNNet(), seed=0, x=gc.spec("float32", ("N", 8)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.Adam(1e-2), fused=fused)
    trainer, reference = gc.Trainer(arts, backend=backend), gc.Trainer(arts, backend=backend)
    reference._in_place = set()  # every output ping-pongs between two buffers
    carried = {out: name for out, name in trainer._feeds.items()}
    in_place = {carried[out] for out in trainer._in_place}
    states = {carried[out] for out in trainer._feeds if ".exp_" in out}
    assert states and states <= in_place
    if not fused:  # fc2.weight's input gradient (to fc1) may run after fc2's own update
        assert "fc2.weight" not in in_place
    before, seen = pointers(trainer), {name: set() for name in carried.values()}
    objects = {name: trainer._state[name] for name in in_place}
    for seed in range(4):
        batch = blobs(16, seed=seed)
        assert trainer.step(batch) == reference.step(batch)
        for name, ptr in pointers(trainer).items():
            seen[name].add(ptr)
    for name in in_place:
        assert trainer._state[name] is objects[name] and seen[name] == {before[name]}, name
    for name in set(carried.values()) - in_place:  # two buffers in turn, none allocated per step
        assert len(seen[name] | {before[name]}) == 2, name
    for name, value in trainer.state_dict().items():
        assert (value == reference.state_dict()[name]).all(), name


class Penalized(gc.nn.Module):
    """``sum(emb(i) @ f(w)) + 0.1 * sum(f(w)**2)``: the penalty's gradient reads ``f(w)``, the
    first term's does not need its MatMul, which onnxruntime makes read ``w`` itself: it drops a
    Cast to w's own dtype and a Mul by 1, and fuses a Mul by a scalar into a FusedMatMul."""

    def __init__(self, f):
        super().__init__()
        self.f, self.emb = f, gc.nn.Embedding(6, 4)
        self.w = gc.nn.Parameter(np.random.default_rng(1).normal(size=(4, 4)).astype(np.float32))

    def forward(self, i):
        c = self.f(self.w)
        return (c * c).sum() * 0.1 + (self.emb(i) @ c).sum()


@pytest.mark.parametrize("f", [lambda w: w.float(), lambda w: w * 1.0, lambda w: w / 1.0, lambda w: w * 0.5],
                         ids=["cast", "mul1", "div1", "scale"])
def test_a_param_onnxruntime_reads_through_an_eliminated_or_fused_node_trains_as_in_ping_pong(f):
    """Judged on our graph, ``w.next`` went into ``w``'s buffer and the loss came out computed
    from the updated ``w`` (cast: -1.209 for -0.777 at the first step); judged on the graph
    onnxruntime runs, it ping-pongs."""
    i = np.array([0, 2, 5])
    arts = gc.training.generate(gc.capture(Penalized(f), seed=0, i=i), "output", gc.optim.SGD(0.1), fused=False)
    trainer, reference = gc.Trainer(arts, backend="ort-cpu"), gc.Trainer(arts, backend="ort-cpu")
    reference._in_place = set()
    numpy = gc.Trainer(arts, backend="numpy")
    for _ in range(3):
        loss = trainer.step({"i": i})
        assert loss == reference.step({"i": i})
        np.testing.assert_allclose(loss, numpy.step({"i": i}), rtol=1e-5)
    for name, value in trainer.state_dict().items():
        assert (value == reference.state_dict()[name]).all(), name


def test_readers_in_subgraphs_count_and_an_optimized_graphs_transposes_are_copies():
    body = oh.make_graph([oh.make_node("Neg", ["x"], ["b"])], "then", [], [oh.make_tensor_value_info("b", F, [4])])
    cond = oh.make_node("Constant", [], ["c"], value=oh.make_tensor("c", onnx.TensorProto.BOOL, [], [True]))
    chain = [oh.make_node("Mul", ["x", "g"], ["t"]), oh.make_node("Add", ["x", "t"], ["x.next"])]
    late_if = [cond, *chain, oh.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)]
    assert in_place_outputs(graph(late_if), {"x.next": "x"}) == set()  # the If reads x after the write
    transposed = [oh.make_node("Transpose", ["x"], ["xt"]), oh.make_node("Neg", ["xt"], ["n"]),
                  oh.make_node("Add", ["x", "n"], ["x.next"]), oh.make_node("Neg", ["xt"], ["y"])]
    assert in_place_outputs(graph(transposed), {"x.next": "x"}) == set()
    assert in_place_outputs(graph(transposed), {"x.next": "x"}, optimized=True) == {"x.next"}


def test_an_omitted_optional_input_or_output_is_no_value_read_or_written():
    """"" is no value: a Clip without min (input "") before a Dropout without mask (output "") is in order.
    Before, "" counted as read by the Clip and written by the later Dropout, and the graph was taken
    for one out of topological order: nothing in place."""
    nodes = [oh.make_node("Clip", ["g", "", "g"], ["gc"]), oh.make_node("Dropout", ["gc"], ["d", ""]),
             oh.make_node("Sub", ["x", "d"], ["x.next"]), oh.make_node("Neg", ["d"], ["y"])]
    assert in_place_outputs(graph(nodes), {"x.next": "x"}) == {"x.next"}
    # the same with the Clip in a subgraph (an If branch) read from the outer scope
    clip = oh.make_graph([nodes[0]], "then", [], [oh.make_tensor_value_info("gc", F, [4])])
    cond = oh.make_node("Constant", [], ["c"], value=oh.make_tensor("c", onnx.TensorProto.BOOL, [], [True]))
    branched = [cond, oh.make_node("If", ["c"], ["gi"], then_branch=clip, else_branch=clip),
                oh.make_node("Dropout", ["gi"], ["d", ""]), *nodes[2:]]
    assert in_place_outputs(graph(branched), {"x.next": "x"}) == {"x.next"}
    late = [*nodes[:3], oh.make_node("Neg", ["x"], ["y"])]  # and a reader of x after the write still counts
    assert in_place_outputs(graph(late), {"x.next": "x"}) == set()
