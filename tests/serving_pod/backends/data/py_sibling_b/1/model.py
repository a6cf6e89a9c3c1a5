"""Imports helper.py from its own version folder (like Triton's sys.path setup)."""
import helper
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("WHO", np.array([helper.WHO.encode()], dtype=object))])
                for _ in requests]
