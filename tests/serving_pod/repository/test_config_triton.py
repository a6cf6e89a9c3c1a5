"""Model configuration and metadata as NVIDIA Triton 2.51 serves them for python models, and which configs it loads.

Each case was sent to Triton 2.51 (CPU, python backend) and to Ferry serving the same models, with and without
``--disable-auto-complete-config``. Ferry is checked against the recorded answers always (every model's config and
metadata over HTTP and gRPC in ``data/recorded/config_triton.json``), a live Triton (``support.triton``) against the
same record with ``-m slow``:

* ``GET /v2/models/<m>/config``: Triton's text byte for byte, so each message's fields come in the ``.proto`` file's
  declaration order (``name, platform, backend, runtime, version_policy, ...``; ``ModelInstanceGroup``: ``name, kind,
  count, ...``; a scalar ``oneof`` member last) with every default printed, 64-bit integers as numbers except the
  three Triton leaves as strings (CUDA graph ``dim``, ``initial_state`` ``dims``, ``device_id``) and whole floats
  without a fraction. gRPC ``ModelConfig`` carries the same message.
* model metadata: ``versions`` lists only the version asked for (``/versions/01`` -> ``["1"]``), every ready version
  when none is named.
* loads: Triton refuses ``preserve_ordering`` with several priority levels, a ``sequence_batching.oldest`` preferred
  batch size above max_batch_size, a tensor without ``dims``, an NHWC/NCHW input without 3 dims, an empty reshape in a
  model that does not batch, a reshape whose variable dims do not line up with ``dims``, shape tensors, non-linear IO
  and instance group profiles outside TensorRT, an output whose ``label_filename`` is missing, and a version policy
  that leaves no version; the tensor, instance group and label file refusals fail each version, in Triton's words
  (``load failed for model 'm': version 1 is at UNAVAILABLE state: Invalid argument: model input 'INPUT0' must
  specify 'dims' for m;``, HTTP 400); a ``specific`` policy loads the versions that have a folder (the others are logged); a
  python model needs no outputs.

Differences kept on purpose (Ferry's clearer behaviour), not asserted here:

* a config Triton refuses before any version loads (a parse error, a bad batcher, a name that does not match its
  folder) gets Triton's 500 "failed to load '<m>', failed to poll from model repository" from both; Ferry adds
  ``: <the reason>``, which Triton writes only to its log.
* a negative instance ``count`` and two tensors of one name: Triton loads them (count -1 is served as 1, the name
  twice); Ferry refuses them, as each version's failure (``Invalid argument: instance group m_0 of model m specifies
  count -1: it must be >= 1``, ``model input 'X' is specified more than once for m``).
* the entries of a map (``parameters``, ``metric_tags``, ``priority_queue_policy``): Triton prints its hash map's
  order, which no client can rely on, so the models here keep one entry per map.
* Triton did not answer a load within 40 s (its python stub waits) for a model whose ``default_model_filename`` is
  missing, whose only version folder is ``-1`` or that has folders such as ``2a`` beside ``1``; Ferry refuses the
  first two at once and loads ``1`` of the last (a folder name that is not a number is not a version).
* a python model's error keeps no Python traceback (Triton appends ``At:`` and the stub's file paths).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from support.python_models import IDENTITY_MODEL
from support.server import ServerThread, make_options

PY = IDENTITY_MODEL

#: a python model whose ``auto_complete_config`` runs the given lines
AUTO_COMPLETE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        {lines}
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            request, "INPUT0").as_numpy())]) for request in requests]
'''

NO_OUTPUTS = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for request in requests]
'''

IO = '''
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
'''


def _config(name: str, extra: str = "", *, max_batch_size: int = 8, io: str = IO) -> str:
    return f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n{io}\n{extra}\n'


#: model -> (config.pbtxt or None, auto_complete_config lines or None); served by both, with and without auto-complete
SERVED: dict[str, tuple[str | None, str | None]] = {
    "plain": (_config("plain"), None),
    "unbatched": (_config("unbatched", max_batch_size=0), None),
    "dyn": (_config("dyn", "dynamic_batching { }"), None),
    "dyn_full": (_config("dyn_full", """dynamic_batching { preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 100
        priority_levels: 2 default_priority_level: 1
        default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1000 allow_timeout_override: true
                               max_queue_size: 5 }
        priority_queue_policy { key: 2 value: { max_queue_size: 3 } } }"""), None),
    "seq_direct": (_config("seq_direct", """sequence_batching { max_sequence_idle_microseconds: 5000000 direct { }
        control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
                        { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ] }"""),
                   None),
    "seq_oldest": (_config("seq_oldest", "sequence_batching { oldest { max_candidate_sequences: 4 } }"), None),
    "groups": (_config("groups", 'instance_group [ { count: 2 kind: KIND_CPU }, { name: "named" kind: KIND_AUTO } ]'),
               None),
    "rate": (_config("rate", 'instance_group [ { kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 2 } ] '
                             'priority: 1 } } ]'), None),
    "ver_all": (_config("ver_all", "version_policy { all { } }"), None),
    "decoupled": (_config("decoupled", "model_transaction_policy { decoupled: true }", max_batch_size=0), None),
    "params": (_config("params", 'parameters { key: "k" value: { string_value: "10" } }\n'
                                 'metric_tags { key: "team" value: "a" }'), None),
    "tensor_fields": (_config("tensor_fields", io='''
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] optional: true allow_ragged_batch: true },
                { name: "IN_R" data_type: TYPE_INT32 dims: [ 2, 2 ] reshape { shape: [ 4 ] } format: FORMAT_NONE },
                { name: "IN_S" data_type: TYPE_STRING dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" },
                 { name: "OUT_R" data_type: TYPE_BOOL dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]'''), None),
    "warmup": (_config("warmup", 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT0" value: '
                                 '{ data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]'), None),
    "optim": (_config("optim", "optimization { priority: PRIORITY_MAX input_pinned_memory { enable: false } }"), None),
    "strings": (_config("strings", """optimization { cuda { graphs: true graph_spec [ { batch_size: 1
            input { key: "INPUT0" value: { dim: [ 4 ] } }
            graph_lower_bound { batch_size: 1 input { key: "INPUT0" value: { dim: [ 4 ] } } } } ] } }
        sequence_batching { oldest { max_candidate_sequences: 2 max_queue_delay_microseconds: 7 }
                            max_sequence_idle_microseconds: 9
            state [ { input_name: "IS" output_name: "OS" data_type: TYPE_FP32 dims: [ 1 ]
                      initial_state { name: "z" data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } ] }
        instance_group [ { kind: KIND_CPU secondary_devices [ { kind: KIND_NVDLA device_id: 3 } ] } ]"""), None),
    "ac_all": (None, '''auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.set_dynamic_batching()'''),
    "ac_partial": ('backend: "python"\n', '''auto_complete_model_config.add_input(
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]})
        auto_complete_model_config.set_model_transaction_policy({"decoupled": False})'''),
}
#: models that load only with auto-complete (their I/O comes from ``auto_complete_config``)
NEEDS_AUTO_COMPLETE = ("ac_all", "ac_partial")
#: ``ver_all``'s version folders
VERSIONS = (1, 2, 3)
DISABLED = "--disable-auto-complete-config"

#: Triton 2.51's ``GET /v2/models/<m>/config`` body (auto-complete on), byte for byte
TRITON_CONFIGS = {
    "plain": '{"name":"plain","platform":"","backend":"python","runtime":"","version_policy":{"latest":{"num_versions":1}},'
             '"max_batch_size":8,"input":[{"name":"INPUT0","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[4],'
             '"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,"is_non_linear_format_io":false}],'
             '"output":[{"name":"OUTPUT0","data_type":"TYPE_FP32","dims":[4],"label_filename":"","is_shape_tensor":false,'
             '"is_non_linear_format_io":false}],"batch_input":[],"batch_output":[],"optimization":{"priority":'
             '"PRIORITY_DEFAULT","input_pinned_memory":{"enable":true},"output_pinned_memory":{"enable":true},'
             '"gather_kernel_buffer_threshold":0,"eager_batching":false},"instance_group":[{"name":"plain","kind":'
             '"KIND_CPU","count":1,"gpus":[],"secondary_devices":[],"profile":[],"passive":false,"host_policy":""}],'
             '"default_model_filename":"model.py","cc_model_filenames":{},"metric_tags":{},"parameters":{},'
             '"model_warmup":[]}',
    "rate": '{"name":"rate","platform":"","backend":"python","runtime":"","version_policy":{"latest":{"num_versions":1}},'
            '"max_batch_size":8,"input":[{"name":"INPUT0","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[4],'
            '"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,"is_non_linear_format_io":false}],'
            '"output":[{"name":"OUTPUT0","data_type":"TYPE_FP32","dims":[4],"label_filename":"","is_shape_tensor":false,'
            '"is_non_linear_format_io":false}],"batch_input":[],"batch_output":[],"optimization":{"priority":'
            '"PRIORITY_DEFAULT","input_pinned_memory":{"enable":true},"output_pinned_memory":{"enable":true},'
            '"gather_kernel_buffer_threshold":0,"eager_batching":false},"instance_group":[{"name":"rate_0","kind":'
            '"KIND_CPU","count":1,"rate_limiter":{"resources":[{"name":"R","global":false,"count":2}],"priority":1},'
            '"gpus":[],"secondary_devices":[],"profile":[],"passive":false,"host_policy":""}],'
            '"default_model_filename":"model.py","cc_model_filenames":{},"metric_tags":{},"parameters":{},'
            '"model_warmup":[]}',
    "seq_direct": '{"name":"seq_direct","platform":"","backend":"python","runtime":"","version_policy":{"latest":'
                  '{"num_versions":1}},"max_batch_size":8,"input":[{"name":"INPUT0","data_type":"TYPE_FP32","format":'
                  '"FORMAT_NONE","dims":[4],"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,'
                  '"is_non_linear_format_io":false}],"output":[{"name":"OUTPUT0","data_type":"TYPE_FP32","dims":[4],'
                  '"label_filename":"","is_shape_tensor":false,"is_non_linear_format_io":false}],"batch_input":[],'
                  '"batch_output":[],"optimization":{"priority":"PRIORITY_DEFAULT","input_pinned_memory":{"enable":true},'
                  '"output_pinned_memory":{"enable":true},"gather_kernel_buffer_threshold":0,"eager_batching":false},'
                  '"sequence_batching":{"direct":{"max_queue_delay_microseconds":0,"minimum_slot_utilization":0},'
                  '"max_sequence_idle_microseconds":5000000,"control_input":[{"name":"START","control":[{"kind":'
                  '"CONTROL_SEQUENCE_START","int32_false_true":[],"fp32_false_true":[0,1],"bool_false_true":[],'
                  '"data_type":"TYPE_INVALID"}]},{"name":"CORRID","control":[{"kind":"CONTROL_SEQUENCE_CORRID",'
                  '"int32_false_true":[],"fp32_false_true":[],"bool_false_true":[],"data_type":"TYPE_UINT64"}]}],'
                  '"state":[],"iterative_sequence":false},"instance_group":[{"name":"seq_direct","kind":"KIND_CPU",'
                  '"count":1,"gpus":[],"secondary_devices":[],"profile":[],"passive":false,"host_policy":""}],'
                  '"default_model_filename":"model.py","cc_model_filenames":{},"metric_tags":{},"parameters":{},'
                  '"model_warmup":[]}',
    "ac_all": '{"name":"ac_all","platform":"","backend":"python","runtime":"","version_policy":{"latest":'
              '{"num_versions":1}},"max_batch_size":4,"input":[{"name":"INPUT0","data_type":"TYPE_FP32","format":'
              '"FORMAT_NONE","dims":[4],"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,'
              '"is_non_linear_format_io":false}],"output":[{"name":"OUTPUT0","data_type":"TYPE_FP32","dims":[4],'
              '"label_filename":"","is_shape_tensor":false,"is_non_linear_format_io":false}],"batch_input":[],'
              '"batch_output":[],"optimization":{"priority":"PRIORITY_DEFAULT","input_pinned_memory":{"enable":true},'
              '"output_pinned_memory":{"enable":true},"gather_kernel_buffer_threshold":0,"eager_batching":false},'
              '"dynamic_batching":{"preferred_batch_size":[4],"max_queue_delay_microseconds":0,"preserve_ordering":'
              'false,"priority_levels":0,"default_priority_level":0,"priority_queue_policy":{}},"instance_group":'
              '[{"name":"ac_all","kind":"KIND_CPU","count":1,"gpus":[],"secondary_devices":[],"profile":[],"passive":'
              'false,"host_policy":""}],"default_model_filename":"model.py","cc_model_filenames":{},"metric_tags":{},'
              '"parameters":{},"model_warmup":[]}',
}

TRITON_CONFIGS["strings"] = (
    '{"name":"strings","platform":"","backend":"python","runtime":"","version_policy":{"latest":{"num_versions":1}},'
    '"max_batch_size":8,"input":[{"name":"INPUT0","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[4],'
    '"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,"is_non_linear_format_io":false}],'
    '"output":[{"name":"OUTPUT0","data_type":"TYPE_FP32","dims":[4],"label_filename":"","is_shape_tensor":false,'
    '"is_non_linear_format_io":false}],"batch_input":[],"batch_output":[],"optimization":{"priority":'
    '"PRIORITY_DEFAULT","cuda":{"graphs":true,"busy_wait_events":false,"graph_spec":[{"batch_size":1,"input":'
    '{"INPUT0":{"dim":["4"]}},"graph_lower_bound":{"batch_size":1,"input":{"INPUT0":{"dim":["4"]}}}}],'
    '"output_copy_stream":false},"input_pinned_memory":{"enable":true},"output_pinned_memory":{"enable":true},'
    '"gather_kernel_buffer_threshold":0,"eager_batching":false},"sequence_batching":{"oldest":'
    '{"max_candidate_sequences":2,"preferred_batch_size":[8],"max_queue_delay_microseconds":7,'
    '"preserve_ordering":false},"max_sequence_idle_microseconds":9,"control_input":[],"state":[{"input_name":"IS",'
    '"output_name":"OS","data_type":"TYPE_FP32","dims":[1],"initial_state":[{"data_type":"TYPE_FP32","dims":["1"],'
    '"name":"z","zero_data":true}],"use_same_buffer_for_input_output":false,"use_growable_memory":false}],'
    '"iterative_sequence":false},"instance_group":[{"name":"strings_0","kind":"KIND_CPU","count":1,"gpus":[],'
    '"secondary_devices":[{"kind":"KIND_NVDLA","device_id":"3"}],"profile":[],"passive":false,"host_policy":""}],'
    '"default_model_filename":"model.py","cc_model_filenames":{},"metric_tags":{},"parameters":{},'
    '"model_warmup":[]}'
)
#: models whose printed fields are not all in declaration order, as Triton prints them (a scalar ``oneof`` member
#: after the other fields: ``initial_state``'s ``zero_data`` after its ``name``)
NOT_IN_DECLARATION_ORDER = ("strings",)

#: (HTTP version path segment or gRPC version, ``versions`` Triton lists) for ``ver_all`` (1, 2 and 3 ready)
METADATA_VERSIONS = [("", ["1", "2", "3"]), ("2", ["2"]), ("01", ["1"]), ("3", ["3"])]


def write_repository(root: Path) -> Path:
    for name, (config, lines) in SERVED.items():
        model_dir = root / name
        versions = VERSIONS if name == "ver_all" else (1,)
        for version in versions:
            (model_dir / str(version)).mkdir(parents=True)
            (model_dir / str(version) / "model.py").write_text(
                AUTO_COMPLETE.replace("{lines}", lines) if lines else PY)
        if config is not None:
            (model_dir / "config.pbtxt").write_text(config)
    (root / "tensor_fields" / "labels.txt").write_text("a\nb\nc\nd\n")
    return root


def served_models(flags: tuple[str, ...]) -> list[str]:
    return [name for name in SERVED if DISABLED not in flags or name not in NEEDS_AUTO_COMPLETE]


def answers(http_port: int, grpc_port: int, models: list[str]) -> dict[str, Any]:
    """Every model's config and metadata, over HTTP (status, exact body) and gRPC (the message as a dict)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    found: dict[str, Any] = {}
    base = f"http://127.0.0.1:{http_port}/v2/models"
    requests = [(name, "") for name in models] + [("ver_all", version) for version, _ in METADATA_VERSIONS if version]
    for name, version in requests:
        path = f"{base}/{name}" + (f"/versions/{version}" if version else "")
        for what, route in (("config", f"{path}/config"), ("metadata", path)):
            response = httpx.get(route, timeout=60)
            found[f"HTTP {what} {name} {version}"] = (response.status_code, response.text)
        config = client.get_model_config(name, version).config
        found[f"gRPC config {name} {version}"] = json_format.MessageToDict(config, preserving_proto_field_name=True)
        found[f"gRPC metadata {name} {version}"] = json_format.MessageToDict(
            client.get_model_metadata(name, version), preserving_proto_field_name=True)
    client.close()
    return found


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    return write_repository(tmp_path_factory.mktemp("configs"))


@pytest.fixture(scope="module", params=[(), (DISABLED,)], ids=["auto-complete", "disabled"])
def ferry(request, repository: Path):
    """(flags, http port, grpc port) of Ferry serving ``SERVED`` as Triton would with ``flags``."""
    flags = request.param
    thread = ServerThread(make_options([repository], model_control_mode="explicit",
                                       load_models=tuple(served_models(flags)), autocomplete=DISABLED not in flags))
    handle = thread.start()
    yield flags, handle.server.http_port, handle.server.grpc_port
    thread.stop()


def _key_orders(data: Any, descriptor, path: str = "") -> list[tuple[str, list[str], list[str]]]:
    """(path, keys printed, keys in declaration order) for every message in ``data`` (printed ``descriptor``)."""
    if isinstance(data, list):
        return [entry for index, item in enumerate(data) for entry in _key_orders(item, descriptor, f"{path}[{index}]")]
    declared = [field.name for field in descriptor.fields if field.name in data]
    found = [(path, list(data), declared)]
    for name, value in data.items():
        field = descriptor.fields_by_name[name]
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name["value"].message_type
            if entry is not None:
                for key, item in value.items():
                    found += _key_orders(item, entry, f"{path}.{name}[{key}]")
        else:
            found += _key_orders(value, field.message_type, f"{path}.{name}")
    return found


def test_config_is_tritons_text(ferry) -> None:
    flags, http_port, _ = ferry
    if flags:
        pytest.skip("recorded with auto-complete on")
    served = {name: httpx.get(f"http://127.0.0.1:{http_port}/v2/models/{name}/config", timeout=60).text
              for name in TRITON_CONFIGS}
    assert served == TRITON_CONFIGS


def test_config_fields_come_in_declaration_order(ferry) -> None:
    flags, http_port, _ = ferry
    for name in [name for name in served_models(flags) if name not in NOT_IN_DECLARATION_ORDER]:
        body = httpx.get(f"http://127.0.0.1:{http_port}/v2/models/{name}/config", timeout=60).text
        misordered = [(path, printed) for path, printed, declared in _key_orders(json.loads(body), mc.ModelConfig.DESCRIPTOR)
                      if printed != declared]
        assert misordered == [], name


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_metadata_lists_the_version_asked_for(ferry, protocol: str) -> None:
    _, http_port, grpc_port = ferry
    listed = {}
    for version, _ in METADATA_VERSIONS:
        if protocol == "http":
            path = "/v2/models/ver_all" + (f"/versions/{version}" if version else "")
            listed[version] = httpx.get(f"http://127.0.0.1:{http_port}{path}", timeout=60).json()["versions"]
        else:
            import tritonclient.grpc as grpcclient

            with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
                listed[version] = list(client.get_model_metadata("ver_all", version).versions)
    assert listed == dict(METADATA_VERSIONS)


#: ``answers`` (through JSON) of Triton 2.51 serving ``served_models(flags)``, by flag set (``auto-complete``,
#: ``disabled``): recorded from a live Triton; the slow ``test_nvidia_tritons_config_and_metadata_as_recorded``
#: compares a live one with it
RECORDED = Path(__file__).resolve().parents[1] / "data" / "recorded" / "config_triton.json"


def _recorded(flags: tuple[str, ...]) -> dict[str, Any]:
    return json.loads(RECORDED.read_text())["disabled" if flags else "auto-complete"]


def _check_tritons(expected: dict[str, Any], flags: tuple[str, ...]) -> None:
    """What Triton's answers must show: the recorded config texts, and the versions metadata lists."""
    if not flags:
        assert {name: expected[f"HTTP config {name} "][1] for name in TRITON_CONFIGS} == TRITON_CONFIGS
    assert [json.loads(expected[f"HTTP metadata ver_all {version}"][1])["versions"]
            for version, _ in METADATA_VERSIONS] == [versions for _, versions in METADATA_VERSIONS]


def test_config_and_metadata_match_nvidia_tritons(ferry) -> None:
    flags, http_port, grpc_port = ferry
    expected = _recorded(flags)
    _check_tritons(expected, flags)
    served = json.loads(json.dumps(answers(http_port, grpc_port, served_models(flags))))
    assert {key: (value, expected.get(key)) for key, value in served.items() if value != expected.get(key)} == {}
    assert sorted(served) == sorted(expected)


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
@pytest.mark.parametrize("flags", [(), (DISABLED,)], ids=["auto-complete", "disabled"])
def test_nvidia_tritons_config_and_metadata_as_recorded(repository: Path, flags: tuple[str, ...]) -> None:
    from support.triton import running_triton

    models = served_models(flags)
    with running_triton(repository, models, *flags) as (http, grpc, _):
        got = json.loads(json.dumps(answers(http, grpc, models)))
    _check_tritons(got, flags)
    expected = _recorded(flags)
    assert {key: (value, expected.get(key)) for key, value in got.items() if value != expected.get(key)} == {}
    assert sorted(got) == sorted(expected)


# --- which configs load ------------------------------------------------------------------------------------------

#: model -> (config.pbtxt, version folders, model.py)
LOADS: dict[str, tuple[str, tuple[int, ...], str]] = {
    "ordered_priorities": (_config("ordered_priorities", "dynamic_batching { preserve_ordering: true priority_levels: 2 "
                                                         "default_priority_level: 1 }"), (1,), PY),
    "no_dims": (_config("no_dims", io='input [ { name: "INPUT0" data_type: TYPE_FP32 } ]\n'
                                      'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]'), (1,), PY),
    "shape_tensor": (_config("shape_tensor", io='input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] '
                                                'is_shape_tensor: true } ]\n'
                                                'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]'),
                     (1,), PY),
    "oldest_preferred": (_config("oldest_preferred", "sequence_batching { oldest { max_candidate_sequences: 4 "
                                                     "preferred_batch_size: [ 16 ] } }"), (1,), PY),
    "nhwc": (_config("nhwc", io='input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] format: FORMAT_NHWC } ]\n'
                                'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]'), (1,), PY),
    "empty_reshape": (_config("empty_reshape", max_batch_size=0, io='input [ { name: "INPUT0" data_type: TYPE_FP32 '
                                                                    'dims: [ 1 ] reshape { shape: [ ] } } ]\n'
                              'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]'), (1,), PY),
    "variable_reshape": (_config("variable_reshape", io='input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] '
                                                        'reshape { shape: [ -1, 2 ] } } ]\n'
                                 'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]'), (1,), PY),
    "non_linear": (_config("non_linear", io='input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] '
                                            'is_non_linear_format_io: true } ]\n'
                                            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]'),
                   (1,), PY),
    "profile": (_config("profile", 'instance_group [ { kind: KIND_CPU profile: [ "0" ] } ]'), (1,), PY),
    "no_labels": (_config("no_labels", io='input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                                          'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] '
                                          'label_filename: "labels.txt" } ]'), (1,), PY),
    "latest_none": (_config("latest_none", "version_policy { latest { num_versions: 0 } }"), (1,), PY),
    "specific_missing": (_config("specific_missing", "version_policy { specific { versions: [ 3 ] } }"), (1,), PY),
    "specific_partly": (_config("specific_partly", "version_policy { specific { versions: [ 1, 3 ] } }"), (1, 2), PY),
    "no_outputs": (_config("no_outputs", io='input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]',
                           max_batch_size=0), (1,), NO_OUTPUTS),
    "no_io_batched": (_config("no_io_batched", "dynamic_batching { }", io=""), (1,), NO_OUTPUTS),
}
#: model -> versions Triton 2.51 has READY after the load (None: the load is refused)
TRITON_LOADS: dict[str, list[str] | None] = {
    "ordered_priorities": None, "no_dims": None, "shape_tensor": None, "oldest_preferred": None, "nhwc": None,
    "empty_reshape": None, "variable_reshape": None, "non_linear": None, "profile": None, "no_labels": None,
    "latest_none": None, "specific_missing": None,
    "specific_partly": ["1"], "no_outputs": ["1"], "no_io_batched": ["1"],
}
#: words Ferry's refusal uses: Triton's own answer (each version's failure), or the reason Ferry adds to Triton's poll
#: failure (POLL_REFUSED), or Triton's load error for a version policy that leaves no version
_V1 = "version 1 is at UNAVAILABLE state: "
REFUSALS = {
    "ordered_priorities": "only one priority level is allowed when 'preserve_ordering' is true",
    "no_dims": f"{_V1}Invalid argument: model input 'INPUT0' must specify 'dims' for no_dims;",
    "shape_tensor": f"{_V1}Invalid argument: shape tensors are only supported for TensorRT platform for shape_tensor;",
    "oldest_preferred": "sequence batching preferred batch size 16 must be in 1..max_batch_size (8)",
    "nhwc": f"{_V1}Invalid argument: model input NHWC/NCHW require 3 dims for nhwc;",
    "empty_reshape": f"{_V1}Invalid argument: model input 'INPUT0' cannot have empty reshape for non-batching model as "
                     "scalar tensors are not supported for empty_reshape;",
    "variable_reshape": f"{_V1}Invalid argument: model input 'INPUT0' has different size for dims and reshape for "
                        "variable_reshape;",
    "non_linear": f"{_V1}Invalid argument: Non-linear IO format is only supported for the TensorRT platform for "
                  "non_linear;",
    "profile": f"{_V1}Invalid argument: instance group profile_0 of model profile and platform specifies profile field "
               "which is only supported for TensorRT models;",
    "no_labels": f"{_V1}Internal: failed to open text file for read ",
    "latest_none": "at least one version must be available under the version policy of model 'latest_none'",
    "specific_missing": "at least one version must be available under the version policy of model 'specific_missing'",
}
#: refused at Triton's repository poll: Triton answers its words only (the reason is in its log)
POLL_REFUSED = ("ordered_priorities", "oldest_preferred")


