"""Row 0 of X = [sleep ms, action]: action 1 raises in execute, 2 answers with an error response, else X back."""
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            time.sleep(abs(int(x[0][0])) / 1000.0)
            if x[0][1] == 1:
                raise pb_utils.TritonModelException("raised")
            if x[0][1] == 2:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("error response")))
                continue
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return out
