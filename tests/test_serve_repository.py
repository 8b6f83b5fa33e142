"""Which models a server holds: single files, repository folders, versions, and no reads
outside the repository."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.serving.kserve.deadline import Deadline
from graphc.serving.kserve.repository import load_models
from serve_util import fixed_model, mixed_feeds, mixed_model


def test_repository_serves_every_model_at_its_highest_version(tmp_path):
    gc.deploy.triton(mixed_model(), tmp_path, "a")
    gc.deploy.triton(fixed_model(), tmp_path, "b")
    (tmp_path / "a" / "3").mkdir()
    onnx.save(fixed_model(), str(tmp_path / "a" / "3" / "model.onnx"))
    (tmp_path / "a" / "10").mkdir()  # no model file: skipped
    (tmp_path / "notes").mkdir()     # not a model folder: ignored
    models = load_models(tmp_path, backend="numpy")
    assert sorted(models) == ["a", "b"]
    assert list(models["a"]) == ["3"] and models["a"]["3"].metadata["versions"] == ["3"]
    assert [i["name"] for i in models["a"]["3"].metadata["inputs"]] == ["x"]
    assert sorted(load_models(tmp_path, name="b")) == ["b"]
    assert sorted(load_models(tmp_path / "a")) == ["a"]  # one model's folder
    with pytest.raises(gc.ModelLoadError, match="has no model 'c'; it has a, b"):
        load_models(tmp_path, name="c")


def test_default_model_filename_from_config(tmp_path):
    folder = gc.deploy.triton(mixed_model(), tmp_path, "m")
    os.replace(folder / "1" / "model.onnx", folder / "1" / "net.onnx")
    with pytest.raises(gc.ModelLoadError, match="no numeric version folder holds 'model.onnx'"):
        load_models(tmp_path)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text() + 'default_model_filename: "net.onnx"\n')
    model = load_models(tmp_path)["m"]["1"]
    feeds = mixed_feeds(2)
    from graphc.serving.kserve.protocol import DecodedRequest

    out = model.infer(DecodedRequest(None, feeds, (None, False)), Deadline(None))
    np.testing.assert_array_equal(out["s"], feeds["idx"] + 1)
    config.write_text('default_model_filename: "../../outside.onnx"\n')
    with pytest.raises(gc.ModelLoadError, match="must be a plain file name"):
        load_models(tmp_path)


def test_symlinks_out_of_the_repository_are_refused(tmp_path):
    outside = tmp_path / "outside.onnx"
    onnx.save(mixed_model(), str(outside))
    repo = tmp_path / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "model.onnx").symlink_to(outside)
    with pytest.raises(gc.ModelLoadError, match="outside the repository"):
        load_models(repo)
    (repo / "m" / "1" / "model.onnx").unlink()
    (repo / "m" / "1").rmdir()
    (tmp_path / "elsewhere").mkdir()
    onnx.save(mixed_model(), str(tmp_path / "elsewhere" / "model.onnx"))
    (repo / "m" / "1").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(gc.ModelLoadError, match="outside the repository"):
        load_models(repo)


def test_empty_folder_and_missing_path(tmp_path):
    with pytest.raises(gc.ModelLoadError, match="no models found"):
        load_models(tmp_path)
    with pytest.raises(gc.ModelLoadError, match="no such model file or repository folder"):
        load_models(tmp_path / "missing.onnx")


def test_models_and_protos_are_served_under_their_graph_name_or_name():
    assert sorted(load_models(mixed_model())) == ["mixed"]
    assert sorted(load_models(gc.load(mixed_model()), name="other")) == ["other"]


def add_model(value: float) -> onnx.ModelProto:
    """y = x + value (float32[N]): which version answered shows in the output."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("Add", ["x", "c"], ["y"])], "add",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
                              [numpy_helper.from_array(np.array([value], np.float32), "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("policy, served, rule", [
    ("", ["3"], "the default version_policy, latest { num_versions: 1 } (its config.pbtxt sets none)"),
    ("version_policy: { latest: { num_versions: 2 } }", ["2", "3"],
     "its config.pbtxt's version_policy latest { num_versions: 2 }"),
    ("version_policy: { all: { } }", ["1", "2", "3"], None),
    ("version_policy: { specific: { versions: [ 1 ] } }", ["1"], "its config.pbtxt's version_policy specific { versions: 1 }"),
    ("version_policy: { specific: { versions: [ 2, 1 ] } }", ["1", "2"],
     "its config.pbtxt's version_policy specific { versions: 2 versions: 1 }"),
])
def test_version_policy_says_which_versions_are_served(tmp_path, policy, served, rule):
    """A version on disk that is not served gets a 404 naming the policy that leaves it out (it said
    only "it serves version 3")."""
    import httpx

    from graphc.serving.serve import create_app
    from serve_util import running_server

    for value in (10.0, 20.0, 30.0):  # versions 1, 2, 3
        folder = gc.deploy.triton(add_model(value), tmp_path, "m")
    (folder / "config.pbtxt").write_text((folder / "config.pbtxt").read_text() + policy + "\n")
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [0.0]}]}
    with running_server(create_app(tmp_path, backend="numpy")) as address:
        base = f"http://{address}/v2"
        for version in ("1", "2", "3"):
            reply = httpx.post(f"{base}/models/m/versions/{version}/infer", json=body)
            if version in served:
                assert reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [10.0 * int(version)]
                assert reply.json()["model_version"] == version
            else:
                assert (reply.status_code, reply.json()["error"]) == (404, f"model 'm' version '{version}' is in the "
                                                                     f"repository but not served: {rule} serves "
                                                                     f"{'versions' if len(served) > 1 else 'version'} "
                                                                     f"{', '.join(served)}")
        reply = httpx.post(f"{base}/models/m/infer", json=body)  # no version: the highest served
        assert reply.json()["model_version"] == served[-1]
        assert httpx.get(f"{base}/models/m").json()["versions"] == served
        index = httpx.post(f"{base}/repository/index").json()
        assert [(e["name"], e["version"]) for e in index] == [("m", v) for v in served]
        config = httpx.get(f"{base}/models/m/config").json()["version_policy"]
        assert config == ({"latest": {"num_versions": 1}} if not policy else
                          json_of(policy))


