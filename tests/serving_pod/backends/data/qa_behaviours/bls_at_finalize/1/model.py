"""Makes a BLS call (to ``repeat_int32``) from ``finalize``, where the python backend allows none."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("not for inference")) for _ in requests]

    def finalize(self):
        request = pb_utils.InferenceRequest(model_name="repeat_int32", requested_output_names=["OUT"],
                                            inputs=[pb_utils.Tensor("IN", np.array([2], np.int32))])
        list(request.exec(decoupled=True))
