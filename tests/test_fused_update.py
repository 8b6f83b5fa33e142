"""The fused optimizer update: params updated a flat group at a time (one per dtype and
weight-decay setting), optimizer state as flat buffers (``passes/training/flat.py``).

Oracles: the per-param update graphs (``fused=False``), ``torch.optim`` (single-tensor path)
when torch is installed, and checkpoints that cross the layout change."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest

import graphc as gc
from backend_params import ORT, options

F, D = onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE
SPECS = [
    gc.optim.SGD(0.05),
    gc.optim.SGD(0.05, momentum=0.9, weight_decay=0.1),
    gc.optim.SGD(0.05, momentum=0.9, nesterov=True, weight_decay=0.1, no_decay=("*.bias",)),
    gc.optim.Adam(0.02, weight_decay=0.05),
    gc.optim.Adam(0.02, betas=(0.8, 0.99), eps=1e-6, no_decay=("head.*",), weight_decay=0.1),
    gc.optim.AdamW(0.02),
    gc.optim.AdamW(0.02, weight_decay=0.2, no_decay=("*.bias", "head.weight")),
]
IDS = [f"{s.kind}-{i}" for i, s in enumerate(SPECS)]
STEPS = 5


def mixed_model(layers: int = 2, seed: int = 0) -> gc.Model:
    """``layers`` float32 Linear+Tanh layers, then a float64 head (Cast between): params of two
    dtypes. x [N, 4] -> ... -> out [N, 2] (double)."""
    rng = np.random.default_rng(seed)
    nodes, inits, h = [], [], "x"
    for i in range(layers):
        inits += [nh.from_array(rng.normal(0, 0.5, (4, 4)).astype(np.float32), f"fc{i}.weight"),
                  nh.from_array(rng.normal(0, 0.1, 4).astype(np.float32), f"fc{i}.bias")]
        nodes += [oh.make_node("Gemm", [h, f"fc{i}.weight", f"fc{i}.bias"], [f"h{i}"], transB=1),
                  oh.make_node("Tanh", [f"h{i}"], [f"a{i}"])]
        h = f"a{i}"
    inits += [nh.from_array(rng.normal(0, 0.5, (2, 4)), "head.weight"), nh.from_array(rng.normal(0, 0.1, 2), "head.bias")]
    nodes += [oh.make_node("Cast", [h], ["hd"], to=D),
              oh.make_node("Gemm", ["hd", "head.weight", "head.bias"], ["out"], transB=1)]
    graph = oh.make_graph(nodes, "mixed", [oh.make_tensor_value_info("x", F, ["N", 4])],
                          [oh.make_tensor_value_info("out", D, ["N", 2])], inits)
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    onnx.checker.check_model(proto, full_check=True)
    return gc.load(proto)


def batches(n=STEPS, size=6):
    rng = np.random.default_rng(1)
    return [{"x": rng.normal(size=(size, 4)).astype(np.float32), "y": rng.normal(size=(size, 2))} for _ in range(n)]


def generate(spec, fused=True, frozen=(), **kw):
    return gc.training.generate(mixed_model(**kw), gc.losses.mse("out", label="y"), spec, fused=fused, frozen=frozen)


# ``flat``'s thresholds for the layouts the tests compare (the fc weights are 16 elements, the
# biases 4, the head's 8 and 2): every param in its group's small tail (the defaults); the fc
# weights stepped on their own in a shared group; the fc weights each a group of its own
LAYOUTS = {"small-tails": {}, "weights-large": {"SMALL_ELEMENTS": 10}, "weights-alone": {"ALONE_ELEMENTS": 16}}


def generate_laid_out(spec, layout, monkeypatch, **kw):
    """``generate`` with ``LAYOUTS[layout]``'s thresholds (``"per-param"``: ``fused=False``)."""
    from graphc.passes.training import flat

    with monkeypatch.context() as patched:
        for name, value in LAYOUTS.get(layout, {}).items():
            patched.setattr(flat, name, value)
        return generate(spec, fused=layout != "per-param", **kw)


