"""Benchmark model for decoupled streaming: four responses per request through the response sender, then the
final flag alone. Runs unmodified under NVIDIA Triton's python backend and under Ferry's."""
import numpy as np
import triton_python_backend_utils as pb_utils

RESPONSES = 4


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            for k in range(1, RESPONSES + 1):
                out = pb_utils.Tensor("OUTPUT0", (x * k).astype(np.float32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
