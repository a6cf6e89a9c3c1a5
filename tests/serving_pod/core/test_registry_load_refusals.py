"""Load refusals as tritonserver 2.51 answers and lists them (explicit model control), side by side with Triton.

Measured on Triton 2.51 (CPU, python backend) and matched here, over HTTP and gRPC (each load is a model's first
attempt: Triton answers later attempts differently, see below):
- an ensemble refused with its composing models answers 400 / INVALID_ARGUMENT ``load failed for model '<ens>': <why>``
  and a newline, ``<why>`` in Triton's words: ``ensemble <ens> contains models that are not available or ambiguous:
  <m>`` (a step's model the repository does not hold, or whose config is refused there), ``ensemble '<ens>' depends on
  '<m>' which has no loaded version. Model '<m>' loading failed with error: <its failure>`` (its versions failed, it
  has none), ``ensemble '<ens>' depends on '<m>' which is not valid. Model '<m>' failed with error: <why>`` (a
  composing ensemble refused), ``ensemble <ens> allows maximum batch size ...``; the index lists no version of it;
- ensembles over themselves or each other: ``load failed for model '<ens>': circular dependency between ensembles:
  <ens> -> ... -> <last> -> <ens>`` (``<last>``: the ensemble whose step is ``<ens>``; itself for a self-reference);
- a config refused while Triton polls the repository (config.pbtxt that does not parse, a name that is not the
  folder's, a batcher's preferred size above max_batch_size, sequence batching controls, an ensemble's own steps)
  answers 500 / INTERNAL ``failed to load '<m>', failed to poll from model repository``, and the index lists no
  version of it; its config / metadata answer 404 ``is not found``;
- a sequence ``state`` refused when the version's scheduler is made is a version's failure: ``load failed for model
  '<m>': version 1 is at UNAVAILABLE state: <status>: <why>;`` (an ``initial_state`` data file that is missing:
  ``Internal: failed to open text file for read <path>: No such file or directory``), and the index lists version 1
  UNAVAILABLE with that reason;
- so are the checks Triton makes as it creates each version (400 / INVALID_ARGUMENT, every version failing with the
  same reason, each listed UNAVAILABLE with it): the tensors (``Invalid argument: model input 'X' must specify
  'data_type' for m``; dims, reshape, NHWC, shape tensors, non-linear IO), the instance groups (``instance group m_0
  of model m has kind KIND_CPU but specifies one or more GPUs``, a ``profile`` outside TensorRT) and label files
  (``Internal: failed to open text file for read <path>: ...``); an ensemble over such a model quotes it as one
  ``which has no loaded version``. Under ``--disable-auto-complete-config`` Triton checks the tensors while it polls
  the repository: 500 ``failed to poll from model repository``;
- unloading a composing model unloads the ensembles over it first, and an ensemble unloaded with
  ``unload_dependents`` goes before its composing models (the ``successfully unloaded`` lines in that order);
- a load of a loaded model whose files did not change does nothing in Triton (HTTP and gRPC: no ``initialize``,
  statistics kept): Ferry already did so (tests/serving_pod/test_model_control.py). Triton seems to reset statistics
  at the first such load only because its python stub writes ``__pycache__`` into the version folder at the first load,
  which makes that version newer; with the bytecode already there it does nothing.

Kept different on purpose (clearer):
- a poll refusal keeps Triton's status and words, then a colon and the reason, which Triton only logs.
- the index row of a model refused before any version keeps ``state: UNAVAILABLE`` and the reason (no ``version``),
  where Triton's row holds the name only (no state, no reason: those are in its log).
- a model directory without a version folder leaves Triton's index altogether after its failed load (listed before
  it); Ferry keeps listing it, as any model of the repository.
- later attempts at a refused ensemble answer in Triton ``failed to load '<ens>', no version is available`` or ``...,
  failed to poll from model repository`` (500, reason lost); Ferry answers the reason again.
- an ensemble over a cycle of ensembles it is not part of crashes Triton 2.51 (its cycle check recurses forever);
  Ferry refuses it with the cycle: ``load failed for model '<ens>': circular dependency between ensembles: <a> ->
  ... -> <b> -> <a>``. In a cycle of three or more Triton starts the text at an ensemble its hash map picks; Ferry at
  the ensemble loaded.
- with several failing composing models Triton names one its hash map picks; Ferry the first in step order.
- a model whose versions all fail lists them in Triton's answer in the order they finished loading; Ferry's in
  ascending order (compared sorted).
- an ensemble's own tensor that Triton refuses: Triton finds it with the steps (``in ensemble <ens>, ensemble tensor
  IN: inconsistent data type: TYPE_INVALID is inferred from model <ens> while TYPE_FP32 is inferred from model
  <step>``); Ferry names the tensor check, as for any model (``model input 'IN' must specify 'data_type' for
  <ens>``), before loading the steps. Both: 400 ``load failed for model '<ens>': <why>`` and a newline.
- Ferry's reasons for a step that does not fit the ensemble (``validate_mapping``) name the step (``step 0 (model
  'ident')``) and quote names where Triton's do not; a python model's error keeps no traceback.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient
from support.server import ensemble_config, write_model
from tritonclient.utils import InferenceServerException

_IDENT_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
"""
_SEQ = ('sequence_batching {{ control_input [ {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID '
        'data_type: TYPE_INT32 }} ] }} ] {} }}')
