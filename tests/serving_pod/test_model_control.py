"""Model control: explicit load / unload / reload (with config overrides) over HTTP and gRPC; poll mode; none mode."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from support.server import ensemble_config, test_model_config, wait_for, write_model

PROTOCOLS = ["http", "grpc"]


def _infer(handle, protocol: str, model: str, array: np.ndarray, version: str = ""):
    module = handle.module(protocol)
    tensor = module.InferInput("INPUT0", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return handle.client(protocol).infer(model, [tensor], model_version=version)


def _index(handle, protocol: str) -> dict[str, dict]:
    client = handle.client(protocol)
    if protocol == "grpc":
        rows = client.get_model_repository_index(as_json=True).get("models", [])
    else:
        rows = client.get_model_repository_index()
    return {(row["name"], row.get("version", "")): row for row in rows}


@pytest.fixture
def repository(tmp_path):
    write_model(tmp_path, "alpha", test_model_config("alpha"))
    write_model(tmp_path, "beta", test_model_config("beta"))
    return tmp_path


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_explicit_load_unload_reload(threaded_server, repository, protocol):
    server = threaded_server([repository], model_control_mode="explicit", load_models=("alpha",))
    client = server.client(protocol)
    assert client.is_model_ready("alpha")
    assert not client.is_model_ready("beta")
    index = _index(server, protocol)
    assert ("beta", "") in index and "state" not in index[("beta", "")] or index[("beta", "")].get("state", "") == ""

    client.load_model("beta")
    assert client.is_model_ready("beta")
    assert _infer(server, protocol, "beta", np.ones((2, 4), np.float32)).as_numpy("OUTPUT0").shape == (2, 4)

    client.unload_model("beta")
    assert not client.is_model_ready("beta")
    index = _index(server, protocol)
    assert index[("beta", "1")]["state"] == "UNAVAILABLE" and index[("beta", "1")]["reason"] == "unloaded"
    with pytest.raises(InferenceServerException) as info:
        _infer(server, protocol, "beta", np.ones((1, 4), np.float32))
    assert "beta" in info.value.message()

    # reload with a config override: max_batch_size 2 now refuses a batch of 3
    override = json.dumps({"backend": "ferry_test", "max_batch_size": 2,
                           "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
                           "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]})
    client.load_model("alpha", config=override)
    config = client.get_model_config("alpha", **({"as_json": True} if protocol == "grpc" else {}))
    config = config["config"] if protocol == "grpc" else config
    assert int(config["max_batch_size"]) == 2
    with pytest.raises(InferenceServerException) as info:
        _infer(server, protocol, "alpha", np.ones((3, 4), np.float32))
    assert "batch-size must be <= 2 for 'alpha'" in info.value.message()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_failed_reload_keeps_old_version_serving(threaded_server, repository, protocol):
    server = threaded_server([repository], model_control_mode="explicit", load_models=("alpha",))
    client = server.client(protocol)
    with pytest.raises(InferenceServerException) as info:
        client.load_model("alpha", config='{"backend": "ferry_test", "max_batch_size": -3}')
    assert "max_batch_size must be >= 0" in info.value.message()
    assert client.is_model_ready("alpha")
    assert _infer(server, protocol, "alpha", np.ones((4, 4), np.float32)).as_numpy("OUTPUT0").shape == (4, 4)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_load_errors(threaded_server, repository, protocol):
    server = threaded_server([repository], model_control_mode="explicit")
    client = server.client(protocol)
    with pytest.raises(InferenceServerException) as info:
        client.load_model("does_not_exist")
    # tritonserver 2.51: HTTP 500, gRPC INTERNAL (it was 404 / NOT_FOUND)
    assert (str(info.value.status()), info.value.message()) == (
        {"http": "500", "grpc": "StatusCode.INTERNAL"}[protocol],
        "failed to load 'does_not_exist', failed to poll from model repository")
    with pytest.raises(InferenceServerException) as info:
        client.load_model("alpha", config="{not json")
    assert "failed to parse config override of model 'alpha'" in info.value.message()
    assert client.is_server_live()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("override", ["[]", "null", '"alpha"', "4"])
def test_a_config_override_that_is_not_an_object_is_refused(threaded_server, repository, protocol, override):
    """A ``config`` override that is JSON but not an object gets the poll failure (500 / INTERNAL), as from
    Triton 2.51 (recorded live: its log says 'Invalid config override: : Root element must be a message.'); Ferry
    loaded ``[]`` as an empty config. The model loaded before keeps serving."""
    server = threaded_server([repository], model_control_mode="explicit", load_models=("alpha",))
    client = server.client(protocol)
    with pytest.raises(InferenceServerException) as info:
        client.load_model("alpha", config=override)
    assert (str(info.value.status()), info.value.message()) == (
        {"http": "500", "grpc": "StatusCode.INTERNAL"}[protocol],
        "failed to load 'alpha', failed to poll from model repository: failed to parse config override of model "
        "'alpha': Root element must be a message.")
    assert _infer(server, protocol, "alpha", np.ones((1, 4), np.float32)).as_numpy("OUTPUT0").shape == (1, 4)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_repository_index_rows_as_tritons(threaded_server, repository, protocol):
    """tritonserver 2.51's rows: 'reason' only where there is one (a READY version had "reason": "" over HTTP), and
    only the name of a model never loaded."""
    import httpx
    from google.protobuf import json_format
    from tritonclient.grpc import service_pb2 as pb

    write_model(repository, "broken", test_model_config(
        "broken", extra='parameters { key: "fail_load" value { string_value: "true" } }'))
    write_model(repository, "gamma", test_model_config("gamma"))
    server = threaded_server([repository], model_control_mode="explicit", load_models=("alpha", "beta"))
    client = server.client(protocol)
    with pytest.raises(InferenceServerException):
        client.load_model("broken")
    client.unload_model("beta")
    if protocol == "http":
        response = httpx.post(f"http://{server.http_url}/v2/repository/index", timeout=30)
        assert response.status_code == 200
        rows = response.json()
    else:
        channel, stub = _grpc_stub(server)
        with channel:
            answer = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=30)
        rows = [json_format.MessageToDict(row) for row in answer.models]
        assert [row.reason for row in answer.models if row.state == "READY"] == [""]
    broken = rows[2].pop("reason")
    assert "ferry_test asked to fail loading" in broken
    assert rows == [
        {"name": "alpha", "version": "1", "state": "READY"},
        {"name": "beta", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
        {"name": "broken", "version": "1", "state": "UNAVAILABLE"},
        {"name": "gamma"},
    ]


@pytest.mark.parametrize(("path", "body", "message"), [
    ("repository/index", {"ready": "yes"}, "Invalid value for 'ready': expected a boolean, got 'yes'"),
    ("repository/models/alpha/unload", {"parameters": 3}, "unload 'parameters' must be a JSON object"),
    ("repository/models/alpha/unload", {"parameters": {"unload_dependents": "yes"}},
     "Unable to parse 'unload_dependents': expected a boolean, got 'yes'"),
    ("repository/models/alpha/load", {"parameters": [1]}, "load 'parameters' must be a JSON object"),
])
def test_http_control_bodies_of_the_wrong_type(threaded_server, repository, path, body, message):
    """Each gets 400 and its message (a non-object 'parameters' used to fail inside the route: 500)."""
    import httpx

    server = threaded_server([repository], model_control_mode="explicit", load_models=("alpha",))
    response = httpx.post(f"http://{server.http_url}/v2/{path}", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]
    assert server.client("http").is_model_ready("alpha")  # nothing was unloaded


def test_grpc_unload_dependents_of_the_wrong_type(threaded_server, repository):
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc

    server = threaded_server([repository], model_control_mode="explicit", load_models=("alpha",))
    request = pb.RepositoryModelUnloadRequest(model_name="alpha")
    request.parameters["unload_dependents"].string_param = "yes"
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as info:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelUnload(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "invalid value type for 'unload_dependents' parameter, expected bool_param."
    assert server.client("grpc").is_model_ready("alpha")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_none_mode_refuses_load_and_unload(threaded_server, repository, protocol):
    server = threaded_server([repository])
    client = server.client(protocol)
    for refused in (lambda: client.unload_model("alpha"), lambda: client.load_model("alpha")):
        with pytest.raises(InferenceServerException) as info:
            refused()
        # tritonserver 2.51 answers exactly this (503 / UNAVAILABLE) in "none" mode too
        assert info.value.message() == "explicit model load / unload is not allowed if polling is enabled"
        assert info.value.status() in ("503", "StatusCode.UNAVAILABLE")
    assert client.is_model_ready("alpha")


def test_load_all_with_star(threaded_server, repository):
    server = threaded_server([repository], model_control_mode="explicit", load_models=("*",))
    client = server.client("http")
    assert client.is_model_ready("alpha") and client.is_model_ready("beta")


def _touch(path) -> None:
    """Make ``path`` newer than anything written before (a load of its model then has something to do)."""
    now = time.time_ns() + 1_000_000
    os.utime(path, ns=(now, now))


def test_poll_mode_picks_up_new_version_and_survives_a_broken_edit(threaded_server, tmp_path):
    model_dir = write_model(tmp_path, "polled", test_model_config(
        "polled", extra="version_policy { latest { num_versions: 1 } }"))
    server = threaded_server([tmp_path], model_control_mode="poll", repository_poll_secs=0.2)
    client = server.client("http")
    assert client.get_model_metadata("polled")["versions"] == ["1"]

    (model_dir / "2").mkdir()
    wait_for(lambda: client.get_model_metadata("polled")["versions"] == ["2"])
    assert _infer(server, "http", "polled", np.ones((1, 4), np.float32)).get_response()["model_version"] == "2"

    # a broken edit: the serving version stays
    (model_dir / "config.pbtxt").write_text("this is { not a config")
    time.sleep(1.0)
    assert client.is_model_ready("polled")
    assert client.get_model_metadata("polled")["versions"] == ["2"]

    # a new model appears, then a model disappears
    write_model(tmp_path, "newcomer", test_model_config("newcomer"))
    wait_for(lambda: client.is_model_ready("newcomer"))
    import shutil

    shutil.rmtree(tmp_path / "newcomer")
    wait_for(lambda: not client.is_model_ready("newcomer"))


def test_version_policies(threaded_server, tmp_path):
    write_model(tmp_path, "all_versions", test_model_config("all_versions", extra="version_policy { all { } }"), versions=(1, 2, 3))
    write_model(tmp_path, "specific", test_model_config("specific", extra="version_policy { specific { versions: [1, 3] } }"), versions=(1, 2, 3))
    write_model(tmp_path, "latest2", test_model_config("latest2", extra="version_policy { latest { num_versions: 2 } }"), versions=(1, 2, 3))
    server = threaded_server([tmp_path])
    client = server.client("http")
    assert client.get_model_metadata("all_versions")["versions"] == ["1", "2", "3"]
    assert client.get_model_metadata("specific")["versions"] == ["1", "3"]
    assert client.get_model_metadata("latest2")["versions"] == ["2", "3"]
    assert client.is_model_ready("specific", "3") and not client.is_model_ready("specific", "2")
    assert _infer(server, "http", "specific", np.ones((1, 4), np.float32), version="1").get_response()["model_version"] == "1"
    # the default version is the newest
    assert _infer(server, "http", "latest2", np.ones((1, 4), np.float32)).get_response()["model_version"] == "3"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unload_of_an_unknown_model_succeeds(threaded_server, repository, protocol):
    """tritonserver 2.51 answers success (HTTP 200, gRPC OK) to unloading a model it never loaded; it was 404."""
    server = threaded_server([repository], model_control_mode="explicit", load_models=("alpha",))
    client = server.client(protocol)
    client.unload_model("does_not_exist")
    client.unload_model("beta")  # in the repository, never loaded
    assert client.is_model_ready("alpha") and not client.is_model_ready("beta")


def _ensemble_over(name: str, composing: str) -> str:
    """An ensemble with one step, ``composing``'s INPUT0 -> OUTPUT0 (a ferry_test identity, or an ensemble of this
    shape), under the same tensor names."""
    return ensemble_config(name, [composing], tensors=("INPUT0", "OUTPUT0"))


def _states(server, protocol: str, *names: str) -> dict[str, tuple[str, str]]:
    index = _index(server, protocol)
    return {name: (index[(name, "1")]["state"], index[(name, "1")].get("reason", "")) for name in names}


def _inference_count(server, model: str) -> int:
    return int(server.client("http").get_inference_statistics(model)["model_stats"][0]["inference_count"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unloading_a_composing_model_unloads_its_ensembles(threaded_server, repository, protocol):
    """tritonserver 2.51: the ensembles over an unloaded model (and the ensembles over those) are unloaded with it
    (UNAVAILABLE "unloaded", not ready, infer 404 naming the ensemble), and load again, with fresh statistics, when
    it loads again; an ensemble unloaded on purpose stays unloaded. Ferry kept them READY."""
    write_model(repository, "ens", _ensemble_over("ens", "alpha"))
    write_model(repository, "outer", _ensemble_over("outer", "ens"))
    server = threaded_server([repository], model_control_mode="explicit", load_models=("alpha", "ens", "outer", "beta"))
    client = server.client(protocol)
    ones = np.ones((1, 4), np.float32)
    _infer(server, protocol, "ens", ones)
    assert _inference_count(server, "ens") == 1

    client.unload_model("alpha")
    assert _states(server, protocol, "alpha", "ens", "outer", "beta") == {
        "alpha": ("UNAVAILABLE", "unloaded"), "ens": ("UNAVAILABLE", "unloaded"),
        "outer": ("UNAVAILABLE", "unloaded"), "beta": ("READY", "")}
    assert not client.is_model_ready("ens") and not client.is_model_ready("outer")
    for model in ("ens", "outer"):
        with pytest.raises(InferenceServerException) as info:
            _infer(server, protocol, model, ones)
        assert (str(info.value.status()), info.value.message()) == (
            {"http": "404", "grpc": "StatusCode.NOT_FOUND"}[protocol],
            f"Request for unknown model: '{model}' has no available versions")

    client.load_model("alpha")
    assert _states(server, protocol, "alpha", "ens", "outer") == {name: ("READY", "") for name in ("alpha", "ens", "outer")}
    assert _inference_count(server, "ens") == 0
    assert _infer(server, protocol, "outer", ones).as_numpy("OUTPUT0").tolist() == ones.tolist()

    client.unload_model("outer")  # on purpose: alpha's unload and load leave it unloaded
    client.unload_model("alpha")
    client.load_model("alpha")
    assert _states(server, protocol, "ens", "outer") == {"ens": ("READY", ""), "outer": ("UNAVAILABLE", "unloaded")}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_reloading_a_composing_model_reloads_its_ensembles(threaded_server, repository, protocol):
    """tritonserver 2.51 loads a READY ensemble again when its composing model is loaded again: fresh statistics.
    A load of a composing model none of whose files is newer does nothing, to the ensemble either."""
    write_model(repository, "ens", _ensemble_over("ens", "alpha"))
    server = threaded_server([repository], model_control_mode="explicit", load_models=("alpha", "ens"))
    _infer(server, protocol, "ens", np.ones((1, 4), np.float32))
    assert _inference_count(server, "ens") == 1
    server.client(protocol).load_model("alpha")
    assert _inference_count(server, "ens") == 1
    _touch(repository / "alpha" / "1")
    server.client(protocol).load_model("alpha")
    assert server.client(protocol).is_model_ready("ens")
    assert _inference_count(server, "ens") == 0


def test_unload_dependents_of_a_composing_model_changes_nothing(threaded_server, repository):
    """tritonserver 2.51: 'unload_dependents' (HTTP true, gRPC false) on a composing model: its ensembles go all the
    same; on the ensemble, its composing models go too, and the ensembles over it."""
    import httpx
    from tritonclient.grpc import service_pb2 as pb

    write_model(repository, "ens", _ensemble_over("ens", "alpha"))
    write_model(repository, "outer", _ensemble_over("outer", "ens"))
    server = threaded_server([repository], model_control_mode="explicit", load_models=("alpha", "ens", "outer"))
    url = f"http://{server.http_url}/v2/repository/models"
    assert httpx.post(f"{url}/alpha/unload", json={"parameters": {"unload_dependents": True}}).status_code == 200
    assert not server.client("http").is_model_ready("ens")
    server.client("http").load_model("alpha")
    request = pb.RepositoryModelUnloadRequest(model_name="alpha")
    request.parameters["unload_dependents"].bool_param = False
    channel, stub = _grpc_stub(server)
    with channel:
        stub.RepositoryModelUnload(request, timeout=30)
    assert _states(server, "http", "alpha", "ens", "outer") == {name: ("UNAVAILABLE", "unloaded")
                                                                for name in ("alpha", "ens", "outer")}
    server.client("http").load_model("alpha")
    assert httpx.post(f"{url}/ens/unload", json={"parameters": {"unload_dependents": True}}).status_code == 200
    assert _states(server, "http", "alpha", "ens", "outer") == {name: ("UNAVAILABLE", "unloaded")
                                                                for name in ("alpha", "ens", "outer")}


def _grpc_stub(server):
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    channel = grpc.insecure_channel(server.grpc_url)
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _assert_load_refused(server, http_parameters: dict, grpc_parameter: tuple[str, str, object], http_error: str,
                         grpc_error: str) -> None:
    """Loading 'beta' with these parameters is refused over HTTP (400) and gRPC (INVALID_ARGUMENT) and loads nothing."""
    import grpc
    import httpx
    from tritonclient.grpc import service_pb2 as pb

    response = httpx.post(f"http://{server.http_url}/v2/repository/models/beta/load",
                          json={"parameters": http_parameters}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == http_error
    request = pb.RepositoryModelLoadRequest(model_name="beta")
    key, field, value = grpc_parameter
    setattr(request.parameters[key], field, value)
    channel, stub = _grpc_stub(server)
    with channel, pytest.raises(grpc.RpcError) as info:
        stub.RepositoryModelLoad(request, timeout=30)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, grpc_error)
    assert not server.client("http").is_model_ready("beta")


def test_unrecognized_load_parameters_refused(threaded_server, repository):
    """Triton's INVALID_ARGUMENT "unrecognized load parameter"; the load went ahead without them (HTTP and gRPC)."""
    server = threaded_server([repository], model_control_mode="explicit")
    _assert_load_refused(server, {"bogus": "x"}, ("bogus", "int64_param", 1),
                         "unrecognized load parameter 'bogus'.", "unrecognized load parameter 'bogus'.")


