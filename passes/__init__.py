"""graphc.passes: graph-to-graph transforms on onnx-ir models (no DSL, no backends)."""