@pytest.fixture(scope="module")
def load_repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("loads")
    for name, (config, versions, source) in LOADS.items():
        for version in versions:
            (root / name / str(version)).mkdir(parents=True)
            (root / name / str(version) / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(config)
    return root


def load_outcomes(http_port: int) -> tuple[dict[str, list[str] | None], dict[str, str]]:
    """Each ``LOADS`` model loaded in turn: the versions READY after it (None when refused), and refusals' errors."""
    base = f"http://127.0.0.1:{http_port}/v2"
    ready: dict[str, list[str] | None] = {}
    errors: dict[str, str] = {}
    for name in LOADS:
        response = httpx.post(f"{base}/repository/models/{name}/load", timeout=120)
        if response.status_code != 200:
            ready[name], errors[name] = None, response.json()["error"]
            continue
        index = httpx.post(f"{base}/repository/index", json={"ready": True}, timeout=60).json()
        ready[name] = [entry["version"] for entry in index if entry["name"] == name]
    return ready, errors


def test_loads_as_triton(load_repository: Path) -> None:
    thread = ServerThread(make_options([load_repository], model_control_mode="explicit"))
    handle = thread.start()
    try:
        ready, errors = load_outcomes(handle.server.http_port)
        base = f"http://127.0.0.1:{handle.server.http_port}/v2/models"
        no_batch = httpx.post(f"{base}/no_io_batched/infer", json={"inputs": []}, timeout=60)
        no_outputs = httpx.post(f"{base}/no_outputs/infer", timeout=60, json={"inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]})
    finally:
        thread.stop()
    assert ready == TRITON_LOADS
    assert {name: error for name, error in errors.items() if REFUSALS[name] not in error} == {}
    # Triton's answers: a batching model cannot tell the batch size of a request without inputs (Triton says "out of
    # bounds index 0: request has 0 inputs"); a model without outputs answers with none
    assert (no_batch.status_code, no_batch.json()["error"]) == (
        400, "[request id: <id_unknown>] inference request batch-size must be >= 1 for 'no_io_batched'")
    assert (no_outputs.status_code, no_outputs.json()) == (
        200, {"model_name": "no_outputs", "model_version": "1", "outputs": []})


@pytest.mark.slow  # live tritonserver: with -m slow
def test_nvidia_triton_loads_as_the_table_says(load_repository: Path) -> None:
    from support.triton import running_triton

    with running_triton(load_repository, []) as (http_port, _, _):
        ready, errors = load_outcomes(http_port)
    assert ready == TRITON_LOADS
    assert {name: error for name, error in errors.items()
            if name not in POLL_REFUSED and REFUSALS[name] not in error} == {}
