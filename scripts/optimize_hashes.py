"""Print one sha256 of ``gc.optimize``'s serialized output per model x level.

The models are scripts/bench_optimize.py's (models/ examples, their train_step graphs, the
imported ONNX files; ``--torch`` adds the PyTorch exports). Run it before and after a change
that must not change what optimize emits and diff the two outputs. A node's ``graphc.source``
that points into graphc's own code (a training graph's loss and update nodes) is hashed
without its line number, which moves with any edit of that file; user-code positions stay.

    python scripts/optimize_hashes.py > before.txt   # at the base commit
    python scripts/optimize_hashes.py | diff before.txt -
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import onnx  # noqa: E402

import graphc as gc  # noqa: E402
from bench_optimize import collect_models  # noqa: E402

SOURCE_KEY = "graphc.source"
OWN_CODE = ("graphc/", "passes/", "backends/")


def without_own_lines(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each ``graphc.source`` into graphc's own code cut to its file name."""
    graphs = [model.graph, *(f for f in model.functions)]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            for prop in node.metadata_props:
                if prop.key == SOURCE_KEY and prop.value.startswith(OWN_CODE):
                    prop.value = prop.value.rsplit(":", 1)[0]
            for attr in node.attribute:
                graphs.extend([attr.g] if attr.HasField("g") else list(attr.graphs))
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--only", nargs="*", default=[], help="model names to hash (default: all)")
    parser.add_argument("--torch", action="store_true", help="add the PyTorch exports (needs torch)")
    args = parser.parse_args()
    for name, proto in collect_models(set(args.only), torch=args.torch):
        for level in args.levels:
            data = without_own_lines(gc.optimize(proto, level).proto).SerializeToString(deterministic=True)
            print(f"{name} -O{level} {hashlib.sha256(data).hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