_STATE = ('state [ {{ input_name: "IS" output_name: "OS" data_type: TYPE_FP32 dims: [ 1 ] initial_state {{ '
          'data_type: {} dims: [ 1 ] name: "init" {} }} }} ]')
#: loaded in this order over HTTP (Triton answers an ensemble's reason at its first attempt)
MODELS = ("ens_mbs", "badconfig", "seq_controls", "seq_state")


_IN = 'name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ]'
_OUT = 'name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ]'


def _ident(name: str, extra: str = "", inputs: str = _IN, outputs: str = _OUT) -> str:
    groups = "" if "instance_group" in extra else "instance_group [ { count: 1 kind: KIND_CPU } ]"
    return f"""name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ {inputs} }} ]
output [ {{ {outputs} }} ]
{groups}
{extra}
"""


#: configs Triton refuses for each version it tries: (input, output, more of the config)
_VERSION_CONFIGS = {
    "in_notype": ('name: "INPUT0" dims: [ 4 ]', _OUT, ""),
    "out_nodims": (_IN, 'name: "OUTPUT0" data_type: TYPE_FP32', ""),
    "in_noname": ('data_type: TYPE_FP32 dims: [ 4 ]', _OUT, ""),
    "in_zerodim": ('name: "INPUT0" data_type: TYPE_FP32 dims: [ 4, 0 ]', _OUT, ""),
    "reshape_zero": (f"{_IN} reshape {{ shape: [ 0 ] }}", _OUT, ""),
    "reshape_size": (f"{_IN} reshape {{ shape: [ 3 ] }}", _OUT, ""),
    "reshape_runs": ('name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape { shape: [ 4, -1 ] }', _OUT, ""),
    "reshape_vars": ('name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] reshape { shape: [ -1, -1 ] }', _OUT, ""),
    "in_nhwc": (f"{_IN} format: FORMAT_NHWC", _OUT, ""),
    "out_shape_tensor": (_IN, 'name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] is_shape_tensor: true', ""),
    "non_linear": (f"{_IN} is_non_linear_format_io: true", _OUT, ""),
    "cpu_gpus": (_IN, _OUT, "instance_group [ { count: 1 kind: KIND_CPU gpus: [ 0 ] } ]"),
    "profile": (_IN, _OUT, 'instance_group [ { count: 1 kind: KIND_CPU profile: [ "0" ] } ]'),
    "label_missing": (_IN, f'{_OUT} label_filename: "labels.txt"', ""),
    "two_versions": ('name: "INPUT0" dims: [ 4 ]', _OUT, "version_policy { all { } }"),
}


