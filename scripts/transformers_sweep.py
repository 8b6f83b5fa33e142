"""Audit tiny HuggingFace transformers architectures (tests/transformers_zoo.py) through both
torch.onnx exporters: load, inference parity against torch on numpy and onnxruntime, training
artifacts (trainable set against ``named_parameters()``, full ONNX check), gradients and three
SGD steps against ``torch.optim.SGD``. Prints one row per architecture and exporter::

    .venv/bin/python scripts/transformers_sweep.py [--only NAME ...] [--exporter dynamo]

Needs torch and transformers (not dependencies of graphc).

Measured (torch 2.13, transformers 4.57.6, onnxruntime 1.31, float32, 1 torch thread; TS is
TorchScript at opset 17, D is dynamo; infer: numpy / onnxruntime against torch's eval forward,
largest difference over largest value; grad: ort gradients against torch's; loss / update:
after 3 SGD steps at lr 1e-3, the update (new - initial params) against torch's; ms: one
onnxruntime step; every exporter export loaded, every generated graph passed
``check_model(full_check=True)``, every trainable set equal to ``named_parameters()``)::

    arch          exp  infer np/ort      grad     loss    update   ms
    bert          TS   3e-8 / 3e-8    7.3e-4*      0     7.3e-4*  0.8   * padding_idx row trained
    bert          D    3e-8 / 3e-8    1.3e-7       0     3.7e-6   0.9
    distilbert    TS   3e-8 / 3e-8    1.1e-3*  7.8e-8    1.1e-3*  0.7   * padding_idx row trained
    distilbert    D    3e-8 / 3e-8    1.0e-7   7.8e-8    1.0e-6   5.3
    gpt2          D    3e-7 / 2e-7    6.7e-8   1.3e-7    7.0e-7   4.8   (TS: torch fails, unordered_map::at)
    t5            TS   2e-7 / 2e-7    1.9e-7       0     3.6e-5  11.6
    t5            D    2e-7 / 3e-7    3.0e-7   1.1e-7    3.6e-5   0.9
    bart          TS   2e-7 / 2e-7    8.2e-8   6.3e-8    6.8e-6   1.2   (final_logits_bias frozen)
    bart          D    3e-7 / 2e-7    9.2e-8   6.3e-8    6.8e-6   8.2
    vit           TS   1e-7 / 1e-7    1.0e-7       0     1.4e-6   0.6
    vit           D       0 / 6e-8    2.1e-7       0     1.4e-6   0.8
    swin          TS   1e-7 / 1e-7    1.5e-7   7.7e-8    3.1e-6   0.8
    swin          D    1e-7 / 1e-7    1.5e-7   7.7e-8    3.1e-6   0.9
    convnext      TS   5e-8 / 5e-8    1.3e-7   7.3e-8    1.8e-6   7.0
    convnext      D    5e-8 / 5e-8    1.3e-7   7.3e-8    1.8e-6   3.3
    resnet        TS   2e-7 / 3e-7    1.0e-6   1.4e-7    1.3e-5   1.2
    resnet        D    2e-7 / 2e-7    1.1e-6   7.1e-8    2.5e-5   0.9
    mobilenet_v2  TS   1e-7 / 2e-7    1.2e-5   1.2e-2*   3.1e-1* 36.6   * chaotic (float64: grads 1e-13)
    mobilenet_v2  D    1e-7 / 2e-7    1.2e-5   1.2e-2*   3.1e-1* 19.2
    efficientnet  TS   4e-8 / 7e-8    6.7e-8       0     1.9e-6  28.6
    efficientnet  D    4e-8 / 7e-8    6.7e-8       0     1.9e-6   7.8
    clip_vision   TS   4e-7 / 3e-7    2.5e-7   2.1e-7    4.2e-6   0.7
    clip_vision   D    2e-7 / 2e-7    2.1e-7   2.1e-7    4.2e-6   0.6
    whisper_enc   TS   4e-8 / 2e-8    2.2e-7       0     1.9e-6   0.5   (embed_positions frozen)
    whisper_enc   D    2e-8 / 2e-8    2.2e-7       0     1.9e-6   0.6   (embed_positions frozen)
    wav2vec2      TS      0 / 0       8.8e-8       0     1.8e-6   1.0
    wav2vec2      D       0 / 0       8.8e-8       0     1.8e-6   7.9
    hubert        TS   1e-7 / 1e-7    1.2e-7   7.8e-8    1.0e-6   1.0
    hubert        D    1e-7 / 1e-7    1.5e-7       0     5.2e-7   7.8
    llama         D    2e-7 / 1e-7    2.9e-7   6.5e-8    2.9e-6   1.1   (TS: torch fails, unordered_map::at)
    mistral       D    2e-7 / 1e-7    2.9e-7   6.5e-8    2.9e-6   1.0   (TS: torch fails, unordered_map::at)
    mamba         TS   3e-7 / 1e-7    1.4e-7   1.2e-7    5.7e-6   8.3
    mamba         D    3e-7 / 1e-7    1.4e-7   1.2e-7    5.7e-6  13.3
    rwkv          TS   5e-7 / 5e-7    3.1e-7   1.2e-7    4.1e-7  27.1
    rwkv          D    5e-7 / 5e-7    2.5e-7   1.2e-7    4.1e-7  24.9

"frozen": what a user passes in ``frozen`` (torch's ``requires_grad=False`` params, which no
exporter records; TorchScript's float buffers, which it records as parameters). The TorchScript
exporter records no padding_idx (its Gather trains the row); the dynamo exporter does, and
graphc leaves the row untrained as torch does."""

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
