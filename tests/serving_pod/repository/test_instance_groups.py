"""Instance groups as Triton completes and checks them: kinds, GPU ids, instance names.

Without a GPU (the default suite): KIND_AUTO is KIND_CPU, and a group that names GPUs or asks for KIND_GPU is
refused with Triton's message while the server goes on. On a GPU (marker ``gpu``, skipped where NVML sees
none): KIND_AUTO becomes KIND_GPU on every visible GPU, a python model's instance is told so, a GPU id that is
not there is refused, and ``CUDA_VISIBLE_DEVICES`` limits what counts as visible.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core.errors import ModelLoadError
from serving_pod.repository import instance_groups
from serving_pod.repository.prepare import prepare_config
from support.server import assert_load_refused, test_model_config, write_model

PROTOCOLS = ["http", "grpc"]

#: a python model that notes, per instance, the args Triton's python backend gives ``initialize``
ARGS_MODEL = """
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        keys = ("model_instance_name", "model_instance_kind", "model_instance_device_id")
        self.args = json.dumps({k: args[k] for k in keys})
        with open(os.path.join(args["model_repository"], "instances.jsonl"), "a") as out:
            out.write(self.args + "\\n")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", np.array([self.args.encode()], dtype=np.object_))])
                for _ in requests]
"""


def _python_config(name: str, groups: str = "") -> str:
    return f"""name: "{name}"
backend: "python"
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "ARGS" data_type: TYPE_STRING dims: [ 1 ] }} ]
{groups}
"""


def _gpus_or_skip(want: bool) -> list[int]:
    gpus = instance_groups.visible_gpus()
    if want and not gpus:
        pytest.skip("no GPU visible to NVML here (nvidia-ml-py and a driver are needed)")
    if not want and gpus:
        pytest.skip("a GPU is visible here; the gpu-marked tests cover this host")
    return gpus


def _onnx_mlp(root: Path, name: str, groups: str = "") -> Path:
    """The embedded ONNX MLP under ``name``, its instance groups replaced by ``groups``."""
    source = Path(__file__).parents[3] / "serving_pod" / "default_models" / "mlp_onnx"
    model_dir = root / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.onnx").write_bytes((source / "1" / "model.onnx").read_bytes())
    config = (source / "config.pbtxt").read_text().replace('name: "mlp_onnx"', f'name: "{name}"')
    lines = [line for line in config.splitlines() if "instance_group" not in line]
    (model_dir / "config.pbtxt").write_text("\n".join([*lines, groups]))
    return model_dir


def _groups(config: mc.ModelConfig) -> list[tuple[str, str, list[int], int]]:
    return [(g.name, mc.ModelInstanceGroup.Kind.Name(g.kind), list(g.gpus), g.count) for g in config.instance_group]


def _instance_args(server: Any, protocol: str, model_dir: Path) -> list[dict[str, str]]:
    """What each instance's ``initialize`` was given, once the model answers an inference."""
    module, client = server.module(protocol), server.client(protocol)
    tensor = module.InferInput("X", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    answer = json.loads(client.infer(model_dir.name, [tensor]).as_numpy("ARGS")[0])
    lines = [json.loads(line) for line in (model_dir / "instances.jsonl").read_text().splitlines()]
    assert answer in lines
    return sorted(lines, key=lambda a: (a["model_instance_name"], a["model_instance_device_id"]))


# --------------------------------------------------------------------------- anywhere


def test_placements_are_tritons_names_and_order() -> None:
    """Instance i of a KIND_GPU group is made once per GPU under one name, i outermost, as Triton's core does."""
    config = text_format.Parse(
        """name: "m" instance_group [ { name: "g" count: 2 kind: KIND_GPU gpus: [ 0, 1 ] },
                                      { name: "c" count: 1 kind: KIND_CPU } ]""", mc.ModelConfig())
    assert [(n, k, d) for n, k, d, _ in instance_groups.placements(config)] == [
        ("g_0", "KIND_GPU", 0), ("g_0", "KIND_GPU", 1), ("g_1", "KIND_GPU", 0), ("g_1", "KIND_GPU", 1),
        ("c_0", "KIND_CPU", 0)]


@pytest.mark.parametrize("mask, entries", [("0,1", [0, 1]), ("", []), ("1,x,2", [1]), ("GPU-3f2a,MIG-7c1d", ["GPU-3f2a", "MIG-7c1d"]),
                                           ("-1", []), (" 0 , 1 ", [0, 1])])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(mask: str, entries: list[int | str]) -> None:
    """CUDA enumerates the listed devices up to the first entry that is not an index or a GPU-/MIG- UUID."""
    assert instance_groups.mask_entries(mask) == entries


def test_min_supported_compute_capability_reaches_the_engine() -> None:
    from support.cli import cli_options

    assert cli_options().engine.min_compute_capability == 6.0
    options = cli_options("--min-supported-compute-capability=8.9")
    assert options.engine.min_compute_capability == 8.9 and options.ignored_flags == ()


@pytest.mark.parametrize("groups, message", [
    ('instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]', "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs"),
    ('instance_group [ { name: "x" kind: KIND_MODEL gpus: [ 1 ] } ]', "instance group x of model m has kind KIND_MODEL but specifies one or more GPUs"),
])
def test_gpus_on_a_group_that_is_not_kind_gpu_are_refused(tmp_path: Path, groups: str, message: str) -> None:
    model_dir = write_model(tmp_path, "m", test_model_config("m", extra=groups))
    with pytest.raises(ModelLoadError, match=message):
        prepare_config("m", model_dir)


# --------------------------------------------------------------------------- without a GPU


def test_without_a_gpu_kind_auto_is_kind_cpu_and_groups_are_named_as_triton_names_them(tmp_path: Path) -> None:
    _gpus_or_skip(False)
    model_dir = write_model(tmp_path, "m", test_model_config("m"))
    assert _groups(prepare_config("m", model_dir)[0]) == [("m", "KIND_CPU", [], 1)]
    model_dir = write_model(tmp_path, "n", test_model_config("n", extra="instance_group [ { count: 2 }, { kind: KIND_AUTO } ]"))
    assert _groups(prepare_config("n", model_dir)[0]) == [("n_0", "KIND_CPU", [], 2), ("n_1", "KIND_CPU", [], 1)]


@pytest.mark.parametrize("groups, expected", [
    ("", [("mlp", "KIND_CPU", [], 2)]),
    ("instance_group [ { kind: KIND_CPU }, { count: 3 }, { kind: KIND_MODEL } ]",
     [("mlp_0", "KIND_CPU", [], 2), ("mlp_1", "KIND_CPU", [], 3), ("mlp_2", "KIND_MODEL", [], 1)]),
])
def test_without_a_gpu_an_onnxruntime_group_with_no_count_gets_two_cpu_instances(tmp_path: Path, groups: str,
                                                                                  expected: list[Any]) -> None:
    """Triton's SetDefaultInstanceCount: a KIND_CPU group of an onnxruntime (or tensorflow) model that gives no
    count gets 2 instances; every other group, and every other backend's (the python model above), gets 1."""
    _gpus_or_skip(False)
    assert _groups(prepare_config("mlp", _onnx_mlp(tmp_path, "mlp", groups))[0]) == expected


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_without_a_gpu_an_onnxruntime_model_is_served_by_two_instances(threaded_server: Any, tmp_path: Path,
                                                                       protocol: str) -> None:
    """The served config says so, and the model answers."""
    _gpus_or_skip(False)
    _onnx_mlp(tmp_path, "mlp")
    server = threaded_server([tmp_path], model_control_mode="explicit", load_models=("mlp",))
    client, module = server.client(protocol), server.module(protocol)
    config = client.get_model_config("mlp")
    groups = (config["instance_group"] if protocol == "http" else
              [{"name": g.name, "count": g.count, "kind": mc.ModelInstanceGroup.Kind.Name(g.kind)}
               for g in config.config.instance_group])
    assert [(g["name"], g["count"], g["kind"]) for g in groups] == [("mlp", 2, "KIND_CPU")]
    tensor = module.InferInput("INPUT0", [1, 256], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 256), np.float32))
    assert client.infer("mlp", [tensor]).as_numpy("OUTPUT0").shape == (1, 64)


