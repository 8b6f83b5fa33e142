"""Audit tiny HuggingFace transformers architectures (tests/transformers_zoo.py) through both
torch.onnx exporters: load, inference parity against torch on numpy and onnxruntime, training
artifacts (trainable set against ``named_parameters()``, full ONNX check), gradients and three
SGD steps against ``torch.optim.SGD``. Prints one row per architecture and exporter::

    .venv/bin/python scripts/transformers_sweep.py [--only NAME ...] [--exporter dynamo]

Needs torch and transformers (not dependencies of graphc)."""

from __future__ import annotations

import argparse
import pathlib
import sys
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
import torch  # noqa: E402
import transformers_zoo as zoo  # noqa: E402

COLUMNS = ("infer_numpy", "infer_ort-cpu", "grad", "loss", "update", "step_ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(zoo.ARCHS))
    parser.add_argument("--exporter", nargs="*", default=list(zoo.EXPORTERS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'arch':16} {'exporter':11} {'stage':8} trainable " + " ".join(f"{c:>13}" for c in COLUMNS))
    failed = 0
    for name in args.only:
        for exporter in args.exporter:
            row = {"arch": name, "exporter": exporter, "stage": "build"}
            try:
                zoo.audit(name, exporter, row=row)
            except Exception as exc:  # noqa: BLE001 - a sweep reports every failure and goes on
                failed += 1
                tail = traceback.format_exception_only(exc)[-1].strip().replace("\n", " ")
                row["error"] = tail[:300]
            cells = " ".join(f"{row[c]:13.2e}" if c in row else f"{'-':>13}" for c in COLUMNS)
            ok = "yes" if row.get("trainable_ok") else ("-" if "trainable_ok" not in row else "NO")
            print(f"{name:16} {exporter:11} {row.get('stage', ''):8} {ok:9} {cells}", flush=True)
            if row.get("trainable_diff"):
                print(f"    trainable differs: {row['trainable_diff'][:8]}")
            if row.get("frozen"):
                print(f"    frozen (untrained in torch, unrecorded in the export): {row['frozen']}")
            if "error" in row:
                print(f"    {row['error']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