def test_load_config_of_the_wrong_type_refused(threaded_server, repository):
    """'config' must be a JSON string, as tritonserver demands: an object was serialized and loaded (HTTP), and the
    gRPC answer now has Triton's words."""
    server = threaded_server([repository], model_control_mode="explicit")
    config = {"backend": "ferry_test", "max_batch_size": 2,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}
    _assert_load_refused(server, {"config": config}, ("config", "bytes_param", json.dumps(config).encode()),
                         "invalid value type for load parameter 'config', expected a string",
                         "invalid value type for load parameter 'config', expected string_param.")


def test_grpc_repository_index_of_a_named_repository_refused(threaded_server, repository):
    """tritonserver answers UNIMPLEMENTED; the name was ignored and the whole index sent."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    server = threaded_server([repository], model_control_mode="explicit")
    channel, stub = _grpc_stub(server)
    with channel, pytest.raises(grpc.RpcError) as info:
        stub.RepositoryIndex(pb.RepositoryIndexRequest(repository_name="models"), timeout=30)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.UNIMPLEMENTED, "'repository_name' specification is not supported")


# ---- side by side with tritonserver 2.51 (skipped where it cannot be installed) ----------------------------------

_ADD_SUB_ENSEMBLE = """
name: "ens"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "IN1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "add_sub_py" model_version: -1
  input_map { key: "INPUT0" value: "IN0" } input_map { key: "INPUT1" value: "IN1" }
  output_map { key: "OUTPUT0" value: "SUM" } } ] }
