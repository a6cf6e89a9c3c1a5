"""OUT = [request.parameters(), repr(request.correlation_id()), str(request.timeout())]."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array(
                [r.parameters().encode(), repr(r.correlation_id()).encode(), str(r.timeout()).encode()],
                dtype=object))])
            for r in requests
        ]
