"""Dynamic batching probe (python backend), for tests/serving_pod/schedulers/test_dynamic_triton.py.

OUTPUT0 = INPUT0. PROBE (one row per batch row) = [execution number of this instance, requests in the
execution, position of the request in it]: what the dynamic batcher grouped. An execution any of whose
requests has INPUT0[0][0] == -1 ("hold") first writes ``started_<n>`` into the gate folder (config
parameter ``gate``), then waits until a file ``open`` appears there: requests sent meanwhile pile up in
the queue, so the batches do not depend on timing.
"""
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.gate = config["parameters"]["gate"]["string_value"]
        self.executions = 0

    def execute(self, requests):
        self.executions += 1
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        if any(x.size and x.flat[0] == -1 for x in inputs):
            open(os.path.join(self.gate, f"started_{self.executions}"), "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(self.gate, "open")) and time.monotonic() < deadline:
                time.sleep(0.005)
        responses = []
        for position, x in enumerate(inputs):
            probe = np.array([[self.executions, len(requests), position]] * x.shape[0], np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x.astype(np.int32)), pb_utils.Tensor("PROBE", probe)]))
        return responses
