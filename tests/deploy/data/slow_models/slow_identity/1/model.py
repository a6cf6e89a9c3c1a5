"""Identity model that sleeps `delay_ms` (config parameter) per request: a queueing generator.

Written against Triton's python backend API so the same repository runs on tritonserver.
"""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.delay_s = float(config["parameters"]["delay_ms"]["string_value"]) / 1000.0

    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(self.delay_s)
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", data)]))
        return responses

    def finalize(self):
        pass