def _over(name: str, steps: list[str], ensembles: bool = False) -> str:
    """An ensemble over ``steps``: identity models, or ensembles made here (``ensembles``)."""
    return ensemble_config(name, steps, max_batch_size=4, ports=("IN", "OUT") if ensembles else ("INPUT0", "OUTPUT0"))


def _repository(root):
    files = {"1/model.py": _IDENT_PY}
    write_model(root, "ident", _ident("ident"), files=files)
    write_model(root, "ens_mbs", ensemble_config("ens_mbs", ["ident"], max_batch_size=8))
    write_model(root, "badconfig", 'name: "badconfig" backend: "python" max_batch_size: [oops\n', files=files)
    write_model(root, "seq_controls", _ident("seq_controls", 'sequence_batching { control_input [ { name: "S" control [ '
                '{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1, 2 ] } ] } ] }'), files=files)
    write_model(root, "seq_state", _ident("seq_state", _SEQ.format(_STATE.format("TYPE_INT32", "zero_data: true"))),
                files=files)
    (root / "noversion").mkdir()
    (root / "noversion" / "config.pbtxt").write_text(_ident("noversion"))
    # the table's models (REFUSALS)
    write_model(root, "seq_file", _ident("seq_file", _SEQ.format(_STATE.format("TYPE_FP32", 'data_file: "missing.bin"'))),
                files=files)
    write_model(root, "ens_self", _over("ens_self", ["ens_self"], ensembles=True))
    write_model(root, "ens_a", _over("ens_a", ["ens_b"], ensembles=True))
    write_model(root, "ens_b", _over("ens_b", ["ens_a"], ensembles=True))
    write_model(root, "ens_c", _over("ens_c", ["ident", "ens_c2"]))
    write_model(root, "ens_c2", _over("ens_c2", ["ens_c"], ensembles=True))
    write_model(root, "ens_d", _over("ens_d", ["ens_a"], ensembles=True))  # over a cycle: Triton crashes
    write_model(root, "ens_missing", _over("ens_missing", ["nothere"]))
    write_model(root, "ens_inner", _over("ens_inner", ["nothere2"]))
    write_model(root, "ens_outer", _over("ens_outer", ["ens_inner"], ensembles=True))
    write_model(root, "ens_seqfile", _over("ens_seqfile", ["seq_file"]))
    write_model(root, "ens_noversion", _over("ens_noversion", ["noversion"]))
    write_model(root, "ens_badconfig", _over("ens_badconfig", ["badconfig"]))
    write_model(root, "dyn_pref", _ident("dyn_pref", "dynamic_batching { preferred_batch_size: [ 8 ] }"), files=files)
    for name, (inputs, outputs, extra) in _VERSION_CONFIGS.items():
        write_model(root, name, _ident(name, extra, inputs, outputs), files={**files, **(
            {"2/model.py": _IDENT_PY} if name == "two_versions" else {})})
    write_model(root, "ens_over_notype", _over("ens_over_notype", ["in_notype"]))
    write_model(root, "ens_ident", _over("ens_ident", ["ident"]))
    write_model(root, "ens_notype", _over("ens_notype", ["ident"]).replace('name: "IN" data_type: TYPE_FP32',
                                                                            'name: "IN"', 1))
    write_model(root, "ens_nosteps", 'name: "ens_nosteps" platform: "ensemble" max_batch_size: 4 input [ { name: "IN" '
                'data_type: TYPE_FP32 dims: [ 4 ] } ] output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ] '
                'ensemble_scheduling { }')
    return root


