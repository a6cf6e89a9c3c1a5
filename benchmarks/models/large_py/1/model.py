"""Benchmark model for large tensors: OUTPUT0 = INPUT0 + 1 on 1 MiB rows. Runs unmodified under NVIDIA Triton's
python backend and under Ferry's."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x + np.float32(1)).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
