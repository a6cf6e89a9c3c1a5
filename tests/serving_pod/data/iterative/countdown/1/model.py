"""Decoupled countdown on an iterative sequence: a request with IN = n gets the responses n - 1, n - 2, ..., 0,
one a run. After each run but the last the request is released with RESCHEDULE and comes back on its sequence;
the last run's response carries the final flag. What is left to count is kept per correlation ID."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for request in requests:
            sequence = request.correlation_id()
            start = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            left = self.left.pop(sequence, start) - 1
            answer = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([left], np.int32))])
            sender = request.get_response_sender()
            if left > 0:
                self.left[sequence] = left
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(answer)
            else:
                sender.send(answer, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
