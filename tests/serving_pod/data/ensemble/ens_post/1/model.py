"""Ensemble postprocessing: PRODUCT = SUM * DIFF; LABEL = b"pos" or b"neg" (sign of each row's total)."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            product = (pb_utils.get_input_tensor_by_name(request, "SUM").as_numpy()
                       * pb_utils.get_input_tensor_by_name(request, "DIFF").as_numpy())
            label = np.array([[b"pos" if row.sum() >= 0 else b"neg"] for row in product], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("PRODUCT", product), pb_utils.Tensor("LABEL", label),
            ]))
        return responses