def _answers(http_port: int) -> dict[str, object]:
    base = f"http://127.0.0.1:{http_port}/v2"
    answers: dict[str, object] = {}
    for name in MODELS:
        response = httpx.post(f"{base}/repository/models/{name}/load", timeout=120)
        answers[name] = (response.status_code, response.json().get("error"))
    index = httpx.post(f"{base}/repository/index", timeout=60).json()
    answers["index"] = [row for row in index if row["name"] in MODELS]
    answers["config"] = {name: httpx.get(f"{base}/models/{name}/config", timeout=60).status_code for name in MODELS}
    return answers


STATE_REASON = ("Invalid argument: The data type used for 'initial_state' field of state 'IS' does not match the "
                "state data type.")
ENS_MBS = ("load failed for model 'ens_mbs': ensemble ens_mbs allows maximum batch size 8, but it contains model "
           "ident which only allows maximum batch size to be 4\n")
SEQ_STATE = f"load failed for model 'seq_state': version 1 is at UNAVAILABLE state: {STATE_REASON};\n"
EXPECTED_INDEX = [{"name": "badconfig"}, {"name": "ens_mbs"}, {"name": "seq_controls"},
                  {"name": "seq_state", "version": "1", "state": "UNAVAILABLE", "reason": STATE_REASON}]
#: Triton's first answers (HTTP 400 / INVALID_ARGUMENT) to these loads, ``<repository>`` standing for the repository
_MISSING_FILE = ("version 1 is at UNAVAILABLE state: Internal: failed to open text file for read "
                 "<repository>/seq_file/initial_state/missing.bin: No such file or directory;")
_DIMS = "dimension must be integer >= 1, or -1 to indicate a variable-size dimension"
#: Triton's reason for each version of these models (``Invalid argument: `` unless the status is given)
VERSION_REASONS = {
    "in_notype": "model input 'INPUT0' must specify 'data_type' for in_notype",
    "out_nodims": "model output 'OUTPUT0' must specify 'dims' for out_nodims",
    "in_noname": "model input must specify 'name' for in_noname",
    "in_zerodim": f"model input 'INPUT0' {_DIMS} for in_zerodim",
    "reshape_zero": f"model input 'INPUT0' reshape {_DIMS.replace('dimension', 'dimensions', 1)} for reshape_zero",
    "reshape_size": "model input 'INPUT0' has different size for dims and reshape for reshape_size",
    "reshape_runs": "model input 'INPUT0' has different size for dims and reshape for reshape_runs",
    "reshape_vars": "model input 'INPUT0' has different number of variable-size dimensions for dims and reshape for "
                    "reshape_vars",
    "in_nhwc": "model input NHWC/NCHW require 3 dims for in_nhwc",
    "out_shape_tensor": "shape tensors are only supported for TensorRT platform for out_shape_tensor",
    "non_linear": "Non-linear IO format is only supported for the TensorRT platform for non_linear",
    "cpu_gpus": "instance group cpu_gpus_0 of model cpu_gpus has kind KIND_CPU but specifies one or more GPUs",
    "profile": "instance group profile_0 of model profile and platform specifies profile field which is only "
               "supported for TensorRT models",
    "label_missing": "Internal: failed to open text file for read <repository>/label_missing/labels.txt: No such file "
                     "or directory",
    "two_versions": "model input 'INPUT0' must specify 'data_type' for two_versions",
}


def _version_reason(name: str) -> str:
    reason = VERSION_REASONS[name]
    return reason if reason.startswith("Internal: ") else f"Invalid argument: {reason}"


def _versions_failed(name: str) -> str:
    """Triton's answer to loading a VERSION_REASONS model: each version's failure (ascending: module docstring)."""
    versions = (1, 2) if name == "two_versions" else (1,)
    return f"load failed for model '{name}': " + "".join(
        f"version {v} is at UNAVAILABLE state: {_version_reason(name)};" for v in versions) + "\n"


