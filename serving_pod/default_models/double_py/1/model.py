"""Python backend benchmark model: OUTPUT0 = 2 * INPUT0 (FP32 [16]), one response per request.

Same I/O and config as the bench model used against NVIDIA Triton, so perf_analyzer runs compare.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            doubled = pb_utils.Tensor("OUTPUT0", (data * 2.0).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[doubled]))
        return responses
