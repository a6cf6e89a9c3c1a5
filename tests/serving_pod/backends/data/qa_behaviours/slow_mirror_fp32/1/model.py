"""``Y`` = ``X``, a quarter of a second a request."""

import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            time.sleep(0.25)
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(
                request, "X").as_numpy())]))
        return answers
