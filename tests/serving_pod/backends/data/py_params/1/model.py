"""Reports what the request says about itself: id, correlation id, flags, parameters..."""
import numpy as np
import triton_python_backend_utils as pb_utils


def _text(value):
    return np.array([str(value).encode()], dtype=object)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = [
                pb_utils.Tensor("REQUEST_ID", _text(request.request_id())),
                pb_utils.Tensor("CORRELATION_ID", _text(repr(request.correlation_id()))),
                pb_utils.Tensor("FLAGS", np.array([request.flags()], np.int32)),
                pb_utils.Tensor("PARAMETERS", _text(request.parameters())),
                pb_utils.Tensor("REQUESTED", _text(",".join(sorted(request.requested_output_names())))),
                pb_utils.Tensor("CANCELLED", np.array([request.is_cancelled()])),
                pb_utils.Tensor("NOT_IN_CONFIG", _text("extra")),
            ]
            responses.append(pb_utils.InferenceResponse(outputs, parameters={"answered": True}))
        return responses
