"""Ensemble preprocessing: SCALED = RAW * 2."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SCALED", raw * 2)]))
        return responses
