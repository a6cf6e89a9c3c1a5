"""Decoupled: a request with ``IN`` = n gets n responses, each ``OUT`` = n, then an empty response with the final
flag (n <= 0: that one only)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            for _ in range(int(value[0])):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