def json_of(policy: str) -> dict:
    from graphc.serving.kserve import model_config

    return model_config.to_json(model_config.parse(policy)[0])["version_policy"]


@pytest.mark.parametrize("policy, message", [
    ("specific: { versions: [ 1, 4 ] }", "specific lists versions [4] that hold 'model.onnx'; there are 1, 2"),
    ("specific: { }", "specific lists no versions"),
    ("latest: { num_versions: 0 }", "serves nothing"),
    ("latest: { num_versions: 1 } all: { }", "sets latest and all; it takes one of"),
])
def test_a_version_policy_that_cannot_be_served_is_refused_by_name(tmp_path, policy, message):
    for value in (10.0, 20.0):
        folder = gc.deploy.triton(add_model(value), tmp_path, "m")
    (folder / "config.pbtxt").write_text((folder / "config.pbtxt").read_text() + f"version_policy: {{ {policy} }}\n")
    with pytest.raises(gc.ModelLoadError, match="version_policy") as failed:
        load_models(tmp_path, backend="numpy")
    assert message in str(failed.value)


def neg_model(shape: list) -> onnx.ModelProto:
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Neg", ["s"], ["y"])], "neg",
                              [helper.make_tensor_value_info("s", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_the_configs_reshape_of_scalars_is_applied_to_requests_and_replies(tmp_path):
    # deploy writes a scalar (per batch item) as dims [ 1 ] with reshape { shape: [ ] }, as Triton
    # needs; Triton then takes the input and gives the output as dims say
    import httpx

    from graphc.serving.serve import create_app
    from serve_util import running_server

    gc.deploy.triton(neg_model([]), tmp_path, "scalar")
    gc.deploy.triton(neg_model(["N"]), tmp_path, "batched", max_batch_size=4)
    cases = [("scalar", [1], [1]), ("scalar", [], [1]),             # as the config says; as the model says
             ("batched", [2, 1], [2, 1]), ("batched", [2], [2, 1])]
    with running_server(create_app(tmp_path, backend="numpy")) as address:
        for name, shape, out in cases:
            count = int(np.prod(shape))
            body = {"inputs": [{"name": "s", "datatype": "FP32", "shape": shape, "data": [1.5] * count}]}
            reply = httpx.post(f"http://{address}/v2/models/{name}/infer", json=body)
            assert reply.status_code == 200, (name, shape, reply.text)
            assert reply.json()["outputs"][0]["shape"] == out and reply.json()["outputs"][0]["data"] == [-1.5] * count
        body = {"inputs": [{"name": "s", "datatype": "FP32", "shape": [5, 1], "data": [1.5] * 5}]}
        reply = httpx.post(f"http://{address}/v2/models/batched/infer", json=body)
        assert reply.status_code == 400 and "exceeds the max_batch_size" in reply.json()["error"]


def test_a_reshape_that_cannot_hold_its_dims_or_the_models_output_is_named(tmp_path):
    from graphc.serving.kserve.protocol import DecodedRequest, ProtocolError

    config = gc.deploy.triton(neg_model(["N", 6]), tmp_path, "m", max_batch_size=4) / "config.pbtxt"
    text = config.read_text()
    config.write_text(text.replace("dims: [ 6 ]\n  }\n]\ninstance", "dims: [ 5 ]\n    reshape: { shape: [ 2, 3 ] }\n"
                                   "  }\n]\ninstance"))
    with pytest.raises(gc.ModelLoadError, match=r"gives output 'y' dims \[5\] and reshape \[2, 3\], which do not "
                                                r"hold the same elements"):
        load_models(tmp_path)
    config.write_text(text.replace("dims: [ 6 ]\n  }\n]\ninstance", "dims: [ 6 ]\n    reshape: { shape: [ 3, 2 ] }\n"
                                   "  }\n]\ninstance"))
    model = load_models(tmp_path)["m"]["1"]
    with pytest.raises(ProtocolError, match=r"output 'y' has shape \[2, 6\], which its config.pbtxt reshape "
                                            r"\[3, 2\] does not fit after the batch dim") as caught:
        model.infer(DecodedRequest(None, {"s": np.zeros((2, 6), np.float32)}, (None, False)), Deadline(None))
    assert caught.value.status == 500


def test_a_version_folder_with_leading_zeros_is_refused_by_name(tmp_path):
    """``0001`` is version 1 to a reader of numbers: next to ``1`` the two collided (one was never
    served), alone it was reported as no version holding the model; a deploy would add ``2``."""
    gc.deploy.triton(fixed_model(), tmp_path, "m")
    (tmp_path / "m" / "1").rename(tmp_path / "m" / "0001")
    with pytest.raises(gc.ModelLoadError, match="version folder '0001' is not a plain version number; rename it to '1'"):
        load_models(tmp_path, backend="numpy")
    with pytest.raises(gc.ModelLoadError, match="'0001'"):
        gc.deploy.triton(fixed_model(), tmp_path, "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["0001", "config.pbtxt"]  # nothing written


def test_graphc_serve_names_each_model_its_versions_and_backend_once_it_listens(tmp_path):
    """After its unchanged "serving ... on ..." line, `graphc serve REPO` prints one line per model:
    the versions it serves, the backend, and what the version_policy leaves out (it named none)."""
    import signal

    from serve_util import serve_process

    gc.deploy.triton(mixed_model(), tmp_path, "a")
    for value in (10.0, 20.0, 30.0):  # versions 1, 2, 3; the policy serves 2 and 3
        folder = gc.deploy.triton(add_model(value), tmp_path, "m")
    (folder / "config.pbtxt").write_text((folder / "config.pbtxt").read_text() +
                                         "version_policy: { latest: { num_versions: 2 } }\n")
    with serve_process(str(tmp_path), "--backend", "numpy") as (proc, port):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        rest = proc.stdout.read().splitlines()  # not communicate(): it skips what the first readline buffered
    assert rest == ["  model a: version 1 on numpy",
                    "  model m: versions 2, 3 on numpy; version 1 left out by its config.pbtxt's version_policy "
                    "latest { num_versions: 2 }",
                    f"stopped serving {tmp_path}"]
