"""Ensembles through tritonclient: python -> ONNX -> python pipeline, concurrency, statistics, load-time DAG errors.

Composing models: ``ens_pre`` and ``ens_post`` (python, tests/serving_pod/data/ensemble), ``add_sub``
(ONNX, built by ``support.models``), ``ferry_test`` identity models for structure and timing.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from support.models import make_add_sub_model
from support.server import write_model

DATA = Path(__file__).resolve().parents[1] / "data" / "ensemble"

PIPELINE = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "RAW" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OFFSET" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "PRODUCT" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] }
]
ensemble_scheduling {
  step [
    { model_name: "ens_pre" model_version: -1
      input_map { key: "RAW" value: "RAW" } output_map { key: "SCALED" value: "scaled" } },
    { model_name: "add_sub" model_version: -1
      input_map [ { key: "INPUT0" value: "scaled" }, { key: "INPUT1" value: "OFFSET" } ]
      output_map [ { key: "OUTPUT0" value: "sum" }, { key: "OUTPUT1" value: "diff" } ] },
    { model_name: "ens_post" model_version: -1
      input_map [ { key: "SUM" value: "sum" }, { key: "DIFF" value: "diff" } ]
      output_map [ { key: "PRODUCT" value: "PRODUCT" }, { key: "LABEL" value: "LABEL" } ] }
  ]
}
"""


def _identity(name: str, delay_ms: int = 0, dims: str = "[ 4 ]", datatype: str = "TYPE_FP32") -> str:
    return f"""
name: "{name}"
backend: "ferry_test"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: {datatype} dims: {dims} }} ]
output [ {{ name: "OUTPUT0" data_type: {datatype} dims: {dims} }} ]
parameters [ {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }} ]
"""