def run(arts, backend, data=None):
    trainer = gc.Trainer(arts, backend=backend, **options(backend))
    return [trainer.step(b) for b in data or batches()], trainer.state_dict()


def test_layout_groups_by_dtype_and_decay():
    arts = generate(gc.optim.AdamW(0.01, no_decay=("*.bias",)))
    layout = {b.name: b for b in arts.manifest.layout}
    assert sorted(layout) == ["params.float32", "params.float32.no_decay", "params.float64", "params.float64.no_decay"]
    assert layout["params.float32"].params == ["fc0.weight", "fc1.weight"] and layout["params.float32"].weight_decay
    assert layout["params.float64.no_decay"].params == ["head.bias"] and not layout["params.float64.no_decay"].weight_decay
    inputs = {e.name: e for e in arts.manifest.graphs["train_step"].inputs}
    # params keep their names (the graphs read them as they are); their state is flat
    assert inputs["fc0.weight"].role == "param" and arts.manifest.feeds["fc0.weight.next"] == "fc0.weight"
    assert inputs["params.float32.exp_sum"].shape == [32] and inputs["params.float64.exp_sum"].dtype == "float64"
    assert inputs["params.float32.exp_sum_sq"].role == "state" and "fc0.weight.exp_sum" not in inputs
    assert arts.manifest.feeds["params.float32.exp_sum.next"] == "params.float32.exp_sum"
    assert {e.name for e in arts.manifest.graphs["eval"].inputs} >= {"fc0.weight", "head.bias"}
    packed = arts.manifest.pack(arts.state)
    assert packed.keys() >= {"fc0.weight", "params.float32.exp_sum", "step"} and "fc0.weight.exp_sum" not in packed
    unpacked = arts.manifest.unpack(packed)
    assert unpacked.keys() == arts.state.keys()
    for name, value in arts.state.items():
        assert unpacked[name].dtype == value.dtype and np.array_equal(unpacked[name], value), name
    for key, model in arts.graphs.items():
        onnx.checker.check_model(model.proto, full_check=True)


def test_pack_can_consume_the_pieces_it_packs():
    arts = generate(gc.optim.AdamW(0.01, no_decay=("*.bias",)))
    expected = arts.manifest.pack(arts.state)
    given = dict(arts.state)
    packed = arts.manifest.pack(given, consume=True)
    assert packed is given  # the pieces are dropped from it as they are packed, not copied first
    assert packed.keys() == expected.keys() and "fc0.weight.exp_sum" not in given
    for name, value in expected.items():
        assert np.array_equal(packed[name], value), name
    assert len(arts.state) > len(packed)  # the artifacts' own dict is untouched