@pytest.mark.parametrize("groups, default_kind, message", [
    ("instance_group [ { kind: KIND_GPU } ]", "KIND_AUTO", "instance group m_0 of model m has kind KIND_GPU but no GPUs are available"),
    ("", "KIND_GPU", "instance group m of model m has kind KIND_GPU but no GPUs are available"),
    ("instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]", "KIND_AUTO",
     r"instance group m_0 of model m specifies invalid or unsupported gpu id 0\. GPUs with at least the minimum "
     r"required CUDA compute compatibility of 6\.000000 are: ;$"),  # each version's failure: ``...: <why>;``
    # KIND_AUTO naming a GPU that is not there resolves to KIND_CPU, which may not name GPUs (Triton's order)
    ("instance_group [ { kind: KIND_AUTO gpus: [ 0 ] } ]", "KIND_AUTO", "m_0 of model m has kind KIND_CPU but specifies one or more GPUs"),
])
def test_without_a_gpu_kind_gpu_is_refused_with_tritons_message(tmp_path: Path, groups: str, default_kind: str,
                                                               message: str) -> None:
    _gpus_or_skip(False)
    model_dir = write_model(tmp_path, "m", test_model_config("m", extra=groups))
    with pytest.raises(ModelLoadError, match=message):
        prepare_config("m", model_dir, default_instance_kind=default_kind)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_kind_gpu_model_fails_to_load_and_the_server_goes_on(threaded_server: Any, tmp_path: Path, protocol: str) -> None:
    _gpus_or_skip(False)
    write_model(tmp_path, "gpu", test_model_config("gpu", extra="instance_group [ { kind: KIND_GPU } ]"))
    write_model(tmp_path, "cpu", test_model_config("cpu"))
    assert_load_refused(threaded_server([tmp_path], model_control_mode="explicit"), protocol, "gpu",
                        "instance group gpu_0 of model gpu has kind KIND_GPU but no GPUs are available", loads="cpu")


