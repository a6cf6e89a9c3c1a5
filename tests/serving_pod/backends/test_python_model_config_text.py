"""A python model's ``args["model_config"]`` is the text NVIDIA Triton 2.51 hands it, byte for byte.

Triton's printer writes compact JSON, each message's fields in the ``.proto`` file's declaration order and a whole
float without a fraction (``fp32_false_true: [0,1]``); Ferry wrote ``json.dumps``' spaced text with the fields a
config sets first and floats as ``0.0``. The values were already the same. Ferry is checked against the recorded
text by default; a live Triton (``support.triton``) under ``-m slow``.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from support.server import write_model

CONFIG = """
name: "args"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
sequence_batching { direct { } control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START
                                                                         fp32_false_true: [ 0, 1 ] } ] } ] }
"""

#: answers with the ``args["model_config"]`` its instance was given
MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.text = args["model_config"]

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([self.text.encode()], np.object_))])
                for request in requests]
'''

#: what Triton 2.51 hands the model (recorded from a live Triton; the slow
#: ``test_nvidia_triton_hands_the_recorded_text`` compares a live one with it)
TRITON_TEXT = (
    '{"name":"args","platform":"","backend":"python","runtime":"","version_policy":{"latest":{"num_versions":1}},'
    '"max_batch_size":0,"input":[{"name":"INPUT0","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[1],'
    '"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,"is_non_linear_format_io":false}],'
    '"output":[{"name":"OUTPUT0","data_type":"TYPE_STRING","dims":[1],"label_filename":"","is_shape_tensor":false,'
    '"is_non_linear_format_io":false}],"batch_input":[],"batch_output":[],"optimization":{"priority":'
    '"PRIORITY_DEFAULT","input_pinned_memory":{"enable":true},"output_pinned_memory":{"enable":true},'
    '"gather_kernel_buffer_threshold":0,"eager_batching":false},"sequence_batching":{"direct":'
    '{"max_queue_delay_microseconds":0,"minimum_slot_utilization":0},"max_sequence_idle_microseconds":1000000,'
    '"control_input":[{"name":"S","control":[{"kind":"CONTROL_SEQUENCE_START","int32_false_true":[],'
    '"fp32_false_true":[0,1],"bool_false_true":[],"data_type":"TYPE_INVALID"}]}],"state":[],'
    '"iterative_sequence":false},"instance_group":[{"name":"args","kind":"KIND_CPU","count":1,"gpus":[],'
    '"secondary_devices":[],"profile":[],"passive":false,"host_policy":""}],"default_model_filename":"model.py",'
    '"cc_model_filenames":{},"metric_tags":{},"parameters":{},"model_warmup":[]}'
)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    write_model(tmp_path, "args", CONFIG, {"1/model.py": MODEL})
    return tmp_path


def model_config_text(http_port: int) -> str:
    answer = httpx.post(f"http://127.0.0.1:{http_port}/v2/models/args/infer", timeout=60, json={
        "parameters": {"sequence_id": 1, "sequence_start": True},
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1]}]}).json()
    return answer["outputs"][0]["data"][0]


def test_model_sees_tritons_text(threaded_server, repository: Path) -> None:
    server = threaded_server([repository], model_control_mode="explicit", load_models=("args",))
    assert model_config_text(server.server.http_port) == TRITON_TEXT


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_triton_hands_the_recorded_text(repository: Path) -> None:
    from support.triton import running_triton

    with running_triton(repository, ["args"]) as (http_port, _, _):
        assert model_config_text(http_port) == TRITON_TEXT