def test_update_node_count_does_not_grow_with_the_number_of_params():
    def update_nodes(layers):
        arts = generate(gc.optim.AdamW(0.01), layers=layers)
        names = [n.name for n in arts.train_step.proto.graph.node]
        return sum(n.startswith("optim/") and not n.startswith("optim/flat/") for n in names)

    assert update_nodes(2) == update_nodes(8)
    per_param = generate(gc.optim.AdamW(0.01), fused=False, layers=8).train_step.proto.graph.node
    assert sum(n.name.startswith("optim/") for n in per_param) > 3 * update_nodes(8)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_large_params_step_as_fed_small_ones_as_one(spec, monkeypatch):
    """A param of ``SMALL_ELEMENTS`` or more: ``<param>.next`` computed from the param as fed (no
    Concat of the params, no Split of new flat params). A group's smaller params (two or more):
    laid out last, their step one piece of the step's Split (not its pieces concatenated again),
    one Sub over their concatenation, split back. Beyond those only SGD's and Adam's L2 weight
    decay reads the flat params. Either way the same numbers as the per-param update."""
    from graphc.passes.training import flat

    monkeypatch.setattr(flat, "SMALL_ELEMENTS", 10)  # fc weights are 16 elements, biases 4, the head's 8 and 2
    arts = generate(spec)
    graph, params = arts.train_step.proto.graph, set(arts.manifest.trainable)
    producers = {o: n for n in graph.node for o in n.output}
    tails = {p for g in arts.manifest.layout for p, shape in zip(g.params, g.shapes)
             if np.prod(shape) < 10 and sum(np.prod(s) < 10 for s in g.shapes) > 1}
    # with no_decay=("*.bias",) the head's weight and bias are groups of one each
    assert tails == {"fc0.bias", "fc1.bias"} | (set() if spec.no_decay == ("*.bias",) else {"head.weight", "head.bias"})
    for g in arts.manifest.layout:
        small = [np.prod(shape) < 10 for shape in g.shapes]
        assert small == sorted(small), (g.name, g.params)  # the small ones last
    assert not [n.name for n in graph.node if n.op_type == "Concat"
                and any(i in producers and producers[i].op_type == "Split" for i in n.input)]

    def source(value, through=("Reshape", "Mul")):  # AdamW's p * (1 - lr*wd), a param's Reshape
        while value in producers and producers[value].op_type in through:
            value = producers[value].input[0]
        return value

    for p in params:
        node = producers[f"{p}.next"]
        if p in tails:
            node = producers[source(node.output[0], ("Reshape",))]
            assert node.op_type == "Split", p
            node = producers[node.input[0]]
            assert node.op_type == "Sub" and producers[source(node.input[0])].op_type == "Concat", p
        else:
            assert node.op_type == "Sub" and source(node.input[0]) == p, p
    concats = [n for n in graph.node if n.op_type == "Concat" and n.name.startswith("optim/")]
    read = [n for n in concats if any(producers[i].input[0] in params - tails for i in n.input if i in producers)]
    assert bool(read) == (spec.kind != "adamw" and bool(spec.weight_decay))
    _equal_runs(run(arts, "numpy"), run(generate(spec, fused=False), "numpy"), 0)


def test_small_params_laid_out_before_are_gathered_again(monkeypatch):
    """A layout from before ``plan`` put a group's small params last (a saved manifest's, as
    ``update_model`` rebuilds it): their step's pieces are concatenated again; the same numbers
    as the layout of today and the per-param update."""
    from graphc.passes.training import flat

    spec = gc.optim.AdamW(0.02, weight_decay=0.1)
    monkeypatch.setattr(flat, "SMALL_ELEMENTS", 10)  # fc weights are 16 elements, biases 4
    today = generate(spec)
    planned = flat.plan

    def first_appearance(graph, params, decays):
        groups = planned(graph, params, decays)
        for g in groups:
            laid = sorted(zip(g.params, g.shapes), key=lambda ps: params.index(ps[0]))
            g.params, g.shapes = [p for p, _ in laid], [shape for _, shape in laid]
        return groups

    monkeypatch.setattr(flat, "plan", first_appearance)
    before = generate(spec)
    assert before.manifest.layout[0].params == ["fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias"]
    assert today.manifest.layout[0].params == ["fc0.weight", "fc1.weight", "fc0.bias", "fc1.bias"]
    graph = before.train_step.proto.graph
    producers = {o: n for n in graph.node for o in n.output}
    assert [n.name for n in graph.node if n.op_type == "Concat"
            and any(i in producers and producers[i].op_type == "Split" for i in n.input)]
    _equal_runs(run(before, "numpy"), run(today, "numpy"), 0)
    _equal_runs(run(before, "numpy"), run(generate(spec, fused=False), "numpy"), 0)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_fused_equals_the_per_param_update(spec):
    fused, per_param = generate(spec), generate(spec, fused=False)
    # every param is under SMALL_ELEMENTS: the group's step is applied to its params as one, never
    # split into pieces only to be concatenated back
    graph = fused.train_step.proto.graph
    producers = {o: n for n in graph.node for o in n.output}
    assert not [n.name for n in graph.node if n.op_type == "Concat"
                and any(i in producers and producers[i].op_type == "Split" for i in n.input)]
    # numpy: the same elementwise ops on the same values, so the same bits
    _equal_runs(run(fused, "numpy"), run(per_param, "numpy"), 0)
    _equal_runs(run(fused, "ort-cpu"), run(per_param, "ort-cpu"), 1e-6)