"""
_BROKEN_PY = """
name: "broken_py"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _side_by_side_answers(http_port: int, grpc_port: int) -> dict[str, object]:
    """What a server answers to the calls compared with tritonserver's: repository index (after a failed load),
    an ensemble's config, loading an unknown model, infer with version strings its HTTP routes do not match, and
    the ensemble after its composing model is unloaded and loaded again."""
    import grpc
    import httpx
    from google.protobuf import json_format
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc

    base = f"http://127.0.0.1:{http_port}/v2"

    def over_http(path: str, body: bytes = b"") -> tuple[int, object]:
        response = httpx.post(base + path, content=body, timeout=60)
        return response.status_code, response.json() if response.content else None

    def over_grpc(method: str, request) -> tuple[str, object]:
        try:
            return "OK", json_format.MessageToDict(getattr(stub, method)(request, timeout=60))
        except grpc.RpcError as error:
            return error.code().name, error.details()

    def masked(rows: list[dict]) -> list[dict]:  # the failed load's reason is each server's own words
        return [{**row, "reason": "..."} if row["name"] == "broken_py" and "reason" in row else row for row in rows]

    answers: dict[str, object] = {}
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        load = pb.RepositoryModelLoadRequest
        answers["failed load"] = (over_http("/repository/models/broken_py/load")[0],
                                  over_grpc("RepositoryModelLoad", load(model_name="broken_py"))[0])
        answers["index http"] = masked(over_http("/repository/index")[1])
        answers["index grpc"] = masked(over_grpc("RepositoryIndex", pb.RepositoryIndexRequest())[1]["models"])
        config = httpx.get(f"{base}/models/ens/config", timeout=60).json()
        config["ensemble_scheduling"].pop("max_inflight_requests", None)  # Ferry only: a newer model_config.proto
        answers["ensemble config http"] = config
        answers["ensemble config grpc"] = over_grpc("ModelConfig", pb.ModelConfigRequest(name="ens"))
        answers["unknown load"] = (over_http("/repository/models/nope/load"),
                                   over_grpc("RepositoryModelLoad", load(model_name="nope")))
        names = ("INPUT0", "INPUT1")
        body = json.dumps({"inputs": [{"name": n, "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]} for n in names]})
        for version in ("abc", "-1", "1x", "007"):
            request = pb.ModelInferRequest(model_name="add_sub_py", model_version=version)
            for name in names:
                request.inputs.add(name=name, datatype="FP32", shape=[4]).contents.fp32_contents[:] = [1, 2, 3, 4]
            code, details = over_grpc("ModelInfer", request)
            answers[f"infer {version}"] = (over_http(f"/models/add_sub_py/versions/{version}/infer", body.encode()),
                                           code if code == "OK" else (code, details))
        # the ensemble follows its composing model: unloaded with it, loaded again (fresh statistics) with it
        ens_body = json.dumps({"inputs": [{"name": n, "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}
                                          for n in ("IN0", "IN1")]}).encode()
        ens_request = pb.ModelInferRequest(model_name="ens")
        for name in ("IN0", "IN1"):
            ens_request.inputs.add(name=name, datatype="FP32", shape=[4]).contents.fp32_contents[:] = [1, 2, 3, 4]

        def ensemble_answers() -> tuple[object, ...]:
            code, infer = over_grpc("ModelInfer", ens_request)
            stats = httpx.get(f"{base}/models/ens/stats", timeout=60)
            return (httpx.get(f"{base}/models/ens/ready", timeout=60).status_code,
                    over_grpc("ModelReady", pb.ModelReadyRequest(name="ens")),
                    httpx.get(f"{base}/models/ens", timeout=60).status_code, over_http("/models/ens/infer", ens_body)[0],
                    (code, infer if code != "OK" else infer["outputs"][0]["name"]),
                    (stats.status_code, [row["inference_count"] for row in stats.json().get("model_stats", [])]))

        def settled_index() -> list[dict]:  # tritonserver unloads a python model in the background: UNLOADING a while
            deadline = time.monotonic() + 30
            rows = over_http("/repository/index")[1]
            while any(row.get("state") == "UNLOADING" for row in rows) and time.monotonic() < deadline:
                time.sleep(0.1)
                rows = over_http("/repository/index")[1]
            return masked(rows)

        answers["ensemble before"] = ensemble_answers()
        answers["composing unload"] = over_http("/repository/models/add_sub_py/unload")
        answers["index after composing unload"] = settled_index()
        answers["ensemble after composing unload"] = ensemble_answers()
        answers["composing load"] = over_grpc("RepositoryModelLoad", load(model_name="add_sub_py"))
        answers["index after composing load"] = settled_index()
        answers["ensemble after composing load"] = ensemble_answers()
    return answers


_IO_FLAGS = {"is_shape_tensor": False, "allow_ragged_batch": False, "optional": False, "is_non_linear_format_io": False}
_UNAVAILABLE_ENS = ("NOT_FOUND", "Request for unknown model: 'ens' has no available versions")


def _index_rows(add_sub: tuple[str, ...], ens: tuple[str, ...]) -> list[dict]:
    """The index rows of ``_side_by_side_answers``' repository: add_sub_py's and ens' (state, reason) as given."""
    def row(name: str, state: tuple[str, ...]) -> dict:
        return {"name": name, "version": "1", "state": state[0], **({"reason": state[1]} if state[1:] else {})}

    return [row("add_sub_py", add_sub), row("broken_py", ("UNAVAILABLE", "...")), {"name": "double_py"},
            row("ens", ens)]


#: tritonserver 2.51's answers to ``_side_by_side_answers`` (recorded with the slow test's server)
_SIDE_BY_SIDE_EXPECTED: dict[str, object] = {
    "failed load": (400, "INVALID_ARGUMENT"),
    "index http": _index_rows(("READY",), ("READY",)),
    "index grpc": _index_rows(("READY",), ("READY",)),
    "ensemble config http": {
        "name": "ens", "platform": "ensemble", "backend": "", "runtime": "",
        "version_policy": {"latest": {"num_versions": 1}}, "max_batch_size": 0,
        "input": [{"name": name, "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [4], **_IO_FLAGS}
                  for name in ("IN0", "IN1")],
        "output": [{"name": "SUM", "data_type": "TYPE_FP32", "dims": [4], "label_filename": "",
                    "is_shape_tensor": False, "is_non_linear_format_io": False}],
        "batch_input": [], "batch_output": [],
        "ensemble_scheduling": {"step": [{"model_name": "add_sub_py", "model_version": -1,
                                          "input_map": {"INPUT0": "IN0", "INPUT1": "IN1"},
                                          "output_map": {"OUTPUT0": "SUM"}, "model_namespace": ""}]},
        "instance_group": [], "default_model_filename": "", "cc_model_filenames": {}, "metric_tags": {},
        "parameters": {}, "model_warmup": [], "model_transaction_policy": {"decoupled": False}},
    "ensemble config grpc": ("OK", {"config": {
        "name": "ens", "platform": "ensemble", "versionPolicy": {"latest": {"numVersions": 1}},
        "input": [{"name": "IN0", "dataType": "TYPE_FP32", "dims": ["4"]},
                  {"name": "IN1", "dataType": "TYPE_FP32", "dims": ["4"]}],
        "output": [{"name": "SUM", "dataType": "TYPE_FP32", "dims": ["4"]}],
        "ensembleScheduling": {"step": [{"modelName": "add_sub_py", "modelVersion": "-1",
                                         "inputMap": {"INPUT0": "IN0", "INPUT1": "IN1"},
                                         "outputMap": {"OUTPUT0": "SUM"}}]},
        "modelTransactionPolicy": {}}}),
    "unknown load": ((500, {"error": "failed to load 'nope', failed to poll from model repository"}),
                     ("INTERNAL", "failed to load 'nope', failed to poll from model repository")),
    "infer abc": ((404, {"error": "Not Found"}),
                  ("INVALID_ARGUMENT", ("failed to get model version from specified version string 'abc' "
                                        "(details: stol), version should be an integral value > 0"))),
    "infer -1": ((404, {"error": "Not Found"}),
                 ("INVALID_ARGUMENT",
                  "invalid model version specified '-1' , version should be an integral value > 0")),
    "infer 1x": ((404, {"error": "Not Found"}), "OK"),
    "infer 007": ((404, {"error": "Request for unknown model: 'add_sub_py' version 7 is not found"}),
                  ("NOT_FOUND", "Request for unknown model: 'add_sub_py' version 7 is not found")),
    "ensemble before": (200, ("OK", {"ready": True}), 200, 200, ("OK", "SUM"), (200, [1])),
    "composing unload": (200, None),
    "index after composing unload": _index_rows(("UNAVAILABLE", "unloaded"), ("UNAVAILABLE", "unloaded")),
    "ensemble after composing unload": (400, ("OK", {}), 404, 404, _UNAVAILABLE_ENS, (400, [])),
    "composing load": ("OK", {}),
    "index after composing load": _index_rows(("READY",), ("READY",)),
    "ensemble after composing load": (200, ("OK", {"ready": True}), 200, 200, ("OK", "SUM"), (200, [1])),
}


def _side_by_side_repository(path):
    from support.server import DEFAULT_MODELS, copy_models

    repository = copy_models(path / "models", DEFAULT_MODELS, "add_sub_py", "double_py")
    write_model(repository, "broken_py", _BROKEN_PY, files={"1/model.py": "raise RuntimeError('broken on purpose')\n"})
    write_model(repository, "ens", _ADD_SUB_ENSEMBLE)
    return repository


def test_answers_match_nvidia_tritons(threaded_server, tmp_path):
    """Index rows, an ensemble's served config, loading an unknown model, infer with non-numeric versions and an
    ensemble over an unloaded model, over HTTP and gRPC, as tritonserver 2.51 answers them (each differed before)."""
    server = threaded_server([_side_by_side_repository(tmp_path)], model_control_mode="explicit",
                             load_models=("add_sub_py", "ens"))
    assert _side_by_side_answers(server.server.http_port, server.server.grpc_port) == _SIDE_BY_SIDE_EXPECTED


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_triton_answers_as_recorded(tmp_path):
    from support.triton import running_triton

    with running_triton(_side_by_side_repository(tmp_path), ["add_sub_py", "ens"], "--exit-on-error=false") as (
            http, grpc_port, _):
        assert _side_by_side_answers(http, grpc_port) == _SIDE_BY_SIDE_EXPECTED


def _override_kept_answers(http_port: int) -> dict[str, object]:
    """'ens' loaded with a config override, then its composing model unloaded and loaded again: what 'ens' is."""
    import httpx

    base = f"http://127.0.0.1:{http_port}/v2"
    override = {"platform": "ensemble", "max_batch_size": 0,
                "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("IN0", "IN1")],
                "output": [{"name": "SUM", "data_type": "TYPE_FP32", "dims": [4]}],
                "ensemble_scheduling": {"step": [{"model_name": "add_sub_py", "model_version": -1,
                                                  "input_map": {"INPUT0": "IN0", "INPUT1": "IN1"},
                                                  "output_map": {"OUTPUT0": "SUM"}}]},
                "parameters": {"origin": {"string_value": "override"}}}

    def ensemble() -> tuple[int, object]:
        response = httpx.get(f"{base}/models/ens/config", timeout=60)
        return response.status_code, response.json().get("parameters")

    def settled() -> None:  # tritonserver unloads a python model in the background
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
                row.get("state") == "UNLOADING" for row in httpx.post(f"{base}/repository/index", timeout=60).json()):
            time.sleep(0.1)

    answers: dict[str, object] = {}
    load = {"parameters": {"config": json.dumps(override)}}
    answers["override load"] = httpx.post(f"{base}/repository/models/ens/load", json=load, timeout=60).status_code
    answers["overridden"] = ensemble()
    answers["composing unload"] = httpx.post(f"{base}/repository/models/add_sub_py/unload", timeout=60).status_code
    settled()
    answers["unloaded"] = ensemble()[0]
    answers["composing load"] = httpx.post(f"{base}/repository/models/add_sub_py/load", timeout=60).status_code
    answers["back"] = ensemble()
    return answers


#: tritonserver 2.51's answers to ``_override_kept_answers``
_OVERRIDE_KEPT_EXPECTED: dict[str, object] = {
    "override load": 200, "overridden": (200, {"origin": {"string_value": "override"}}), "composing unload": 200,
    "unloaded": 404, "composing load": 200, "back": (200, {"origin": {"string_value": "override"}}),
}


def _override_kept_repository(path):
    from support.server import DEFAULT_MODELS, copy_models

    repository = copy_models(path / "models", DEFAULT_MODELS, "add_sub_py")
    write_model(repository, "ens", _ADD_SUB_ENSEMBLE)
    return repository


def test_ensemble_back_with_its_composing_model_keeps_its_override_like_nvidia_tritons(threaded_server, tmp_path):
    """The ensemble that comes back with its composing model is the one loaded with a config override, as in
    tritonserver 2.51; Ferry read it from the repository again (core/test_registry_ensembles.py has more)."""
    server = threaded_server([_override_kept_repository(tmp_path)], model_control_mode="explicit",
                             load_models=("add_sub_py", "ens"))
    assert _override_kept_answers(server.server.http_port) == _OVERRIDE_KEPT_EXPECTED


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_triton_keeps_the_override_as_recorded(tmp_path):
    from support.triton import running_triton

    with running_triton(_override_kept_repository(tmp_path), ["add_sub_py", "ens"]) as (http, _, _):
        assert _override_kept_answers(http) == _OVERRIDE_KEPT_EXPECTED


# ---- what a load of a loaded model does (tritonserver 2.51: model_lifecycle.cc AsyncLoad) -------------------------

_PROBE_PY = '''
from pathlib import Path

import triton_python_backend_utils as pb_utils

LOG = Path(__file__).resolve().parents[2] / "events.log"


def _log(text):
    with open(LOG, "a") as f:
        f.write(text + "\\n")


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]
        _log("init v" + args["model_version"] + " " + self.name)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]

    def finalize(self):
        _log("fini " + self.name)
'''


def _probe_config(count: int = 1, policy: str = "", comment: str = "") -> str:
    return f"""name: "probe"
backend: "python"
max_batch_size: 4
{policy}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
{comment}
"""


def _reload_answers(http_port: int, repository, warm_up: bool) -> dict[str, object]:
    """Loads of the loaded python model 'probe' after edits of its repository, each answered by what was initialized
    (instances' ``initialize``), whether each version kept its statistics, and the served instance groups and
    parameters. ``warm_up``: one more load after a version's first, whose answer is not kept (tritonserver's python stub
    writes __pycache__ into the version folder at its first load, which makes the next load a fresh one of that
    version; Ferry writes no bytecode)."""
    import httpx

    base = f"http://127.0.0.1:{http_port}/v2"
    log = repository / "events.log"
    config_file = repository / "probe" / "config.pbtxt"
    seen = [0]

    def inits(finalized: int = 0) -> list[str]:
        """The instances initialized since the last look; with ``finalized``, that many finalized ones too (waited
        for: both servers may finalize removed instances after the load answered)."""
        deadline = time.monotonic() + 30
        while True:
            lines = log.read_text().splitlines() if log.exists() else []
            if sum(line.startswith("fini") for line in lines[seen[0]:]) >= finalized or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        new, seen[0] = lines[seen[0]:], len(lines)
        return sorted(line for line in new if line.startswith("init") or (finalized and line.startswith("fini")))

    def infer(versions=("2",)) -> None:
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        for version in versions:
            response = httpx.post(f"{base}/models/probe/versions/{version}/infer", json=body, timeout=60)
            assert response.status_code == 200

    def load(finalized: int = 0, **parameters) -> tuple[object, ...]:
        response = httpx.post(f"{base}/repository/models/probe/load", timeout=120,
                              json={"parameters": parameters} if parameters else None)
        stats = httpx.get(f"{base}/models/probe/stats", timeout=60).json()["model_stats"]
        config = httpx.get(f"{base}/models/probe/config", timeout=60).json()
        # every version served is asked once after each load: a version whose statistics were kept counted some
        answer = (response.status_code, inits(finalized), {row["version"]: row["inference_count"] > 0 for row in stats},
                  [(group["name"], group["count"]) for group in config["instance_group"]], config.get("parameters"))
        infer([row["version"] for row in stats])
        return answer

    answers: dict[str, object] = {"first": inits()}
    infer()
    if warm_up:
        load()
        infer()
    answers["unchanged"] = load()
    config_file.write_text(_probe_config(comment="# a comment"))
    _touch(config_file)
    answers["comment"] = load()
    config_file.write_text(_probe_config(count=2))
    _touch(config_file)
    answers["two instances"] = load()
    config_file.write_text(_probe_config(count=3))
    _touch(config_file)
    answers["three instances"] = load()
    config_file.write_text(_probe_config(count=1))
    _touch(config_file)
    answers["one instance"] = load(finalized=2)
    config_file.write_text(_probe_config(policy="version_policy: { all {} }", count=2))
    _touch(config_file)
    answers["all versions"] = load()
    if warm_up:  # version 1's first load wrote its __pycache__ (see the docstring)
        load()
    _touch(repository / "probe" / "2" / "model.py")
    answers["model.py of version 2 newer"] = load()
    (repository / "probe" / "notes.txt").write_text("x")
    _touch(repository / "probe" / "notes.txt")
    answers["new file beside the config"] = load()
    config = httpx.get(f"{base}/models/probe/config", timeout=60).json()
    answers["identical config override"] = load(config=json.dumps(config))
    config["parameters"] = {"k": {"string_value": "v"}}
    answers["other config override"] = load(config=json.dumps(config))
    answers["no override after one"] = load()
    _touch(config_file)
    answers["config newer than the override"] = load()
    return answers


def _probe_repository(path):
    write_model(path, "probe", _probe_config(), files={"1/model.py": _PROBE_PY, "2/model.py": _PROBE_PY}, versions=(1, 2))
    return path


_ALL_FOUR = ["init v1 probe_0_0", "init v1 probe_0_1", "init v2 probe_0_0", "init v2 probe_0_1"]
#: tritonserver 2.51's answers to ``_reload_answers`` (but "first"): (status, instances initialized / finalized,
#: {version: statistics kept}, instance groups, parameters)
_RELOAD_EXPECTED: dict[str, object] = {
    # nothing initialized again, the statistics kept
    "unchanged": (200, [], {"2": True}, [("probe_0", 1)], {}),
    "comment": (200, [], {"2": True}, [("probe_0", 1)], {}),
    # an instance-group change keeps the instances whose group setting is the same (the last kept first, under its
    # own name) and creates or finalizes only the difference; the version keeps its statistics
    "two instances": (200, ["init v2 probe_0_1"], {"2": True}, [("probe_0", 2)], {}),
    "three instances": (200, ["init v2 probe_0_2"], {"2": True}, [("probe_0", 3)], {}),
    "one instance": (200, ["fini probe_0_0", "fini probe_0_1"], {"2": True}, [("probe_0", 1)], {}),
    "all versions": (200, ["init v1 probe_0_0", "init v1 probe_0_1", "init v2 probe_0_1"], {"1": False, "2": True},
                     [("probe_0", 2)], {}),
    "model.py of version 2 newer": (200, ["init v2 probe_0_0", "init v2 probe_0_1"], {"1": True, "2": False},
                                    [("probe_0", 2)], {}),
    "new file beside the config": (200, _ALL_FOUR, {"1": False, "2": False}, [("probe_0", 2)], {}),
    "identical config override": (200, [], {"1": True, "2": True}, [("probe_0", 2)], {}),
    "other config override": (200, _ALL_FOUR, {"1": False, "2": False}, [("probe_0", 2)],
                              {"k": {"string_value": "v"}}),
    "no override after one": (200, [], {"1": True, "2": True}, [("probe_0", 2)], {"k": {"string_value": "v"}}),
    "config newer than the override": (200, _ALL_FOUR, {"1": False, "2": False}, [("probe_0", 2)], {}),
}


def test_loading_a_loaded_model_updates_it_in_place_as_nvidia_tritons(threaded_server, tmp_path):
    """A load of a loaded model creates a version again only where its files are newer, or its config differs in more
    than instance_group / version_policy; otherwise it keeps serving with its statistics (and nothing at all happens
    where no file of the model is newer), as tritonserver 2.51. Ferry created every version again on every load."""
    server = threaded_server([_probe_repository(tmp_path)], model_control_mode="explicit", load_models=("probe",))
    got = _reload_answers(server.server.http_port, tmp_path, warm_up=False)
    got.pop("first")
    assert got == _RELOAD_EXPECTED


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_triton_updates_a_loaded_model_as_recorded(tmp_path):
    import subprocess

    from support.server import free_ports, kill_process_group, wait_ready
    from support.triton import triton_args, triton_or_skip, triton_repositories

    located = triton_or_skip()
    repository = triton_repositories([_probe_repository(tmp_path)])[0]  # the copy tritonserver serves
    http, grpc_port, metrics = free_ports(3)
    args = triton_args([repository], ["probe"], http_port=http, grpc_port=grpc_port, metrics_port=metrics)
    proc = subprocess.Popen(located.command(*args, "--exit-timeout-secs=2"), env=located.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_ready(http, proc, timeout=60)
        got = _reload_answers(http, repository, warm_up=True)
    finally:
        kill_process_group(proc)
    got.pop("first")
    assert got == _RELOAD_EXPECTED


# ---- load errors worded as tritonserver 2.51 words them ----------------------------------------------------------

_LOAD_ERROR_CONFIG = """
name: "{name}"
backend: "{backend}"
{extra}input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
_INIT_RAISES = """
class TritonPythonModel:
    def initialize(self, args):
        raise ValueError("boom in initialize v" + args["model_version"])

    def execute(self, requests):
        return []
"""
_ADD_SUB_PY = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
#: model -> (backend, config extra, files); each fails to load (e_two_mixed: its version 2 only)
_LOAD_ERROR_MODELS = {
    "e_init_raises": ("python", "", {"1/model.py": _INIT_RAISES}),
    "e_syntax": ("python", "", {"1/model.py": "import x\ndef (:\n"}),
    "e_import_raises": ("python", "", {"1/model.py": "raise RuntimeError('broken on purpose')\n"}),
    "e_backend": ("nonexistent_backend", "", {"1/model.py": _ADD_SUB_PY}),
    "e_two": ("python", "version_policy: { all { } }\n", {"1/model.py": _INIT_RAISES, "2/model.py": _INIT_RAISES}),
    "e_two_mixed": ("python", "version_policy: { all { } }\n", {"1/model.py": _ADD_SUB_PY, "2/model.py": _INIT_RAISES}),
}


def _without_traceback(text: str) -> str:
    """tritonserver's python errors carry the model's traceback (``\\n\\nAt:\\n  <file>(<line>): <function>\\n``);
    Ferry logs it instead. Failed versions' clauses sorted (tritonserver's order varies from call to call); a syntax
    error's line number masked (tritonserver's copy of model.py has one more line: tests/support/triton.py)."""
    import re

    text = re.sub(r"\n\nAt:\n(?:  [^\n]*\n)+", "", text)
    text = re.sub(r"\(model\.py, line \d+\)", "(model.py, line N)", text)
    head, sep, rest = text.partition(": version ")
    if not sep:
        return text
    clauses = re.split(r";(?=version \d+ is at UNAVAILABLE state: )", "version " + rest.removesuffix(";\n"))
    return head + ": " + "".join(clause + ";" for clause in sorted(clauses)) + "\n"


def _load_error_answers(http_port: int, grpc_port: int) -> dict[str, object]:
    import grpc
    import httpx
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc

    answers: dict[str, object] = {}
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for name in _LOAD_ERROR_MODELS:
            response = httpx.post(f"http://127.0.0.1:{http_port}/v2/repository/models/{name}/load", timeout=120)
            try:
                stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=name), timeout=120)
                over_grpc: object = "OK"
            except grpc.RpcError as error:
                over_grpc = (error.code().name, _without_traceback(error.details()))
            answers[name] = ((response.status_code, _without_traceback(response.json()["error"])), over_grpc)
        rows = httpx.post(f"http://127.0.0.1:{http_port}/v2/repository/index", timeout=60).json()
        answers["index"] = {(row["name"], row["version"]): _without_traceback(row["reason"]) for row in rows
                            if row["name"] in _LOAD_ERROR_MODELS and row.get("reason", "unloaded") != "unloaded"}
    return answers


def _load_failed(name: str, *failed: str) -> str:
    """tritonserver's message when versions 1, 2, ... of ``name`` fail with these reasons (None: loaded)."""
    return f"load failed for model '{name}': " + "".join(
        f"version {version} is at UNAVAILABLE state: {reason};" for version, reason in enumerate(failed, 1)
        if reason) + "\n"


_BOOM = "Internal: ValueError: boom in initialize v{}"
_NO_BACKEND = ("Invalid argument: unable to find backend library for backend 'nonexistent_backend', try specifying "
               "runtime on the model configuration.")
#: model -> the reasons its versions 1, 2 failed for, under tritonserver 2.51 (None: loaded)
_LOAD_ERROR_REASONS: dict[str, tuple[str | None, ...]] = {
    "e_init_raises": (_BOOM.format(1),),
    "e_syntax": ("Internal: SyntaxError: invalid syntax (model.py, line N)",),
    "e_import_raises": ("Internal: RuntimeError: broken on purpose",),
    "e_backend": (_NO_BACKEND,),
    "e_two": (_BOOM.format(1), _BOOM.format(2)),
    "e_two_mixed": (None, _BOOM.format(2)),
}


def _load_errors_expected() -> dict[str, object]:
    """tritonserver 2.51's answers to ``_load_error_answers``: the same words over HTTP (400) and gRPC
    (INVALID_ARGUMENT), the index reason the part after "state: "."""
    expected: dict[str, object] = {}
    for name, reasons in _LOAD_ERROR_REASONS.items():
        message = _load_failed(name, *reasons)
        expected[name] = ((400, message), ("INVALID_ARGUMENT", message))
    expected["index"] = {(name, str(version)): reason for name, reasons in sorted(_LOAD_ERROR_REASONS.items())
                         for version, reason in enumerate(reasons, 1) if reason}
    return expected


def _load_error_repository(path):
    for name, (backend, extra, files) in _LOAD_ERROR_MODELS.items():
        write_model(path, name, _LOAD_ERROR_CONFIG.format(name=name, backend=backend, extra=extra), files=files)
    return path


def test_load_errors_worded_as_nvidia_tritons(threaded_server, tmp_path):
    """A python model raising in initialize or on import, a syntax error, an unknown backend, and two versions
    failing: `load failed for model '<m>': version N is at UNAVAILABLE state: <Code>: <cause>;` per failed version,
    HTTP 400 / gRPC INVALID_ARGUMENT, the index reason the part after "state: " (tracebacks aside)."""
    server = threaded_server([_load_error_repository(tmp_path)], model_control_mode="explicit")
    got = _load_error_answers(server.server.http_port, server.server.grpc_port)
    assert got["e_init_raises"][0] == (400, "load failed for model 'e_init_raises': version 1 is at UNAVAILABLE "
                                            "state: Internal: ValueError: boom in initialize v1;\n")
    assert got["index"][("e_two", "2")] == "Internal: ValueError: boom in initialize v2"
    assert got == _load_errors_expected()


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_triton_words_load_errors_as_recorded(tmp_path):
    from support.triton import running_triton

    with running_triton(_load_error_repository(tmp_path), [], "--exit-on-error=false") as (http, grpc_port, _):
        assert _load_error_answers(http, grpc_port) == _load_errors_expected()
