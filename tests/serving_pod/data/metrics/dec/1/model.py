"""Decoupled: COUNT responses then the final flag; COUNT -1 raises in execute, -2 sends one response and then
an error response flagged final."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            if count == -1:
                raise pb_utils.TritonModelException("negative count")
            sender = request.get_response_sender()
            if count == -2:  # one response then an error response, final
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("INDEX", np.array([0], np.int32))]))
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("bad")),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for index in range(count):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("INDEX", np.array([index], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
