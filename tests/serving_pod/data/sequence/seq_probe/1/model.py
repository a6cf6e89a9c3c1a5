"""Sequence probe (python backend, implicit state).

SUM = ACC_IN + INPUT (the accumulator kept by the server as implicit state ACC_IN -> ACC_OUT; the
initial state comes from initial_state/init.bin). PROBE = [instance index, position in the batch,
batch length, START, END, READY, CORRID]: where the sequence batcher placed the request and the
control values it set. Each execution sleeps ``delay_ms`` so concurrent sequences share batches.
"""
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.instance = int(args["model_instance_name"].rsplit("_", 1)[1])
        config = json.loads(args["model_config"])
        self.delay = float(config["parameters"]["delay_ms"]["string_value"]) / 1000.0

    def execute(self, requests):
        time.sleep(self.delay)
        responses = []
        for position, request in enumerate(requests):
            def get(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy()

            ready = bool(get("READY")[0][0])
            total = (get("ACC_IN") + get("INPUT")) if ready else get("ACC_IN")
            probe = np.array([[
                self.instance, position, len(requests), int(get("START")[0][0]), int(get("END")[0][0]),
                int(ready), int(get("CORRID")[0][0]),
            ]], np.int64)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", total.astype(np.int32)),
                pb_utils.Tensor("PROBE", probe),
                pb_utils.Tensor("ACC_OUT", total.astype(np.int32)),
            ]))
        return responses
