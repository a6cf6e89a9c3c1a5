"""``SUM`` = A + B and ``DIFF`` = A - B, element by element."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", a + b), pb_utils.Tensor("DIFF", a - b)]))
        return answers
