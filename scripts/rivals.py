"""Node counts of a model after ``gc.optimize -O3`` and after the rival simplifiers (onnxsim,
onnxslim, those installed), nodes inside subgraphs included. Shared by the sweep scripts."""

from __future__ import annotations

import onnx

import graphc as gc


def count_nodes(graph: onnx.GraphProto) -> int:
    """Nodes of ``graph`` and of every subgraph (If branches, Loop/Scan bodies) in it."""
    total = 0
    for node in graph.node:
        total += 1
        for attr in node.attribute:
            total += sum(count_nodes(g) for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs))
    return total


def node_counts(proto: onnx.ModelProto) -> dict[str, int | str]:
    """``{"gc": n, "onnxsim": n, "onnxslim": n}``; a rival that fails gives its error's name."""
    counts: dict[str, int | str] = {"gc": count_nodes(gc.optimize(proto, 3).proto.graph)}
    for tool in ("onnxsim", "onnxslim"):
        fresh = onnx.ModelProto()
        fresh.CopyFrom(proto)
        try:
            if tool == "onnxsim":
                import onnxsim

                out = onnxsim.simplify(fresh)[0]
            else:
                import onnxslim

                out = onnxslim.slim(fresh)
            counts[tool] = count_nodes(out.graph)
        except ImportError:
            pass
        except Exception as exc:  # noqa: BLE001 - a rival failing is a result
            counts[tool] = f"failed ({type(exc).__name__})"
    return counts


def describe(counts: dict[str, int | str]) -> str:
    return ", ".join(f"{tool} {n}" for tool, n in counts.items())
