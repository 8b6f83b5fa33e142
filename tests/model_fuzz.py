"""Seed models and mutations for fuzzing the model loader (tests/test_load_fuzz.py, scripts/fuzz_load.py).

A seed folder holds a model whose tensors sit everywhere a tensor can (initializers, a Constant,
If branches, a model-local function, a sparse initializer), some with external data, plus traps:
a symlink and a hard link to a sentinel file outside the folder. Mutations damage the bytes
(truncation, bit flips) or the protobuf (random external-data keys and values on any tensor).
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SECRET = b"SECRET-OUTSIDE-THE-MODEL-FOLDER!"  # 32 bytes: 8 float32s, a plausible tensor
LOCATIONS = ["w.bin", "c.bin", "link.bin", "hard.bin", "linkdir/secret.bin", "../outside/secret.bin",
             "sub/../w.bin", "./w.bin", "missing.bin", "", "w.bin\x00.txt", "/etc/passwd", ".", "sub",
             "{outside}/secret.bin", "w.bin/", "ü.bin", "\\..\\outside\\secret.bin"]
KEYS = ["location", "offset", "length", "checksum", "basepath", "evil", "__class__", "Location", ""]
NUMBERS = ["0", "8", "16", "24", "32", "-1", "-0", "1e3", "0x10", " 8", "8 ", "+8", "", "99999999999999999999999",
           "18446744073709551615", "3.5", "٣", "nan"]


def _ext(tensor: TensorProto, location: str, offset: int, length: int) -> TensorProto:
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)
    return tensor


def rich_model() -> onnx.ModelProto:
    """y = f(x * w + c) + branch + sparse: every kind of place a tensor can sit."""
    w = _ext(numpy_helper.from_array(np.arange(8, dtype=np.float32), "w"), "w.bin", 0, 32)
    const = helper.make_node("Constant", [], ["c"], name="const",
                             value=_ext(numpy_helper.from_array(np.ones(8, np.float32), "c_value"), "c.bin", 0, 32))
    then_g = helper.make_graph([helper.make_node("Constant", [], ["t"], name="then_c",
                                                 value=numpy_helper.from_array(np.full(8, 2, np.float32), "tv"))],
                               "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [8])])
    else_g = helper.make_graph([helper.make_node("Identity", ["e_init"], ["e"], name="else_id")], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [8])],
                               [_ext(numpy_helper.from_array(np.zeros(8, np.float32), "e_init"), "w.bin", 32, 32)])
    fn = helper.make_function(
        "local", "AddK", ["a"], ["b"],
        [helper.make_node("Constant", [], ["k"], name="fk",
                          value=_ext(numpy_helper.from_array(np.zeros(8, np.float32), "k"), "c.bin", 32, 32)),
         helper.make_node("Add", ["a", "k"], ["b"], name="fadd")],
        [helper.make_opsetid("", 17)])
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.array([5.0], np.float32), "sp"),
                                       numpy_helper.from_array(np.array([3], np.int64), "sp_idx"), [8])
    nodes = [const, helper.make_node("Mul", ["x", "w"], ["xw"], name="mul"),
             helper.make_node("Add", ["xw", "c"], ["xwc"], name="add"),
             helper.make_node("AddK", ["xwc"], ["f"], name="call", domain="local"),
             helper.make_node("If", ["flag"], ["br"], name="if", then_branch=then_g, else_branch=else_g),
             helper.make_node("Add", ["f", "br"], ["fb"], name="add2"),
             helper.make_node("Add", ["fb", "sp"], ["y"], name="add3")]
    graph = helper.make_graph(nodes, "rich", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8]),
                                              helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])], [w],
                              sparse_initializer=[sparse])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                              functions=[fn])
    model.ir_version = 8
    return model


SEEDS = ("rich", "two_layer_net", "cnn", "transformer")


def _seed_bytes(kind: str, model_dir: Path) -> bytes:
    """The model file of a seed: ``rich_model`` or a captured example, saved with external data
    except ``cnn`` (its tensors inline, so bit flips land in dims and raw data too)."""
    if kind == "rich":
        return rich_model().SerializeToString()
    import graphc as gc
    from graphc.models import EXAMPLES

    factory, inputs = EXAMPLES[kind]
    model = gc.capture(factory(), seed=0, **inputs())
    return model.save(model_dir / "m.onnx", external_data=kind != "cnn", size_threshold_bytes=64).read_bytes()


def write_seed(folder: Path, kind: str = "rich") -> Path:
    """``folder/model/m.onnx`` (a seed of ``SEEDS``) with its data files and traps, and the
    sentinel in ``folder/outside``."""
    outside, model_dir = folder / "outside", folder / "model"
    outside.mkdir(parents=True)
    model_dir.mkdir()
    (outside / "secret.bin").write_bytes(SECRET * 4)
    (model_dir / "w.bin").write_bytes(np.arange(8, dtype=np.float32).tobytes() + np.zeros(8, np.float32).tobytes())
    (model_dir / "c.bin").write_bytes(np.ones(8, np.float32).tobytes() + np.zeros(8, np.float32).tobytes())
    (model_dir / "sub").mkdir()
    os.symlink(outside / "secret.bin", model_dir / "link.bin")
    os.symlink(outside, model_dir / "linkdir")
    try:
        os.link(outside / "secret.bin", model_dir / "hard.bin")
    except OSError:  # a file system without hard links: the trap is simply absent
        pass
    path = model_dir / "m.onnx"
    path.write_bytes(_seed_bytes(kind, model_dir))
    return path


def sentinel_ids(folder: Path) -> set[tuple[int, int]]:
    """(device, inode) of every file outside the model folder that must never be opened."""
    info = os.stat(folder / "outside" / "secret.bin")
    return {(info.st_dev, info.st_ino)}


class OpenAudit:
    """Records every ``open`` of a file whose inode is a sentinel's (an audit hook sees Python's
    ``open``/``os.open`` whatever the path: a symlink, a hard link or ``..`` all show up)."""

    _installed: OpenAudit | None = None

    def __init__(self) -> None:
        self.watch: set[tuple[int, int]] = set()
        self.hits: list[str] = []

    @classmethod
    def get(cls) -> OpenAudit:
        if cls._installed is None:  # audit hooks cannot be removed: one per process
            cls._installed = OpenAudit()
            sys.addaudithook(cls._installed._hook)
        return cls._installed

    def _hook(self, event: str, args: tuple) -> None:
        if event != "open" or not self.watch or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        try:
            info = os.stat(args[0])
        except (OSError, ValueError):
            return
        if (info.st_dev, info.st_ino) in self.watch:
            self.hits.append(os.fsdecode(args[0]))


def _choice(rng: random.Random, values: list[str], folder: Path) -> str:
    return rng.choice(values).replace("{outside}", str(folder / "outside"))


def _tensors(graph: onnx.GraphProto | onnx.FunctionProto):
    """The tensors of a graph or function, nested ones included (written apart from graphc's
    own walk, so the fuzzer does not share its blind spots)."""
    if isinstance(graph, onnx.GraphProto):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield from (sparse.values, sparse.indices)
    for node in graph.node:
        for attr in node.attribute:
            yield from ([attr.t] if attr.HasField("t") else []) + list(attr.tensors)
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _tensors(sub)


def mutate_proto(data: bytes, rng: random.Random, folder: Path) -> bytes:
    """Change, add or repeat external-data entries of random tensors, or move a tensor out."""
    proto = onnx.ModelProto()
    proto.ParseFromString(data)
    found = list(_tensors(proto.graph)) + [t for f in proto.functions for t in _tensors(f)]
    for _ in range(rng.randint(1, 3)):
        tensor = rng.choice(found)
        action = rng.randrange(4)
        if action == 0:  # make it external (an inline tensor pointing somewhere)
            tensor.ClearField("raw_data")
            tensor.data_location = TensorProto.EXTERNAL
        if action in (0, 1):
            tensor.external_data.add(key="location", value=_choice(rng, LOCATIONS, folder))
        elif action == 2:
            key = rng.choice(KEYS)
            values = NUMBERS if key in ("offset", "length") else LOCATIONS
            tensor.external_data.add(key=key, value=_choice(rng, values, folder))
        elif tensor.external_data:
            entry = rng.choice(list(tensor.external_data))
            entry.value = _choice(rng, NUMBERS if entry.key in ("offset", "length") else LOCATIONS, folder)
        if rng.random() < 0.3 and len(tensor.external_data) > 1:
            entries = list(tensor.external_data)
            rng.shuffle(entries)
            del tensor.external_data[:]
            tensor.external_data.extend(entries)
    return proto.SerializeToString()


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Truncate, flip bits or overwrite a run of bytes."""
    buf = bytearray(data)
    kind = rng.randrange(3)
    if kind == 0:
        return bytes(buf[:rng.randrange(len(buf))])
    if kind == 1:
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        return bytes(buf)
    start = rng.randrange(len(buf))
    buf[start:start + rng.randint(1, 6)] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
    return bytes(buf)


def mutate(data: bytes, rng: random.Random, folder: Path) -> bytes:
    """One fuzzed model: protobuf-level changes, byte-level damage, or both."""
    kind = rng.randrange(3)
    if kind in (0, 2):
        data = mutate_proto(data, rng, folder)
    if kind in (1, 2):
        data = mutate_bytes(data, rng)
    return data