REFUSALS = {
    **{name: _versions_failed(name) for name in VERSION_REASONS},
    "ens_over_notype": "load failed for model 'ens_over_notype': ensemble 'ens_over_notype' depends on 'in_notype' "
                       "which has no loaded version. Model 'in_notype' loading failed with error: version 1 is at "
                       f"UNAVAILABLE state: Invalid argument: {VERSION_REASONS['in_notype']};\n",
    "seq_file": f"load failed for model 'seq_file': {_MISSING_FILE}\n",
    "ens_self": "load failed for model 'ens_self': circular dependency between ensembles: ens_self -> ... -> ens_self "
                "-> ens_self\n",
    "ens_a": "load failed for model 'ens_a': circular dependency between ensembles: ens_a -> ... -> ens_b -> ens_a\n",
    "ens_c": "load failed for model 'ens_c': circular dependency between ensembles: ens_c -> ... -> ens_c2 -> ens_c\n",
    "ens_missing": "load failed for model 'ens_missing': ensemble ens_missing contains models that are not available "
                   "or ambiguous: nothere\n",
    "ens_outer": "load failed for model 'ens_outer': ensemble 'ens_outer' depends on 'ens_inner' which is not valid. "
                 "Model 'ens_inner' failed with error: ensemble ens_inner contains models that are not available or "
                 "ambiguous: nothere2\n",
    "ens_seqfile": "load failed for model 'ens_seqfile': ensemble 'ens_seqfile' depends on 'seq_file' which has no "
                   f"loaded version. Model 'seq_file' loading failed with error: {_MISSING_FILE}\n",
    "ens_noversion": "load failed for model 'ens_noversion': ensemble 'ens_noversion' depends on 'noversion' which has "
                     "no loaded version. Model 'noversion' loading failed with error: at least one version must be "
                     "available under the version policy of model 'noversion'\n",
    "ens_badconfig": "load failed for model 'ens_badconfig': ensemble ens_badconfig contains models that are not "
                     "available or ambiguous: badconfig\n",
}
#: refused at Triton's repository poll (HTTP 500 / INTERNAL): Ferry's reason, after Triton's words (module docstring)
POLL_REFUSALS = {
    "dyn_pref": "model 'dyn_pref': preferred batch size 8 must be in 1..max_batch_size (4)",
    "ens_nosteps": "must specify 'step' for ensemble 'ens_nosteps'",
    "seq_controls": "sequence batching control 'int32_false_true' must have exactly 2 entries for "
                    "CONTROL_SEQUENCE_START for seq_controls",
}


