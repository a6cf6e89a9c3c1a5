"""Model warmup: sample construction as Triton builds it, and readiness held back until samples ran."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.backends import testing
from serving_pod.backends.base import InstanceContext
from serving_pod.core.errors import ModelLoadError, ServerError
from serving_pod.warmup import build_requests, warm_up
from support.server import test_model_config, write_model

BASE = """
name: "m" backend: "ferry_test" max_batch_size: {max_batch}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
        {{ name: "TEXT" data_type: TYPE_STRING dims: [ 2 ] optional: true }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
{extra}
"""


def config(warmup: str, max_batch: int = 8, extra: str = "") -> mc.ModelConfig:
    return text_format.Parse(BASE.format(max_batch=max_batch, extra=f"{extra}\n{warmup}"), mc.ModelConfig())


def sample(inputs: str, batch_size: int = 1, count: int = 0, name: str = "s") -> str:
    return f'model_warmup [ {{ name: "{name}" batch_size: {batch_size} count: {count} inputs {inputs} }} ]'


def fp32(kind: str, dims: str = "[ 3 ]") -> str:
    return f'{{ key: "INPUT0" value {{ data_type: TYPE_FP32 dims: {dims} {kind} }} }}'


def test_zero_data_batch_of_single_element_requests(tmp_path: Path) -> None:
    cfg = config(sample(fp32("zero_data: true"), batch_size=3))
    requests = build_requests(cfg, tmp_path, "1", cfg.model_warmup[0])
    assert len(requests) == 3
    assert all(r.inputs[0].data.shape == (1, 3) and not r.inputs[0].data.any() for r in requests)
    assert requests[0].inputs[0].datatype == "FP32" and requests[0].model_name == "m"


def test_random_data_and_no_batch_dim_without_batching(tmp_path: Path) -> None:
    cfg = config(sample(fp32("random_data: true")), max_batch=0)
    (request,) = build_requests(cfg, tmp_path, "1", cfg.model_warmup[0])
    data = request.inputs[0].data
    assert data.shape == (3,) and data.dtype == np.float32 and ((0 <= data) & (data < 1)).all()


def test_input_data_files_from_the_warmup_folder(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "floats").write_bytes(np.array([1, 2, 3, 99], np.float32).tobytes())
    (tmp_path / "warmup" / "text").write_bytes(b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b"c")))
    inputs = (
        fp32('input_data_file: "floats"')
        + ' inputs { key: "TEXT" value { data_type: TYPE_STRING dims: [ 2 ] input_data_file: "text" } }'
    )
    cfg = config(sample(inputs))
    (request,) = build_requests(cfg, tmp_path, "1", cfg.model_warmup[0])
    tensors = {t.name: t for t in request.inputs}
    assert tensors["INPUT0"].data.tolist() == [[1, 2, 3]]  # extra bytes ignored
    assert tensors["TEXT"].datatype == "BYTES" and tensors["TEXT"].data.tolist() == [[b"ab", b"c"]]


@pytest.mark.parametrize(
    ("inputs", "batch_size", "message"),
    [
        (fp32("zero_data: true", "[ -1 ]"), 1,
         "warmup setting expects all variable-size dimensions are specified for input 'INPUT0'"),
        (fp32('input_data_file: "missing"'), 1, "failed to open text file for read "),
        (fp32('input_data_file: "small"'), 1, "[request id: <id_unknown>] warmup setting expects 12 bytes, but the "
                                              "data provided from small only has 4 bytes"),
        (fp32('input_data_file: "../config.pbtxt"'), 1, "outside the model's 'warmup' folder"),
        ('{ key: "INPUT0" value { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }', 1,
         "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'INT32', but model 'm' expects 'FP32'"),
        ('{ key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 1 ] } }', 1,
         "[request id: <id_unknown>] warmup setting expects input 'INPUT0' to have input_data_type set"),
        (fp32("zero_data: true"), 9, "warmup sample 'bad one' of model 'm': batch_size 9 exceeds max_batch_size 8"),
    ],
)
def test_bad_samples_are_refused_in_tritons_words(tmp_path: Path, inputs: str, batch_size: int, message: str) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "small").write_bytes(b"\0" * 4)
    (tmp_path / "config.pbtxt").write_text("")
    cfg = config(sample(inputs, batch_size=batch_size, name="bad one"))
    with pytest.raises(ServerError) as info:
        build_requests(cfg, tmp_path, "1", cfg.model_warmup[0])
    assert message in str(info.value)


def test_an_input_the_config_does_not_declare_goes_to_the_model(tmp_path: Path) -> None:
    """Triton adds it as an override input (``GenerateWarmupData``), unchecked, with the batch dim; Ferry refused
    the sample ("model has no input")."""
    extra = ' inputs { key: "NOPE" value { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true } }'
    cfg = config(sample(fp32("zero_data: true") + extra))
    (request,) = build_requests(cfg, tmp_path, "1", cfg.model_warmup[0])
    assert [(t.name, t.datatype, t.data.shape) for t in request.inputs] == [("INPUT0", "FP32", (1, 3)),
                                                                           ("NOPE", "INT32", (1, 2))]


#: a python model with no inputs that answers the names and shapes of the inputs of the first request it executed
FIRST_SEEN_MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.first = None

    def execute(self, requests):
        if self.first is None:
            self.first = {t.name(): list(t.shape()) for t in requests[0].inputs()}
        text = json.dumps(self.first).encode()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", np.array([text], np.object_))]) for _ in requests]
'''


@pytest.mark.parametrize(("protocol", "isolated"), [("http", False), ("grpc", False), ("grpc", True)])
def test_a_python_model_is_warmed_with_inputs_it_does_not_declare(tmp_path: Path, threaded_server, protocol: str,
                                                                   isolated: bool) -> None:
    """Triton's QA (``L0_backend_python/bls/test.sh``) warms ``bls_model_loading``, which has no inputs, with INPUT0
    and INPUT1 and expects the load to succeed: the model gets them, in the server's process or its own; Ferry
    failed the load."""
    fp32_4 = "value { data_type: TYPE_FP32 dims: 4 zero_data: false }"
    write_model(tmp_path, "no_inputs", f'''name: "no_inputs"
backend: "python"
output [ {{ name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] }} ]
model_warmup [ {{ name: "regular sample" batch_size: 1
  inputs {{ key: "INPUT0" {fp32_4} }} inputs {{ key: "INPUT1" {fp32_4} }} }} ]
parameters {{ key: "FERRY_ISOLATED" value {{ string_value: "{str(isolated).lower()}" }} }}
''', {"1/model.py": FIRST_SEEN_MODEL})
    client = threaded_server([tmp_path], model_control_mode="explicit").client(protocol)
    client.load_model("no_inputs")
    assert client.is_model_ready("no_inputs")
    assert json.loads(client.infer("no_inputs", []).as_numpy("SEEN")[0]) == {"INPUT0": [4], "INPUT1": [4]}


def instances_for(cfg: mc.ModelConfig, count: int = 2) -> list[testing.TestInstance]:
    backend = testing.TestBackend()
    return [backend.create_instance(InstanceContext("m", "1", Path("."), Path("."), cfg, f"m_{i}")) for i in range(count)]


def test_every_instance_runs_every_sample_count_times(tmp_path: Path) -> None:
    warmups = (
        'model_warmup [ { name: "a" batch_size: 3 count: 2 inputs ' + fp32("zero_data: true") + " },"
        ' { name: "skipped" batch_size: 0 inputs ' + fp32("zero_data: true") + " },"
        ' { name: "b" batch_size: 1 inputs ' + fp32("random_data: true") + " } ]"
    )
    cfg = config(warmups)
    instances = instances_for(cfg)
    runs = warm_up(cfg, tmp_path, "1", instances)
    assert [i.executions for i in instances] == [[[1, 1, 1], [1, 1, 1], [1]]] * 2
    assert [len(run.requests) for run in runs] == [3, 3, 1] * 2  # charged to the statistics later


def test_a_failing_sample_fails_with_its_name(tmp_path: Path) -> None:
    cfg = config(sample(fp32("zero_data: true"), name="zeros"),
                 extra='parameters { key: "fail_on_value" value { string_value: "0" } }')
    with pytest.raises(ModelLoadError, match="^failed to run warmup sample 'zeros': ferry_test model failed.*; $"):
        warm_up(cfg, tmp_path, "1", instances_for(cfg))


# --- readiness in a server --------------------------------------------------------------------
def slow_warmup_model(repository: Path, name: str, fail: bool = False) -> None:
    params = 'parameters { key: "execute_delay_ms" value { string_value: "300" } }'
    if fail:
        params += '\nparameters { key: "fail_on_value" value { string_value: "0" } }'
    warmup = (
        'model_warmup [ { name: "zeros" batch_size: 2 count: 2 inputs { key: "INPUT0" '
        "value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]"
    )
    write_model(repository, name, test_model_config(name, extra=f"{params}\n{warmup}"))


async def test_warmup_blocks_readiness(tmp_path: Path, server_factory) -> None:
    slow_warmup_model(tmp_path, "warm")
    handle = await server_factory([tmp_path], model_control_mode="explicit")
    engine = handle.engine
    started = time.monotonic()
    load = asyncio.ensure_future(engine.load_model("warm"))
    seen_ready: list[bool] = []
    while not load.done():
        seen_ready.append(engine.model_ready("warm"))
        await asyncio.sleep(0.02)
    await load
    assert time.monotonic() - started >= 0.6  # two 300 ms warmup executions
    assert len(seen_ready) > 5 and not any(seen_ready)
    assert engine.model_ready("warm")
    model = engine.registry.get("warm")
    assert model.pool.instances[0].executions == [[1, 1], [1, 1]]
    assert model.stats.execution_count == 2 and model.stats.success.count == 4  # charged, as Triton does


async def test_failing_warmup_fails_the_load(tmp_path: Path, server_factory) -> None:
    slow_warmup_model(tmp_path, "cold", fail=True)
    handle = await server_factory([tmp_path])
    failure = handle.engine.startup_failures["cold"]
    assert "failed to run warmup sample 'zeros'" in failure
    assert not handle.engine.model_ready("cold")
    index = {row["name"]: row for row in handle.engine.repository_index()}
    assert index["cold"]["state"] == "UNAVAILABLE" and "warmup sample 'zeros'" in index["cold"]["reason"]
