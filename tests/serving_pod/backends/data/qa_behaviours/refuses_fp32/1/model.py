"""Answers every request with an error response (and no outputs)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("refuses_fp32 refuses every request"))
                for _ in requests]
