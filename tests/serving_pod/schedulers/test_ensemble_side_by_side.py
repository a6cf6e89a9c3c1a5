"""Ensembles of python models side by side with tritonserver 2.51 (skipped where it cannot be installed).

The same requests go to both servers and the answers must be equal: the order of a response's outputs, a tensor
crossing between batching and non-batching models, which steps a request for some outputs runs, and the
ensemble's statistics after successes and a failure (counts, batch sizes, ``last_inference`` untouched by the
failure, the ``nv_inference_request_failure`` reason). Each differed before. Triton's answers are recorded in
``EXPECTED``: Ferry runs against them by default, Triton in a slow test.
"""

from __future__ import annotations

import re

import httpx
import pytest

from support.server import write_model

#: every output is INPUT0 + 1; a negative input fails the request
STEP_PY = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.outputs = [output["name"] for output in json.loads(args["model_config"])["output"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if float(x.flat[0]) < 0:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative input")))
                continue
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, (x + 1).astype(np.float32)) for name in self.outputs]))
        return responses
'''


def _tensors(names, dims: str = "[ 4 ]") -> str:
    return ", ".join(f'{{ name: "{name}" data_type: TYPE_FP32 dims: {dims} }}' for name in names)


def _step_model(name: str, outputs=("OUTPUT0",), max_batch_size: int = 8) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {_tensors(["INPUT0"])} ]
output [ {_tensors(outputs)} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def _ensemble(name: str, steps, inputs=("IN",), outputs=("OUT",), max_batch_size: int = 8) -> str:
    text = []
    for model, input_map, output_map in steps:
        maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in input_map.items()]
        maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in output_map.items()]
        text.append(f'{{ model_name: "{model}" model_version: -1 {" ".join(maps)} }}')
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: {max_batch_size}
input [ {_tensors(inputs)} ]
output [ {_tensors(outputs)} ]
ensemble_scheduling {{ step [ {", ".join(text)} ] }}
"""


NAMES = ("zeta", "alpha", "mid", "b", "out_1")
MODELS = ("multi_ens", "fork", "over_flat", "flat_over")


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repository = tmp_path_factory.mktemp("ensemble_side_by_side")
    files = {"1/model.py": STEP_PY}
    write_model(repository, "multi", _step_model("multi", [f"O{i}" for i in range(len(NAMES))]), files)
    for name in ("a", "b", "c"):
        write_model(repository, name, _step_model(name), files)
    write_model(repository, "flat", _step_model("flat", max_batch_size=0), files)
    write_model(repository, "multi_ens", _ensemble(
        "multi_ens", [("multi", {"INPUT0": "IN"}, {f"O{i}": n for i, n in enumerate(NAMES)})], outputs=NAMES))
    write_model(repository, "fork", _ensemble("fork", [
        ("a", {"INPUT0": "IN"}, {"OUTPUT0": "m"}), ("b", {"INPUT0": "m"}, {"OUTPUT0": "B"}),
        ("c", {"INPUT0": "m"}, {"OUTPUT0": "C"})], outputs=("B", "C")))
    write_model(repository, "over_flat", _ensemble("over_flat", [("flat", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})]))
    write_model(repository, "flat_over", _ensemble(
        "flat_over", [("a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], max_batch_size=0))
    return repository


def _answers(http_port: int, metrics_url: str) -> dict[str, object]:
    base = f"http://127.0.0.1:{http_port}/v2/models"

    def infer(model: str, shape, value: float = 1.0, outputs=None):
        count = 4 * (shape[0] if len(shape) > 1 else 1)
        body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": shape, "data": [value] * count}]}
        if outputs is not None:
            body["outputs"] = [{"name": name} for name in outputs]
        response = httpx.post(f"{base}/{model}/infer", json=body, timeout=60).json()
        if "error" in response:
            return re.sub(r"\[request id: [^]]*\] ", "", response["error"])
        return [(output["name"], output["shape"], output["data"][:4]) for output in response["outputs"]]

    def stats(model: str) -> dict:
        return httpx.get(f"{base}/{model}/stats", timeout=60).json()["model_stats"][0]

    def counts(*models: str) -> list[int]:
        return [stats(model)["inference_count"] for model in models]

    answers: dict[str, object] = {
        "order": [name for name, _, _ in infer("multi_ens", [1, 4])],
        "order asked": [name for name, _, _ in infer("multi_ens", [1, 4], outputs=["b", "zeta", "alpha"])],
        "over_flat": infer("over_flat", [1, 4]),
        "flat_over": infer("flat_over", [4]),
    }
    answers["fork C"] = (infer("fork", [1, 4], outputs=["C"]), counts("a", "b", "c"))
    answers["fork B"] = (infer("fork", [1, 4], outputs=["B"]), counts("a", "b", "c"))
    infer("fork", [2, 4])
    last = stats("fork")["last_inference"]
    answers["failure"] = infer("fork", [1, 4], -1.0)
    entry = stats("fork")
    inference = entry["inference_stats"]
    answers["stats"] = (
        entry["inference_count"], entry["execution_count"], entry["last_inference"] == last,
        {key: inference[key]["count"] for key in ("success", "fail", "queue", "compute_input", "compute_infer",
                                                  "compute_output", "cache_hit", "cache_miss")},
        [(row["batch_size"], row["compute_input"]["count"]) for row in entry["batch_stats"]],
    )
    metrics = httpx.get(metrics_url, timeout=60).text
    answers["failure metrics"] = sorted(re.findall(r'nv_inference_request_failure\{model="fork",reason="(\w+)",'
                                                   r'version="1"\} (\d+)', metrics))
    return answers


#: tritonserver 2.51's answers to ``_answers``
EXPECTED: dict[str, object] = {
    "order": ["out_1", "mid", "b", "alpha", "zeta"],  # Triton's, not the config's
    "order asked": ["b", "alpha", "zeta"],
    "over_flat": [("OUT", [1, 4], [2.0, 2.0, 2.0, 2.0])],
    "flat_over": [("OUT", [4], [2.0, 2.0, 2.0, 2.0])],
    # (answer, inference counts of a, b, c): a request for C alone does not run b
    "fork C": ([("C", [1, 4], [3.0, 3.0, 3.0, 3.0])], [2, 0, 1]),
    "fork B": ([("B", [1, 4], [3.0, 3.0, 3.0, 3.0])], [3, 1, 1]),
    "failure": "in ensemble 'fork', negative input",
    # (inference_count, execution_count, last_inference untouched by the failure, counts, batch sizes)
    "stats": (4, 3, True, {"success": 3, "fail": 2, "queue": 3, "compute_input": 3, "compute_infer": 3,
                           "compute_output": 3, "cache_hit": 0, "cache_miss": 0}, [(1, 2), (2, 1)]),
    "failure metrics": [("BACKEND", "0"), ("CANCELED", "0"), ("OTHER", "2"), ("REJECTED", "0")],
}


def test_answers_match_nvidia_tritons(threaded_server, repository) -> None:
    server = threaded_server([repository], model_control_mode="explicit", load_models=MODELS)
    assert _answers(server.server.http_port, server.metrics_url) == EXPECTED


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_triton_answers_as_recorded(repository) -> None:
    from support.triton import running_triton

    with running_triton(repository, list(MODELS)) as (http, _, metrics):
        assert _answers(http, f"http://127.0.0.1:{metrics}/metrics") == EXPECTED