# --------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_on_a_gpu_kind_auto_is_kind_gpu_on_every_gpu_and_the_model_is_told(threaded_server: Any, tmp_path: Path,
                                                                          protocol: str) -> None:
    gpus = _gpus_or_skip(True)
    auto = write_model(tmp_path / protocol, "auto", _python_config("auto"), {"1/model.py": ARGS_MODEL})
    two = write_model(tmp_path / protocol, "two", _python_config("two", "instance_group [ { count: 2 kind: KIND_GPU } ]"),
                      {"1/model.py": ARGS_MODEL})
    server = threaded_server([tmp_path / protocol])
    client = server.client(protocol)
    config = client.get_model_config("auto", as_json=True) if protocol == "grpc" else client.get_model_config("auto")
    config = config.get("config", config)
    assert [(g["name"], g["kind"], [int(x) for x in g["gpus"]]) for g in config["instance_group"]] == [("auto", "KIND_GPU", gpus)]
    assert _instance_args(server, protocol, auto) == [
        {"model_instance_name": "auto_0", "model_instance_kind": "GPU", "model_instance_device_id": str(gpu)} for gpu in gpus]
    assert _instance_args(server, protocol, two) == [
        {"model_instance_name": f"two_0_{i}", "model_instance_kind": "GPU", "model_instance_device_id": str(gpu)}
        for i in range(2) for gpu in gpus]


@pytest.mark.gpu
def test_on_a_gpu_an_id_that_is_not_there_is_refused_and_cuda_visible_devices_and_capability_limit_gpus(tmp_path: Path,
                                                                                       monkeypatch: Any) -> None:
    gpus = _gpus_or_skip(True)
    model_dir = write_model(tmp_path, "m", _python_config("m", f"instance_group [ {{ kind: KIND_GPU gpus: [ {len(gpus)} ] }} ]"),
                            {"1/model.py": ARGS_MODEL})
    listed = ", ".join(str(g) for g in gpus)
    with pytest.raises(ModelLoadError, match=rf"instance group m_0 of model m specifies invalid or unsupported gpu id "
                                             rf"{len(gpus)}\. .* compatibility of 6\.000000 are: {listed};$"):  # the version's failure
        prepare_config("m", model_dir)
    auto = write_model(tmp_path, "a", _python_config("a"), {"1/model.py": ARGS_MODEL})
    assert _groups(prepare_config("a", auto)[0]) == [("a", "KIND_GPU", gpus, 1)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert _groups(prepare_config("a", auto)[0]) == [("a", "KIND_CPU", [], 1)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert _groups(prepare_config("a", auto)[0]) == [("a", "KIND_GPU", [0], 1)]
    import pynvml

    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(len(gpus) - 1))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{uuid.decode() if isinstance(uuid, bytes) else uuid},junk,0")
    assert _groups(prepare_config("a", auto)[0]) == [("a", "KIND_GPU", [0], 1)]  # the last GPU is CUDA's device 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    # --min-supported-compute-capability: GPUs below it are not there for instance groups
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert 0 in instance_groups.visible_gpus(major + minor / 10) and instance_groups.visible_gpus(99.0) == []
    assert _groups(prepare_config("a", auto, min_compute_capability=99.0)[0]) == [("a", "KIND_CPU", [], 1)]
    gpu0 = write_model(tmp_path, "g", _python_config("g", "instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]"),
                       {"1/model.py": ARGS_MODEL})
    with pytest.raises(ModelLoadError, match=r"gpu id 0\. GPUs with at least the minimum required CUDA compute "
                                             r"compatibility of 99\.000000 are: ;$"):
        prepare_config("g", gpu0, min_compute_capability=99.0)


@pytest.mark.gpu
def test_on_a_gpu_an_onnxruntime_without_cuda_keeps_kind_auto_on_the_cpu(tmp_path: Path) -> None:
    """Ferry's one difference from Triton: KIND_AUTO is KIND_GPU only where onnxruntime has CUDA."""
    import onnxruntime

    gpus = _gpus_or_skip(True)
    model_dir = _onnx_mlp(tmp_path, "mlp")
    has_cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    expected = ("mlp", "KIND_GPU", gpus, 1) if has_cuda else ("mlp", "KIND_CPU", [], 2)
    assert _groups(prepare_config("mlp", model_dir)[0]) == [expected]


def test_passive_indices_are_the_passive_groups_instances_unless_every_one_is() -> None:
    config = text_format.Parse("""name: "m" instance_group [ { name: "a" count: 2 kind: KIND_CPU },
                                  { name: "p" count: 2 kind: KIND_CPU passive: true } ]""", mc.ModelConfig())
    assert instance_groups.passive_indices(config) == {2, 3}
    config.instance_group[0].passive = True  # every instance passive: Ferry schedules them all (Triton crashes)
    assert instance_groups.passive_indices(config) == frozenset()
