"""``sys.argv`` as a python model sees it: ``[""]``, as in Triton 2.51's stub process (``python_argv``).

Triton's QA models (``bls``, ``bls_memory``, ``custom_metrics``, ``dlpack_test``...) run their checks with
``unittest.main("model", exit=False)``, which parses ``sys.argv``: in Ferry's process that held the server's (here:
pytest's) flags, which unittest refused (``SystemExit`` from its argument parser: the request failed). A model's
edits of its ``sys.argv`` stay its own, and the server's code keeps reading the server's arguments.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.server import write_model

CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
'''

#: Triton's QA pattern: the model's own test case run by ``unittest.main("model", exit=False)``
UNITTEST_MODEL = '''
import json
import sys
import threading
import unittest

import numpy as np
import triton_python_backend_utils as pb_utils


class ArgvTest(unittest.TestCase):
    def test_argv(self):
        self.assertEqual(sys.argv, [""])


def seen_from_a_thread():
    seen = []
    thread = threading.Thread(target=lambda: seen.append(list(sys.argv)))
    thread.start()
    thread.join()
    return seen[0]


class TritonPythonModel:
    def execute(self, requests):
        test = unittest.main("model", exit=False)
        before = list(sys.argv)
        sys.argv.append("--mine")  # a model's own edit
        text = json.dumps([test.result.wasSuccessful(), test.result.testsRun, before, sys.argv[:],
                           seen_from_a_thread()])
        sys.argv.remove("--mine")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text.encode()], np.object_))])
                for _ in requests]
'''

#: (tests passed, tests run, argv, argv after the model's edit, argv in a thread the model starts)
EXPECTED = [True, 1, [""], ["", "--mine"], ["", "--mine"]]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("argv")
    write_model(root, "unittest_main", CONFIG.format(name="unittest_main"), {"1/model.py": UNITTEST_MODEL})
    write_model(root, "unittest_isolated", CONFIG.format(name="unittest_isolated")
                + 'parameters { key: "FERRY_ISOLATED" value { string_value: "true" } }\n',
                {"1/model.py": UNITTEST_MODEL})
    return root


def _ask(client: Any, module: Any, model: str) -> Any:
    tensor = module.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([0], np.int32))
    return json.loads(client.infer(model, [tensor]).as_numpy("OUT")[0])


@pytest.mark.parametrize("model", ["unittest_main", "unittest_isolated"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_reads_the_stubs_argv(threaded_server: Any, repository: Path, protocol: str, model: str) -> None:
    server_argv = list(sys.argv)
    server = threaded_server([repository], model_control_mode="explicit", load_models=(model,))
    assert _ask(server.client(protocol), server.module(protocol), model) == EXPECTED
    assert sys.argv == server_argv and len(sys.argv) == len(server_argv)  # the server's own, for its code


@pytest.mark.slow  # live tritonserver: with -m slow
def test_triton_stubs_argv(repository: Path) -> None:
    """Side by side with Triton 2.51 (skipped where it cannot be had)."""
    import tritonclient.http as httpclient

    from support.triton import running_triton

    with running_triton(repository, ["unittest_main"]) as (http, _, _):
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http}", network_timeout=60.0)
        assert _ask(client, httpclient, "unittest_main") == EXPECTED
