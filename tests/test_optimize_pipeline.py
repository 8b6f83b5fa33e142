"""The pass runner: fixed point, per-pass records, interface guard."""

from __future__ import annotations

import onnx_ir as ir
import pytest
from onnx import helper

from graphc.passes.optimize import LEVELS, OptimizeReport, Pipeline, PipelineError, build_pipeline, optimize_in_place
from optimize_util import F, make_model


def _model():
    nodes = [helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    return make_model(nodes, [("x", F, ["N", 4])], [("y", F, ["N", 4])]).ir


class DropOneIdentity(ir.passes.InPlacePass):
    """Removes one Identity per run, so reaching the fixed point takes several rounds."""

    name = "DropOneIdentity"

    def call(self, model):
        for node in model.graph:
            if node.op_type == "Identity":
                ir.convenience.replace_all_uses_with(node.outputs[0], node.inputs[0])
                model.graph.remove(node, safe=True)
                return ir.passes.PassResult(model, True)
        return ir.passes.PassResult(model, False)


class RenameOutput(ir.passes.InPlacePass):
    name = "RenameOutput"

    def call(self, model):
        model.graph.outputs[0].name = "renamed"
        return ir.passes.PassResult(model, True)


def test_runs_to_fixed_point_and_records_each_run():
    model, report = _model(), OptimizeReport(level=1)
    Pipeline([DropOneIdentity()]).run(model, report)
    assert [n.op_type for n in model.graph] == ["Relu"]
    assert report.rounds == 3 and report.nodes_before == 3 and report.nodes_after == 1
    assert [(r.nodes_before, r.nodes_after, r.modified) for r in report.records] == [(3, 2, True), (2, 1, True), (1, 1, False)]
    assert report.by_pass() == [{"pass": "DropOneIdentity", "runs": 3, "modified": 2, "nodes_removed": 2,
                                 "seconds": pytest.approx(sum(r.seconds for r in report.records))}]
    assert "3 -> 1 nodes" in str(report)


def test_max_rounds_bounds_the_loop():
    model, report = _model(), OptimizeReport(level=1)
    Pipeline([DropOneIdentity()], max_rounds=1).run(model, report)
    assert report.rounds == 1 and len(model.graph) == 2


def test_pass_renaming_an_output_is_caught_and_named():
    with pytest.raises(PipelineError, match="pass RenameOutput changed the graph interface"):
        Pipeline([RenameOutput()]).run(_model(), OptimizeReport(level=1))


def test_levels_table_and_pipelines():
    assert sorted(LEVELS) == [0, 1, 2, 3]
    names = {level: build_pipeline(level, 21).pass_names for level in LEVELS}
    assert names[0] == []
    assert set(names[1]) < set(names[2]) < set(names[3])
    assert "InferenceRewrites" in names[3] and "InferenceRewrites" not in names[2]
    assert "GeluFusion" in build_pipeline(2, 20).pass_names and "GeluFusion" not in build_pipeline(2, 19).pass_names
    with pytest.raises(ValueError, match="level must be one of"):
        build_pipeline(4, 21)


def test_optimize_in_place_restores_declared_output_shape():
    model = _model()
    model.graph.outputs[0].shape = ir.Shape(["N", 4])
    optimize_in_place(model, 2)
    assert [str(d) for d in model.graph.outputs[0].shape] == ["N", "4"]


@pytest.mark.parametrize("level", [2, 3])
def test_optimize_of_the_transformer_train_step_is_a_fixed_point(level):
    """A second ``gc.optimize`` changes nothing: the finish's constants lifted to initializers (and deduplicated)
    let CSE merge 6 Reshapes and the algebraic pass 2 more, which the first run left to a second one."""
    import collections

    import graphc as gc
    from graphc.models import EXAMPLES

    factory, inputs = EXAMPLES["transformer"]
    arts = gc.training.generate(gc.capture(factory(), **inputs(), training=True),
                                gc.losses.cross_entropy("output", label="y"), gc.optim.Adam(1e-2))
    ops = lambda m: collections.Counter(n.op_type for n in m.proto.graph.node)
    once = gc.optimize(arts.train_step, level)
    assert ops(gc.optimize(once, level)) == ops(once)
