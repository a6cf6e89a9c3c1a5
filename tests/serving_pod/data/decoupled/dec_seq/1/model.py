"""Decoupled sequence model: total[CORRID] = (0 on START) + INPUT; sends TOTAL and TOTAL * 10, then final."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}

    def execute(self, requests):
        for request in requests:
            key = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().reshape(-1)[0]
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0])
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()[0])
            total = self.totals[key] = (0 if start else self.totals.get(key, 0)) + value
            sender = request.get_response_sender()
            for out in (total, total * 10):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("TOTAL", np.array([out], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
