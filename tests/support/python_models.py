"""Python test models from ``tests/serving_pod/backends/data`` installed into a test repository.

``install_python_model(repo, "py_scale", "scale", parameters={"FACTOR": "3"}, isolated=True)``
copies the model folder under a new name, renames it in ``config.pbtxt`` and appends config
parameters (``isolated`` adds ``FERRY_ISOLATED``, so the model runs in its own process).

NVIDIA Triton's own QA models are not part of this project: ``triton_qa_models_or_skip()`` finds them in a
Triton server source tree named by ``FERRY_TRITON_SERVER_SOURCE`` (opt-in runs, skipped where it is unset) and
``install_triton_qa_model`` lays one out in a test repository as Triton's QA scripts do.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "serving_pod" / "backends" / "data"

#: a python model answering each request with its ``request.parameters()`` JSON (PARAMS, one BYTES element)
PARAMS_CONFIG = """
name: "params"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

PARAMS_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PARAMS", np.array([r.parameters().encode()], np.object_))])
                for r in requests]
'''

#: ``add_sub`` as the side-by-side modules serve it to Ferry and Triton: INT32[4] x2 -> sum and difference
ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""

ADD_SUB_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (a + b).astype(np.int32)),
                                                   pb_utils.Tensor("OUTPUT1", (a - b).astype(np.int32))]))
        return out
'''


#: ``ens``: one step over ``add_sub`` (A, B -> SUM)
ADD_SUB_ENSEMBLE = '''
name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_INT32 dims: [ 4 ] }, { name: "B" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "add_sub" model_version: -1
  input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
  output_map { key: "OUTPUT0" value: "SUM" } } ] }
'''

#: decoupled ``counter``: N responses I = 0..N-1, then the final flag; N = -k sends k - 1 responses and an error
COUNT_CONFIG = """
name: "counter"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "I" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

COUNT_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            for i in range(abs(count) - 1 if count < 0 else count):  # -k: k - 1 responses, then an error
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32))]))
            if count < 0:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative count")))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


#: a python model that answers each request's ``INPUT0`` as its ``OUTPUT0``
IDENTITY_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            request, "INPUT0").as_numpy())]) for request in requests]
'''

#: a python model whose ``initialize`` raises ``{error}`` (``str.format`` it with an exception expression)
INITIALIZE_RAISES = '''
class TritonPythonModel:
    def initialize(self, args):
        raise {error}

    def execute(self, requests):
        return []
'''


def execution_mode(mode: str) -> str:
    """The config parameter that puts a model's executions on its thread, on the loop thread, or lets Ferry choose."""
    return f'parameters {{ key: "ferry_execution_mode" value {{ string_value: "{mode}" }} }}'


def in_out_config(name: str, max_batch_size: int, extra: str = "") -> str:
    """The config of a python model ``name`` with one INT32 ``IN`` and ``OUT`` of dims [1] and one CPU instance, and
    ``extra`` (scheduling, parameters) after them."""
    return f'''name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}
'''


def install_python_model(
    repository: Path,
    source: str,
    name: str,
    *,
    parameters: dict[str, str] | None = None,
    isolated: bool = False,
) -> Path:
    target = repository / name
    shutil.copytree(DATA / source, target, ignore=shutil.ignore_patterns("__pycache__"))
    config = target / "config.pbtxt"
    text = re.sub(r'^name: ".*"$', f'name: "{name}"', config.read_text(), count=1, flags=re.M)
    settings = dict(parameters or {})
    if isolated:
        settings["FERRY_ISOLATED"] = "true"
    for key, value in settings.items():
        text += f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'
    config.write_text(text)
    return target


#: a checkout of triton-inference-server/server at ``TRITON_QA_TAG``, whose ``qa/python_models`` the opt-in tests run
TRITON_SERVER_SOURCE = "FERRY_TRITON_SERVER_SOURCE"
TRITON_QA_TAG = "v2.51.0"


def triton_qa_models_or_skip() -> Path:
    """``qa/python_models`` of the source tree named by ``FERRY_TRITON_SERVER_SOURCE``; skips the test where the
    variable is unset, fails it where the variable names no such folder."""
    import pytest

    source = os.environ.get(TRITON_SERVER_SOURCE, "")
    if not source:
        pytest.skip(f"{TRITON_SERVER_SOURCE} is not set: name a checkout of triton-inference-server/server at "
                    f"{TRITON_QA_TAG} to run Triton's own QA models (qa/python_models) unmodified")
    models = Path(source) / "qa" / "python_models"
    if not models.is_dir():
        pytest.fail(f"{TRITON_SERVER_SOURCE}={source}: no qa/python_models there (want a checkout of "
                    f"triton-inference-server/server at {TRITON_QA_TAG})")
    return models


def install_triton_qa_model(repository: Path, models: Path, source: str, name: str | None = None) -> Path:
    """``<models>/<source>/{model.py,config.pbtxt}`` as ``<repository>/<name>/1/model.py`` and ``config.pbtxt``,
    renamed in the config where it names itself."""
    name = name or source
    target = repository / name
    (target / "1").mkdir(parents=True)
    shutil.copyfile(models / source / "model.py", target / "1" / "model.py")
    config = (models / source / "config.pbtxt").read_text()
    config = re.sub(r'^name: ".*"$', f'name: "{name}"', config, count=1, flags=re.MULTILINE)
    (target / "config.pbtxt").write_text(config)
    return target
