"""Decoupled scores: COUNT responses; response i has SCORES = roll([0.1, 0.2, 0.3, 0.4], i) and INDEX = i.

Request parameters:
- "final_with_data": true makes the last data response carry the final flag (else a flag-only final);
- "gate": a directory; before response i > 0 the model waits (up to 20 s) for the file "ack_<i-1>"
  there, so a client can read a shared-memory output before the next response overwrites it.
"""
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

BASE = np.array([0.1, 0.2, 0.3, 0.4], np.float32)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            params = json.loads(request.parameters())
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            final_with_data = bool(params.get("final_with_data"))
            gate = params.get("gate")
            sender = request.get_response_sender()
            for index in range(count):
                if gate and index:
                    self._wait(os.path.join(gate, f"ack_{index - 1}"))
                response = pb_utils.InferenceResponse([
                    pb_utils.Tensor("SCORES", np.roll(BASE, index)),
                    pb_utils.Tensor("INDEX", np.array([index], np.int32)),
                ])
                last = final_with_data and index == count - 1
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
            if not final_with_data or not count:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    @staticmethod
    def _wait(path):
        deadline = time.monotonic() + 20
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.005)