def _ensemble(name: str, steps: str, inputs: str = '{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }',
              outputs: str = '{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }') -> str:
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {inputs} ]
output [ {outputs} ]
ensemble_scheduling {{ step [ {steps} ] }}
"""


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    imap = ", ".join(f'{{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    omap = ", ".join(f'{{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" input_map [ {imap} ] output_map [ {omap} ] }}'


#: broken ensemble -> (config, fragments the load error must contain)
BROKEN = {
    "broken_missing": (
        _ensemble("broken_missing", _step("ident_a", {"INPUT0": "IN"}, {"OUTPUT0": "mid"}) + ","
                  + _step("ident_b", {"INPUT0": "mdi"}, {"OUTPUT0": "OUT"})),
        ["step 1 (model 'ident_b')", "'INPUT0'", "'mdi'", "neither an ensemble input nor an output of any step"],
    ),
    "broken_cycle": (
        _ensemble("broken_cycle", _step("ident_a", {"INPUT0": "loop_b"}, {"OUTPUT0": "loop_a"}) + ","
                  + _step("ident_b", {"INPUT0": "loop_a"}, {"OUTPUT0": "loop_b"}) + ","
                  + _step("ident_c", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})),
        ["has a cycle", "step 0 (model 'ident_a') reads 'loop_b'", "step 1 (model 'ident_b') reads 'loop_a'"],
    ),
    "broken_dtype": (
        _ensemble("broken_dtype", _step("ident_a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
                  inputs='{ name: "IN" data_type: TYPE_INT32 dims: [ 4 ] }'),
        ["step 0 (model 'ident_a')", "ensemble tensor 'IN'", "inconsistent data type: TYPE_INT32", "TYPE_FP32"],
    ),
    "broken_shape": (
        _ensemble("broken_shape", _step("ident_a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
                  outputs='{ name: "OUT" data_type: TYPE_FP32 dims: [ 3 ] }'),
        ["step 0 (model 'ident_a')", "ensemble tensor 'OUT'", "inconsistent shape: [-1, 3]", "[-1, 4]"],
    ),
    "broken_input_name": (
        _ensemble("broken_input_name", _step("ident_a", {"NOPE": "IN"}, {"OUTPUT0": "OUT"})),
        ["step 0 (model 'ident_a')", "ensemble tensor 'IN' is mapping to non-existing input 'NOPE'"],
    ),
    "broken_output_name": (
        _ensemble("broken_output_name", _step("ident_a", {"INPUT0": "IN"}, {"OUTPUT9": "OUT"})),
        ["step 0 (model 'ident_a')", "ensemble tensor 'OUT' is mapped from non-existing output 'OUTPUT9'"],
    ),
    "broken_unwritten": (
        _ensemble("broken_unwritten", _step("ident_a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
                  outputs='{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "EXTRA" data_type: TYPE_FP32 dims: [ 4 ] }'),
        ["output 'EXTRA' for ensemble 'broken_unwritten' is not written"],
    ),
    "broken_composing": (
        _ensemble("broken_composing", _step("no_such_model", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})),
        ["ensemble broken_composing contains models that are not available or ambiguous: no_such_model"],
    ),
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("ensemble_repo")
    for name in ("ens_pre", "ens_post"):
        shutil.copytree(DATA / name, repo / name)
    make_add_sub_model(repo / "add_sub", "TYPE_FP32", dims=(4,), max_batch=8)
    write_model(repo, "pipeline", PIPELINE)
    for name in ("ident_a", "ident_b", "ident_c"):
        write_model(repo, name, _identity(name))
    for name in ("slow_left", "slow_right"):
        write_model(repo, name, _identity(name, delay_ms=500))
    write_model(repo, "fan_out", _ensemble(
        "fan_out",
        _step("slow_left", {"INPUT0": "IN"}, {"OUTPUT0": "LEFT"}) + "," + _step("slow_right", {"INPUT0": "IN"}, {"OUTPUT0": "RIGHT"}),
        outputs='{ name: "LEFT" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "RIGHT" data_type: TYPE_FP32 dims: [ 4 ] }',
    ))
    # a chain listed backwards: the step reading the ensemble input comes last in the config
    write_model(repo, "backwards", _ensemble(
        "backwards",
        _step("ident_c", {"INPUT0": "second"}, {"OUTPUT0": "OUT"}) + "," + _step("ident_b", {"INPUT0": "first"},
                                                                             {"OUTPUT0": "second"})
        + "," + _step("ident_a", {"INPUT0": "IN"}, {"OUTPUT0": "first"}),
    ))
    for name, (config, _) in BROKEN.items():
        write_model(repo, name, config)
    return repo


@pytest.fixture(scope="module")
def server(repo):
    from support.server import ServerThread, make_options

    thread = ServerThread(make_options([repo], model_control_mode="explicit"))
    handle = thread.start()
    yield handle
    thread.stop()


def _inputs(module, raw: np.ndarray, offset: np.ndarray):
    tensors = [module.InferInput("RAW", list(raw.shape), "FP32"), module.InferInput("OFFSET", list(offset.shape), "FP32")]
    tensors[0].set_data_from_numpy(raw)
    tensors[1].set_data_from_numpy(offset)
    return tensors


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_python_onnx_python_pipeline(server, protocol: str) -> None:
    client, module = server.client(protocol), server.module(protocol)
    client.load_model("pipeline")  # explicit mode: its composing models load with it, as in Triton
    for composing in ("ens_pre", "add_sub", "ens_post"):
        assert client.is_model_ready(composing)
    raw = np.array([[1, 2, 3, 4], [-1, -2, -3, -4]], np.float32)
    offset = np.array([[10, 10, 0, 0], [0, 0, 0, 1]], np.float32)
    result = client.infer("pipeline", _inputs(module, raw, offset))
    np.testing.assert_allclose(result.as_numpy("PRODUCT"), (2 * raw) ** 2 - offset**2)
    assert result.as_numpy("LABEL").reshape(-1).tolist() == [b"neg", b"pos"]
    only = client.infer("pipeline", _inputs(module, raw, offset), outputs=[module.InferRequestedOutput("LABEL")])
    assert only.as_numpy("PRODUCT") is None and only.as_numpy("LABEL") is not None
    client.close()


def test_ensemble_metadata_config_and_statistics(server) -> None:
    client = server.client("http")
    client.load_model("pipeline")
    metadata = client.get_model_metadata("pipeline")
    assert metadata["platform"] == "ensemble"
    assert [(t["name"], t["shape"]) for t in metadata["inputs"]] == [("RAW", [-1, 4]), ("OFFSET", [-1, 4])]
    config = client.get_model_config("pipeline")
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == ["ens_pre", "add_sub", "ens_post"]

    def counts(name: str) -> tuple[int, int]:
        stats = client.get_inference_statistics(name)["model_stats"][0]
        return stats["inference_stats"]["success"]["count"], stats["execution_count"]

    before = {name: counts(name) for name in ("pipeline", "ens_pre", "add_sub", "ens_post")}
    raw = np.ones((1, 4), np.float32)
    for _ in range(3):
        client.infer("pipeline", _inputs(httpclient_module(), raw, raw))
    for name in ("pipeline", "ens_pre", "add_sub", "ens_post"):
        success, executions = counts(name)
        assert success - before[name][0] == 3, name
        assert executions - before[name][1] == 3, name
    client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ensemble_config_has_tritons_transaction_policy(server, protocol: str) -> None:
    """tritonserver 2.51 serves every ensemble's config with the policy its ensemble validation sets:
    {"decoupled": false} over HTTP, a present (empty) message over gRPC; the config had none."""
    client = server.client(protocol)
    client.load_model("fan_out")  # its config.pbtxt has no model_transaction_policy
    if protocol == "http":
        assert client.get_model_config("fan_out")["model_transaction_policy"] == {"decoupled": False}
    else:
        config = client.get_model_config("fan_out").config
        assert config.HasField("model_transaction_policy") and not config.model_transaction_policy.decoupled
    client.close()


def httpclient_module():
    import tritonclient.http as httpclient

    return httpclient


def test_independent_steps_run_concurrently(server) -> None:
    client, module = server.client("grpc"), server.module("grpc")
    client.load_model("fan_out")
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor = module.InferInput("IN", [2, 4], "FP32")
    tensor.set_data_from_numpy(data)
    client.infer("fan_out", [tensor])  # warm
    start = time.monotonic()
    result = client.infer("fan_out", [tensor])
    elapsed = time.monotonic() - start
    np.testing.assert_array_equal(result.as_numpy("LEFT"), data)
    np.testing.assert_array_equal(result.as_numpy("RIGHT"), data)
    assert elapsed < 0.9, f"two 500 ms steps took {elapsed:.2f}s: they ran one after the other"
    client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_chain_runs_in_the_order_its_tensors_allow_not_the_configs(server, protocol: str) -> None:
    """Steps one after the other (each reads the one before), listed in the config in the other order: every step
    runs once, in dependency order, and the answer is the input passed through all three."""
    client, module = server.client(protocol), server.module(protocol)
    client.load_model("backwards")

    def executions() -> list[int]:  # gRPC's JSON writes uint64 as strings and leaves zeros out
        json = {"as_json": True} if protocol == "grpc" else {}
        return [int(client.get_inference_statistics(name, **json)["model_stats"][0].get("execution_count", 0))
                for name in ("ident_a", "ident_b", "ident_c")]

    before = executions()
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = module.InferInput("IN", [3, 4], "FP32")
    tensor.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("backwards", [tensor]).as_numpy("OUT"), data)
    assert [after - b for after, b in zip(executions(), before)] == [1, 1, 1]
    client.close()


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_ensemble_fails_to_load_naming_step_and_tensor(server, name: str) -> None:
    client = server.client("grpc")
    with pytest.raises(InferenceServerException) as error:
        client.load_model(name)
    message = str(error.value)
    for fragment in BROKEN[name][1]:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert not client.is_model_ready(name)
    index = {row.name: row for row in client.get_model_repository_index().models}
    assert index[name].state == "UNAVAILABLE" and BROKEN[name][1][0] in index[name].reason
    client.close()


def test_step_failure_fails_the_request_with_the_step_error(server, repo) -> None:
    """A failing step fails the ensemble's request with that step's error (an unloaded step model no longer can:
    the ensemble is unloaded with it, as in Triton)."""
    write_model(repo, "failing", _identity("failing").replace(
        "parameters [", 'parameters [ { key: "fail_on_value" value: { string_value: "7" } },'))
    write_model(repo, "failing_ens", _ensemble("failing_ens", _step("failing", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})))
    client, module = server.client("http"), server.module("http")
    client.load_model("failing_ens")
    tensor = module.InferInput("IN", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), 7, np.float32))
    with pytest.raises(InferenceServerException, match="ferry_test model failed on value 7"):
        client.infer("failing_ens", [tensor])
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    assert client.infer("failing_ens", [tensor]).as_numpy("OUT").tolist() == [[1, 1, 1, 1]]
    client.close()


def test_unload_dependents_unloads_the_composing_models(server) -> None:
    client = server.client("http")
    client.load_model("fan_out")
    assert client.is_model_ready("slow_left") and client.is_model_ready("slow_right")
    client.unload_model("fan_out", unload_dependents=True)
    assert not client.is_model_ready("fan_out")
    assert not client.is_model_ready("slow_left") and not client.is_model_ready("slow_right")
    client.load_model("fan_out")  # and they come back with it
    assert client.is_model_ready("slow_left")
    client.unload_model("fan_out")  # without the flag the composing models stay
    assert client.is_model_ready("slow_left") and not client.is_model_ready("fan_out")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_queue_time_starts_once_the_request_is_admitted(server, protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As Triton's (its queue starts as the scheduler takes the request, after the request was validated), the
    queue time of an ensemble and of a model starts when the engine hands the admitted request to the model's
    scheduler: an admission that takes 50 ms counts in the request's time (``success``), not in ``queue``."""
    from serving_pod.core.engine import Engine

    client = server.client(protocol)
    module = server.module(protocol)
    for name in ("backwards", "ident_a"):
        client.load_model(name)
    admit = Engine._checked

    def slow_admission(self, request):
        time.sleep(0.05)
        return admit(self, request)

    def totals(name: str) -> tuple[int, int, int]:
        stats = server.client("http").get_inference_statistics(name)["model_stats"][0]["inference_stats"]
        return int(stats["success"]["count"]), int(stats["success"]["ns"]), int(stats["queue"]["ns"])

    before = {name: totals(name) for name in ("backwards", "ident_a")}
    monkeypatch.setattr(Engine, "_checked", slow_admission)
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    for name in ("backwards", "ident_a"):
        tensor = module.InferInput("IN" if name == "backwards" else "INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(data)
        answer = client.infer(name, [tensor]).as_numpy("OUT" if name == "backwards" else "OUTPUT0")
        assert answer.tolist() == data.tolist()
    monkeypatch.undo()
    for name, requests in (("backwards", 1), ("ident_a", 2)):  # ident_a: the ensemble's first step, then alone
        count, success_ns, queue_ns = (now - then for now, then in zip(totals(name), before[name]))
        assert count == requests, name
        assert success_ns >= requests * 50_000_000, name  # each admission counts in its request's time
        assert queue_ns < 50_000_000, name  # not in the queue time
