"""gc.nn containers and module state: PyTorch's state_dict keys for a nested tree of lists and
dicts, load_state_dict (strict errors, shape mismatches, a safetensors file), train()/eval() at
capture, and plain Python lists of layers refused."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

import graphc as gc
from graphc import nn
try:
    from dsl_util import run_ort
except ImportError:  # tests/ collected as a package
    from tests.dsl_util import run_ort

# the module tree below, written once for graphc and once for torch.nn
TREE_KEYS = [
    "stem.weight", "stem.bias",
    "blocks.0.0.weight", "blocks.0.0.bias", "blocks.0.1.weight", "blocks.0.1.bias", "blocks.0.1.running_mean",
    "blocks.0.1.running_var", "blocks.0.1.num_batches_tracked",
    "blocks.1.0.weight", "blocks.1.0.bias", "blocks.1.1.weight", "blocks.1.1.bias", "blocks.1.1.running_mean",
    "blocks.1.1.running_var", "blocks.1.1.num_batches_tracked",
    "heads.cls.weight", "heads.cls.bias", "heads.reg.0.weight", "heads.reg.0.bias",
    "scales.0", "scales.1",
]


def _tree(lib, arrays=None):
    """The same nested module in ``gc.nn`` or ``torch.nn`` (lib): Linear, a ModuleList of
    Sequentials with BatchNorm, a ModuleDict holding a Sequential with Identity, a ParameterList."""
    mod = lib.nn

    def param(i):
        value = np.full(6, 1.0 + i, np.float32)
        return mod.Parameter(value if lib is gc else arrays(value))

    class Tree(mod.Module):
        def __init__(self):
            super().__init__()
            self.stem = mod.Linear(4, 6)
            self.blocks = mod.ModuleList([mod.Sequential(mod.Linear(6, 6), mod.BatchNorm1d(6)) for _ in range(2)])
            self.heads = mod.ModuleDict({"cls": mod.Linear(6, 3),
                                         "reg": mod.Sequential(mod.Linear(6, 1), mod.Identity())})
            self.scales = mod.ParameterList([param(0), param(1)])

        def forward(self, x):
            x = self.stem(x)
            for block, scale in zip(self.blocks, self.scales):
                x = lib.relu(block(x)) * scale
            return self.heads["cls"](x), self.heads["reg"](x)

    return Tree()


def test_state_dict_keys_are_pytorchs_for_lists_and_dicts():
    tree = _tree(gc)
    assert list(tree.state_dict()) == TREE_KEYS
    assert [n for n, _ in tree.named_parameters()] == [k for k in TREE_KEYS if "running" not in k
                                                       and "num_batches" not in k]
    assert [n for n, _ in tree.named_buffers()] == [k for k in TREE_KEYS if "running" in k or "num_batches" in k]
    assert [n for n, _ in tree.named_modules()][:6] == ["", "stem", "blocks", "blocks.0", "blocks.0.0", "blocks.0.1"]
    model = gc.capture(tree, x=gc.spec("float32", ("N", 4)))
    used = {k for k in TREE_KEYS if "num_batches" not in k}
    assert set(model.ir.graph.initializers) == used


def test_state_dict_keys_and_outputs_match_torch():
    torch = pytest.importorskip("torch")
    ours, theirs = _tree(gc), _tree(torch, torch.from_numpy)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    theirs.eval()
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    out = run_ort(gc.capture(ours, x=gc.spec("float32", ("N", 4))), {"x": x})
    with torch.no_grad():
        cls, reg = theirs(torch.from_numpy(x))
    np.testing.assert_allclose(out["output_0"], cls.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["output_1"], reg.numpy(), rtol=1e-5, atol=1e-6)


def test_load_state_dict_from_a_safetensors_file(tmp_path):
    from safetensors.numpy import load_file, save_file

    src, dst = _tree(gc), _tree(gc)
    src.init_parameters(seed=3)
    save_file(src.state_dict(), tmp_path / "tree.safetensors")
    result = dst.load_state_dict(load_file(tmp_path / "tree.safetensors"))
    assert result.missing_keys == [] and result.unexpected_keys == []
    for key, value in src.state_dict().items():
        np.testing.assert_array_equal(dst.state_dict()[key], value)


def test_load_state_dict_strict_names_missing_and_unexpected_keys():
    tree = _tree(gc)
    state = tree.state_dict()
    before = state["stem.weight"].copy()
    bad = {**{k: v for k, v in state.items() if k != "heads.cls.bias"}, "heads.cls.b": state["heads.cls.bias"],
           "stem.weight": np.zeros_like(before)}
    with pytest.raises(gc.GraphError, match=r"missing keys \['heads.cls.bias'\]; unexpected keys \['heads.cls.b'\]"):
        tree.load_state_dict(bad)
    np.testing.assert_array_equal(tree.state_dict()["stem.weight"], before)  # nothing was set
    result = tree.load_state_dict(bad, strict=False)
    assert (result.missing_keys, result.unexpected_keys) == (["heads.cls.bias"], ["heads.cls.b"])
    assert (tree.state_dict()["stem.weight"] == 0).all()


def test_load_state_dict_refuses_a_shape_mismatch_in_either_mode():
    tree = _tree(gc)
    state = {**tree.state_dict(), "stem.weight": np.zeros((4, 6), np.float32)}
    for strict in (True, False):
        with pytest.raises(gc.GraphError, match=r"size mismatch for stem.weight: the module has \(6, 4\), "
                                                r"the state \(4, 6\)"):
            tree.load_state_dict(state, strict=strict)


def test_a_tied_weight_is_under_both_keys_and_one_initializer():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.out = nn.Linear(4, 10, bias=False)
            self.out.weight = self.emb.weight

        def forward(self, ids):
            return self.out(self.emb(ids))

    net = Tied()
    assert list(net.state_dict()) == ["emb.weight", "out.weight"]
    assert [n for n, _ in net.named_parameters()] == ["emb.weight"]
    model = gc.capture(net, ids=gc.spec("int64", ("N",)))
    assert list(model.ir.graph.initializers) == ["emb.weight"]


def test_sequential_and_module_list_index_slice_and_iterate():
    layers = [nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2)]
    seq = nn.Sequential(*layers)
    assert len(seq) == 3 and seq[-1] is layers[2] and list(seq) == layers
    head = seq[:2]
    assert isinstance(head, nn.Sequential) and list(head) == layers[:2]
    named = nn.Sequential(OrderedDict(fc=nn.Linear(3, 3), act=nn.ReLU()))
    assert [n for n, _ in named.named_parameters()] == ["fc.weight", "fc.bias"]
    mlist = nn.ModuleList(layers[:1])
    mlist.append(layers[1])
    mlist.insert(0, layers[2])
    assert list(mlist) == [layers[2], layers[0], layers[1]]
    assert list(mlist.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    with pytest.raises(IndexError, match="index 3 is out of range for a ModuleList of length 3"):
        mlist[3]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    model = gc.capture(seq[:2], x=x)
    p = model.params
    np.testing.assert_allclose(run_ort(model, {"x": x})["output"], np.maximum(x @ p["0.weight"].T + p["0.bias"], 0),
                               rtol=1e-6)


@pytest.mark.parametrize("container, fix", [(list, "ModuleList"), (tuple, "ModuleList"), (dict, "ModuleDict")])
def test_a_plain_python_container_of_layers_is_refused(container, fix):
    layers = [nn.Linear(2, 2), nn.Linear(2, 2)]
    value = dict(enumerate(layers)) if container is dict else container(layers)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = value  # the line the error names

    with pytest.raises(gc.GraphError, match=rf"Net.layers is a plain {container.__name__} holding Linear.*"
                                            rf"Use gc.nn.{fix}\(...\) \(at .*test_nn_containers.py:\d+\)"):
        Net()


def test_a_layer_appended_to_a_plain_list_warns_at_capture():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = []
            self.layers.append(nn.Linear(2, 2))

        def forward(self, x):
            return self.layers[0](x)

    with pytest.warns(UserWarning, match="Linear.weight is used in forward but its module is not a registered"):
        gc.capture(Net(), x=gc.spec("float32", ("N", 2)))


def _ops(model) -> list[tuple[str, int]]:
    """(op, training_mode) for the Dropout and BatchNormalization nodes."""
    out = []
    for node in model.ir.graph:
        if node.op_type == "BatchNormalization":
            out.append((node.op_type, node.attributes.get_int("training_mode", 0)))
        elif node.op_type == "Dropout":
            out.append((node.op_type, int(node.inputs[2].producer().attributes["value"].value.numpy())))
    return out


def test_train_and_eval_decide_how_dropout_and_batchnorm_are_captured():
    net = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Dropout(0.5))
    spec = gc.spec("float32", ("N", 3))
    assert not net.training  # graphc modules start in eval mode
    assert _ops(gc.capture(net, x=spec)) == [("BatchNormalization", 0), ("Dropout", 0)]
    net.train()
    assert all(m.training for m in net.modules())
    assert _ops(gc.capture(net, x=spec)) == [("BatchNormalization", 1), ("Dropout", 1)]
    net[1].eval()  # frozen BatchNorm while the rest trains, as in PyTorch
    assert _ops(gc.capture(net, x=spec)) == [("BatchNormalization", 0), ("Dropout", 1)]
    # an explicit training= holds for that capture only
    assert _ops(gc.capture(net, x=spec, training=False)) == [("BatchNormalization", 0), ("Dropout", 0)]
    assert [m.training for m in net.modules()] == [True, True, False, True]
    net.eval()
    assert _ops(gc.capture(net, x=spec, training=True)) == [("BatchNormalization", 1), ("Dropout", 1)]
    assert not any(m.training for m in net.modules())
