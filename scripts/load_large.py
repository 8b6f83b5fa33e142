"""Load and run a model whose external data is over protobuf's 2 GiB limit (by hand; needs
about 3x the size in free memory and once the size on disk).

    .venv/bin/python scripts/load_large.py --gib 2.1 [--backends numpy,ort-cpu]

Writes ``model.onnx`` + ``model.onnx.data`` (one float32 initializer ``w``) to a temp folder,
then times ``gc.load`` (checked from its path) and a ``Session`` per backend running
``y = Gather(w, idx)``, checking the gathered values against the data written.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

import graphc as gc


def write_model(folder: Path, count: int) -> Path:
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[count])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "model.onnx.data"), ("offset", "0"), ("length", str(count * 4))):
        w.external_data.add(key=key, value=value)
    graph = helper.make_graph([helper.make_node("Gather", ["w", "idx"], ["y"], name="gather")], "large",
                              [helper.make_tensor_value_info("idx", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = np.memmap(folder / "model.onnx.data", dtype=np.float32, mode="w+", shape=(count,))
    for start in range(0, count, 1 << 26):  # value i at position i (exact in float32 below 2**24 only,
        stop = min(count, start + (1 << 26))  # so the check compares float32(i))
        data[start:stop] = np.arange(start, stop, dtype=np.float64)
    data.flush()
    del data
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    return folder / "model.onnx"


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.1)
    parser.add_argument("--backends", default="numpy,ort-cpu")
    args = parser.parse_args()
    count = int(args.gib * 2**30) // 4
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        path = write_model(Path(tmp), count)
        print(f"{path.stat().st_size} + {count * 4:,} bytes of external data")
        start = time.perf_counter()
        model = gc.load(path)
        print(f"gc.load: {time.perf_counter() - start:.1f} s, peak RSS {rss_gib():.1f} GiB")
        idx = np.array([0, count // 2, count - 1], np.int64)
        for backend in args.backends.split(","):
            start = time.perf_counter()
            try:
                y = gc.Session(model, backend=backend).run({"idx": idx})["y"]
            except gc.GraphcError as exc:
                print(f"{backend}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            ok = np.array_equal(y, idx.astype(np.float32))
            print(f"{backend}: session + run {time.perf_counter() - start:.1f} s, values {'match' if ok else y}, "
                  f"peak RSS {rss_gib():.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