def _names_only(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """Rows without a version as Triton words them: the name only (Ferry adds state and reason: module docstring)."""
    return [row if "version" in row else {"name": row["name"]} for row in rows]


def _load(protocol: str, http_port: int, grpc_port: int, name: str) -> tuple[str, str]:
    """(status, error) of loading ``name``: the HTTP status or the gRPC code, ``("OK", "")`` when it loads."""
    if protocol == "http":
        response = httpx.post(f"http://127.0.0.1:{http_port}/v2/repository/models/{name}/load", timeout=120)
        return (str(response.status_code), response.json().get("error", "")) if response.status_code != 200 else ("OK", "")
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        try:
            client.load_model(name)
        except InferenceServerException as error:
            return str(error.status()), error.message()
    return "OK", ""


def _refusals(http_port: int, grpc_port: int, protocols: tuple[str, ...]) -> dict[tuple[str, str], tuple[str, str]]:
    """Each REFUSALS / POLL_REFUSALS model loaded over each of ``protocols`` in turn, paths made ``<repository>``."""
    got = {}
    for name in [*REFUSALS, *POLL_REFUSALS]:
        for protocol in protocols:
            status, error = _load(protocol, http_port, grpc_port, name)
            got[(name, protocol)] = (status, _ascending(_repository_paths(error)))
    return got


def _repository_paths(text: str) -> str:
    return re.sub(r"read \S*/(seq_file|label_missing)/", r"read <repository>/\1/", text)


def _ascending(error: str) -> str:
    """A load error with its versions' failures in ascending order (Triton's: the order its versions finished)."""
    head, sep, tail = error.partition(": version ")
    if not sep:
        return error
    failures = re.split(r";(?=version \d+ is at )", "version " + tail.rstrip("\n").rstrip(";"))
    return head + ": " + "".join(f"{failure};" for failure in sorted(failures)) + "\n"


def _version_rows(http_port: int) -> list[dict[str, str]]:
    """The index rows of the VERSION_REASONS models."""
    rows = httpx.post(f"http://127.0.0.1:{http_port}/v2/repository/index", timeout=60).json()
    return [{**row, "reason": _repository_paths(row.get("reason", ""))} for row in rows if row["name"] in VERSION_REASONS]


#: each version of a VERSION_REASONS model is listed UNAVAILABLE with its reason, as Triton lists it
VERSION_ROWS = [{"name": name, "version": str(version), "state": "UNAVAILABLE", "reason": _version_reason(name)}
                for name in sorted(VERSION_REASONS) for version in ((1, 2) if name == "two_versions" else (1,))]


def _expected(protocols: tuple[str, ...]) -> dict[tuple[str, str], tuple[str, str]]:
    """Triton's answers; a poll refusal's with Ferry's reason after Triton's words (module docstring)."""
    status = {"http": ("400", "500"), "grpc": ("StatusCode.INVALID_ARGUMENT", "StatusCode.INTERNAL")}
    expected = {(name, p): (status[p][0], message) for name, message in REFUSALS.items() for p in protocols}
    expected |= {(name, p): (status[p][1], f"failed to load '{name}', failed to poll from model repository: {reason}")
                 for name, reason in POLL_REFUSALS.items() for p in protocols}
    return expected


def test_refusals_over_http_and_grpc_as_nvidia_tritons(threaded_server, tmp_path):
    """Each load answers Triton's first answer over both protocols (Ferry repeats it at the second attempt), and none
    of the refused models is listed with a version."""
    server = threaded_server([_repository(tmp_path / "models")], model_control_mode="explicit")
    http, grpc = server.server.http_port, server.server.grpc_port
    assert _refusals(http, grpc, ("http", "grpc")) == _expected(("http", "grpc"))
    # an ensemble over a cycle it is not in: Triton 2.51 crashes (module docstring)
    assert _load("grpc", http, grpc, "ens_d") == (
        "StatusCode.INVALID_ARGUMENT",
        "load failed for model 'ens_d': circular dependency between ensembles: ens_a -> ... -> ens_b -> ens_a\n")
    rows = httpx.post(f"http://127.0.0.1:{http}/v2/repository/index", timeout=60).json()
    versions = {row["name"]: row.get("version") for row in rows}
    assert versions["seq_file"] == "1" and versions["ident"] == "1"  # ens_c loaded ident, as Triton
    assert {name for name, version in versions.items() if version} == {"seq_file", "ident", *VERSION_REASONS}
    assert _version_rows(http) == VERSION_ROWS
    # an ensemble's own bad tensor: Triton's words are its graph check's (module docstring)
    assert _load("http", http, grpc, "ens_notype") == (
        "400", "load failed for model 'ens_notype': model input 'IN' must specify 'data_type' for ens_notype\n")


#: Triton's refusal of an ensemble's own bad tensor: its graph check's words (module docstring)
ENS_NOTYPE = ("load failed for model 'ens_notype': in ensemble ens_notype, ensemble tensor IN: inconsistent data type: "
              "TYPE_INVALID is inferred from model ens_notype while TYPE_FP32 is inferred from model ident\n")


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_nvidia_triton_refuses_as_the_table_says(tmp_path, protocol):
    from support.triton import running_triton

    with running_triton(_repository(tmp_path / "models"), []) as (http, grpc, _):
        got = _refusals(http, grpc, (protocol,))
        rows = _version_rows(http)
        ensemble = _load("http", http, grpc, "ens_notype")
    assert rows == VERSION_ROWS
    assert ensemble == ("400", ENS_NOTYPE)
    expected = _expected((protocol,))
    for name in POLL_REFUSALS:  # Triton's words only: the reason is in its log
        status, message = expected[(name, protocol)]
        expected[(name, protocol)] = (status, message.split(": ")[0])
    assert got == expected


def test_load_refusals_and_their_index_rows(threaded_server, tmp_path):
    repository = _repository(tmp_path / "models")
    server = threaded_server([repository], model_control_mode="explicit")
    got = _answers(server.server.http_port)
    assert got["ens_mbs"] == (400, ENS_MBS)
    assert got["seq_state"] == (400, SEQ_STATE)
    assert _names_only(got["index"]) == EXPECTED_INDEX
    refused = {row["name"]: (row["state"], row["reason"]) for row in got["index"] if "version" not in row}
    assert refused["ens_mbs"] == ("UNAVAILABLE", got["ens_mbs"][1])
    assert refused["seq_controls"] == ("UNAVAILABLE", got["seq_controls"][1])
    assert got["config"] == dict.fromkeys(MODELS, 404)
    # Triton's 500 and words, then the reason Triton only logs (module docstring)
    assert got["seq_controls"] == (500, "failed to load 'seq_controls', failed to poll from model repository: "
                                        + POLL_REFUSALS["seq_controls"])
    assert got["badconfig"][0] == 500
    assert got["badconfig"][1].startswith("failed to load 'badconfig', failed to poll from model repository: "
                                          "failed to parse config.pbtxt of model 'badconfig': ")


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_load_refusals_and_their_index_rows_as_nvidia_tritons(tmp_path):
    from support.triton import running_triton

    with running_triton(_repository(tmp_path / "models"), []) as (http, _, _):
        expected = _answers(http)
    assert expected["ens_mbs"] == (400, ENS_MBS)
    assert expected["seq_state"] == (400, SEQ_STATE)
    assert expected["index"] == EXPECTED_INDEX
    assert expected["config"] == dict.fromkeys(MODELS, 404)
    for name in ("badconfig", "seq_controls"):
        assert expected[name] == (500, f"failed to load '{name}', failed to poll from model repository")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_refused_models_list_no_version_and_are_not_found(threaded_server, tmp_path, protocol):
    """Over both protocols: every attempt answers the same reason, and a model refused before any version (a model
    directory without a version folder included) is listed with its reason and no version (Triton drops the directory
    without a version folder from its index: module docstring). A config request finds the ensemble unknown and the
    directory without a version folder held with no version, as Triton's (test_registry_failed_models.py)."""
    server = threaded_server([_repository(tmp_path / "models")], model_control_mode="explicit")
    client: Any = server.client(protocol)
    for name in ("ens_mbs", "noversion", "ens_mbs"):
        with pytest.raises(InferenceServerException) as error:
            client.load_model(name)
        if name == "ens_mbs":
            assert error.value.message().startswith("load failed for model 'ens_mbs': ensemble ens_mbs allows")
    rows = client.get_model_repository_index(**({"as_json": True} if protocol == "grpc" else {}))
    rows = rows["models"] if protocol == "grpc" else rows
    rows = {row["name"]: row for row in rows if row["name"] in ("ens_mbs", "noversion")}
    assert "version" not in rows["ens_mbs"] and "version" not in rows["noversion"]
    assert rows["ens_mbs"]["reason"].startswith("load failed for model 'ens_mbs': ensemble ens_mbs allows")
    assert "at least one version must be available" in rows["noversion"]["reason"]
    with pytest.raises(InferenceServerException, match="'ens_mbs' is not found"):
        client.get_model_config("ens_mbs")
    with pytest.raises(InferenceServerException, match="'noversion' has no available versions"):
        client.get_model_config("noversion")


#: under --disable-auto-complete-config Triton checks the tensors while it polls the repository (500 "failed to poll",
#: Ferry's reason after it: module docstring); instance groups and label files still fail each version
NO_AUTOCOMPLETE = ("in_notype", "cpu_gpus", "label_missing")


def _no_autocomplete(http_port: int, grpc_port: int, protocol: str, triton: bool) -> None:
    got = {name: _load(protocol, http_port, grpc_port, name) for name in NO_AUTOCOMPLETE}
    got = {name: (status, _repository_paths(error)) for name, (status, error) in got.items()}
    statuses = {"http": ("400", "500"), "grpc": ("StatusCode.INVALID_ARGUMENT", "StatusCode.INTERNAL")}
    invalid, internal = statuses[protocol]
    poll = "failed to load 'in_notype', failed to poll from model repository"
    assert got == {"in_notype": (internal, poll if triton else f"{poll}: {VERSION_REASONS['in_notype']}"),
                   "cpu_gpus": (invalid, _versions_failed("cpu_gpus")),
                   "label_missing": (invalid, _versions_failed("label_missing"))}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_without_auto_complete_tensors_are_refused_at_the_poll(threaded_server, tmp_path, protocol):
    server = threaded_server([_repository(tmp_path / "models")], model_control_mode="explicit", autocomplete=False)
    _no_autocomplete(server.server.http_port, server.server.grpc_port, protocol, triton=False)


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_triton_without_auto_complete_refuses_tensors_at_the_poll(tmp_path):
    from support.triton import running_triton

    with running_triton(_repository(tmp_path / "models"), [], "--disable-auto-complete-config") as (http, grpc, _):
        _no_autocomplete(http, grpc, "http", triton=True)


#: the unload lines of unloading a composing model, then of unloading its ensemble with ``unload_dependents``: the
#: ensemble goes first both times (Triton's order; its index lists both ``UNAVAILABLE`` / ``unloaded`` after)
UNLOADS = ["successfully unloaded 'ens_ident' version 1", "successfully unloaded 'ident' version 1"] * 2


def _unloads(http_port: int, unloaded: Callable[[], list[str]]) -> list[str]:
    """Load ``ens_ident`` (and its step), unload ``ident``; load it again, unload it with its composing models: the
    ``successfully unloaded`` lines (``unloaded``: those logged so far), once the index lists both unloaded."""
    base = f"http://127.0.0.1:{http_port}/v2/repository"
    for body in ({}, {"parameters": {"unload_dependents": True}}):
        assert httpx.post(f"{base}/models/ens_ident/load", timeout=120).status_code == 200
        unload = "ident" if not body else "ens_ident"
        assert httpx.post(f"{base}/models/{unload}/unload", json=body, timeout=120).status_code == 200
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # Triton's unload answers before its python stub has gone
            rows = httpx.post(f"{base}/index", timeout=60).json()
            states = {row["name"]: (row.get("state"), row.get("reason")) for row in rows}
            if states["ident"] == states["ens_ident"] == ("UNAVAILABLE", "unloaded"):
                break
            time.sleep(0.2)
    return unloaded()


def test_an_ensemble_unloads_before_its_composing_model(threaded_server, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="ferry.registry")
    server = threaded_server([_repository(tmp_path / "models")], model_control_mode="explicit")
    lines = _unloads(server.server.http_port, lambda: [record.getMessage() for record in caplog.records
                                                       if record.getMessage().startswith("successfully unloaded")])
    assert lines == UNLOADS


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_triton_unloads_an_ensemble_before_its_composing_model(tmp_path):
    from support.triton import running_triton

    log_file = tmp_path / "triton.log"

    def unloaded() -> list[str]:
        return re.findall(r"\] \"(successfully unloaded [^\"]*)\"", log_file.read_text())

    with running_triton(_repository(tmp_path / "models"), [], f"--log-file={log_file}") as (http, _, _):
        lines = _unloads(http, unloaded)
    assert lines == UNLOADS
