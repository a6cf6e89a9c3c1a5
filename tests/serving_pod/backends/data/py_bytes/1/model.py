"""BYTES in and out: UPPER is the upper-cased text (as str objects), LENGTHS the byte lengths."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([t.decode("utf-8").upper() for t in text.flat], dtype=object)
            lengths = np.array([len(t) for t in text.flat], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("UPPER", upper), pb_utils.Tensor("LENGTHS", lengths)]))
        return responses