def _equal_runs(a, b, rtol):
    np.testing.assert_allclose(a[0], b[0], rtol=rtol, atol=0)
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        np.testing.assert_allclose(a[1][name], b[1][name], rtol=rtol, atol=rtol * 1e-2, err_msg=name)


@pytest.mark.parametrize("backend", ORT)
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_fused_matches_torch_optim(spec, backend, layout, monkeypatch):
    """Against torch.optim's single-tensor step, in each of ``LAYOUTS``."""
    torch = pytest.importorskip("torch")
    from fnmatch import fnmatchcase

    arts = generate_laid_out(spec, layout, monkeypatch, frozen=["fc1.bias"])
    assert "fc1.bias" in arts.manifest.frozen
    losses, state = run(arts, backend)
    initial = {**arts.inference.params, **arts.state}
    params = {n: torch.nn.Parameter(torch.from_numpy(np.array(initial[n]))) for n in [*arts.manifest.trainable, "fc1.bias"]}
    params["fc1.bias"].requires_grad_(False)
    trained = arts.manifest.trainable
    hyper = {k: v for k, v in spec.model_dump().items() if k not in ("kind", "no_decay")}
    groups = [{"params": [params[n] for n in trained if any(fnmatchcase(n, p) for p in spec.no_decay)], "weight_decay": 0.0},
              {"params": [params[n] for n in trained if not any(fnmatchcase(n, p) for p in spec.no_decay)]}]
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[spec.kind]
    opt = cls([g for g in groups if g["params"]], foreach=False, **hyper)
    expected = []
    for b in batches():
        h = torch.from_numpy(b["x"])
        for i in range(2):
            h = torch.tanh(h @ params[f"fc{i}.weight"].T + params[f"fc{i}.bias"])
        out = h.double() @ params["head.weight"].T + params["head.bias"]
        loss = torch.mean((out - torch.from_numpy(b["y"])) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        expected.append(loss.item())
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    for name in trained:
        np.testing.assert_allclose(state[name], params[name].detach().numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
    assert "fc1.bias" not in state  # frozen: an initializer of the graphs, never updated


@pytest.mark.parametrize("backend", ["numpy", *ORT])
@pytest.mark.parametrize("layouts", [("small-tails", "per-param"), ("per-param", "small-tails"),
                                     ("weights-alone", "small-tails"), ("small-tails", "weights-alone")],
                         ids=lambda pair: "-then-".join(pair))
def test_checkpoints_cross_the_layout_change(tmp_path, backend, layouts, monkeypatch):
    spec = gc.optim.AdamW(0.02, no_decay=("*.bias",))
    data = batches(6)
    straight_losses, straight = run(generate_laid_out(spec, layouts[0], monkeypatch), backend, data)
    first = gc.Trainer(generate_laid_out(spec, layouts[0], monkeypatch), backend=backend, **options(backend))
    losses = [first.step(b) for b in data[:3]]
    first.save_checkpoint(tmp_path / "ck.safetensors")
    second = gc.Trainer(generate_laid_out(spec, layouts[1], monkeypatch), backend=backend, **options(backend))
    second.load_checkpoint(tmp_path / "ck.safetensors")
    losses += [second.step(b) for b in data[3:]]
    # the per-param names are the checkpoint's, whatever the layout; numpy replays bit for bit
    np.testing.assert_allclose(losses, straight_losses, rtol=0 if backend == "numpy" else 1e-6)
    resumed = second.state_dict()
    assert resumed.keys() == straight.keys()
    for name, value in straight.items():
        np.testing.assert_allclose(resumed[name], value, rtol=0 if backend == "numpy" else 1e-5, err_msg=name)


@pytest.mark.parametrize("backend", ORT)
def test_ort_trainer_allocates_no_new_param_buffers_per_step(backend):
    """Each step writes into the buffers the step before read (two sets used in turn), or, for
    an output written in place (``passes/training/in_place.py``), into its input's own buffer;
    on the GPU all of them device memory."""
    trainer = gc.Trainer(generate(gc.optim.Adam(0.01)), backend=backend)
    seen: dict[str, set[int]] = {}
    for b in batches(8):
        trainer.step(b)
        for name, handle in trainer._state.items():
            seen.setdefault(name, set()).add(handle.data_ptr())
            assert handle.device_name().lower() == trainer._train.device, name
    carried = set(trainer.manifest.feeds.values())
    assert carried == {*trainer.manifest.trainable, "params.float32.exp_sum", "params.float32.exp_sum_sq",
                       "params.float64.exp_sum", "params.float64.exp_sum_sq", "step"}
    in_place = {trainer.manifest.feeds[out] for out in trainer._in_place}
    assert {"params.float32.exp_sum", "params.float32.exp_sum_sq"} <= in_place
    for name in carried:
        assert len(seen[name]) == (1 if name in in_place else 2), (name, len(seen[name]))
    assert len(seen["lr"]) == 1


def test_no_decay_pattern_matching_nothing_is_an_error():
    with pytest.raises(gc.GraphError, match=r"no_decay pattern\(s\) \['\*norm\*'\] match no trainable param"):
        generate(gc.optim.AdamW(0.01, no_decay=("*norm*",)))


def test_groups_are_chunked_and_chunking_changes_no_number(monkeypatch):
    """Groups close before ``CHUNK_ELEMENTS``; a param larger than that gets one of its own."""
    from graphc.passes.training import flat

    monkeypatch.setattr(flat, "CHUNK_ELEMENTS", 20)  # fc weights are 16 elements, biases 4
    spec = gc.optim.AdamW(0.02, weight_decay=0.1)
    chunked = generate(spec, layers=3)
    groups = [(b.name, b.params) for b in chunked.manifest.layout]
    assert groups == [("params.float32", ["fc0.weight", "fc0.bias"]), ("params.float32.1", ["fc1.weight", "fc1.bias"]),
                      ("params.float32.2", ["fc2.weight", "fc2.bias"]), ("params.float64", ["head.weight", "head.bias"])]
    _equal_runs(run(chunked, "numpy"), run(generate(spec, fused=False, layers=3), "numpy"), 0)


def test_large_params_get_groups_of_their_own(monkeypatch):
    """A param of ``ALONE_ELEMENTS`` or more is a group of its own, the small params filling
    theirs around it: the chain reads its gradient as it comes and its step is applied as it
    leaves, no Concat or Split on the way. Same numbers as the per-param update."""
    spec = gc.optim.AdamW(0.02, weight_decay=0.1)
    arts = generate_laid_out(spec, "weights-alone", monkeypatch, layers=3)
    assert [(b.name, b.params) for b in arts.manifest.layout] == [
        ("params.float32", ["fc0.weight"]), ("params.float32.1", ["fc0.bias", "fc1.bias", "fc2.bias"]),
        ("params.float32.2", ["fc1.weight"]), ("params.float32.3", ["fc2.weight"]),
        ("params.float64", ["head.weight", "head.bias"])]
    graph = arts.train_step.proto.graph
    producers = {o: n for n in graph.node for o in n.output}

    def update_ops(output):  # the op types of the optim/ nodes ``output`` is computed from
        ops, todo, seen = set(), [output], set()
        while todo:
            node = producers.get(todo.pop())
            if node is not None and node.name.startswith("optim/") and node.name not in seen:
                seen.add(node.name)
                ops.add(node.op_type)
                todo += list(node.input)
        return ops

    for i, group in [(0, "params.float32"), (1, "params.float32.2"), (2, "params.float32.3")]:
        for output in (f"fc{i}.weight.next", f"{group}.exp_sum.next", f"{group}.exp_sum_sq.next"):
            ops = update_ops(output)
            assert {"Add", "Mul"} <= ops and not ops & {"Concat", "Split"}, (output, ops)
    assert {"Concat", "Split"} <= update_ops("fc1.bias.next")
    _equal_runs(run(arts, "numpy"), run(generate(spec, fused=False, layers=3), "numpy"), 0)
    _equal_runs(run(arts, "ort-cpu"), run(generate(spec, fused=False, layers=3), "ort-cpu"), 1e-6)
