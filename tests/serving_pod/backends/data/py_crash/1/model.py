"""Echoes INPUT0 with the child's pid; INPUT0 == 1 kills the process mid-execute."""
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if data[0] == 1:
                print("about to crash on purpose", file=sys.stderr, flush=True)
                os._exit(3)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", data), pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))]))
        return responses
