"""Polls request.is_cancelled() for up to 20 s, writes "cancelled" or "timeout" to the file named by
the request parameter "marker", then answers Y = X."""
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            marker = json.loads(request.parameters())["marker"]
            deadline = time.monotonic() + 20
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)
            with open(marker, "w") as handle:
                handle.write("cancelled" if request.is_cancelled() else "timeout")
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
