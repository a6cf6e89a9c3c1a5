"""Benchmark model for the python backend: OUTPUT0 = 2 * INPUT0, one response per request.

Runs unmodified under NVIDIA Triton's python backend and under Ferry's in-process python backend.
"""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x * 2.0).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
