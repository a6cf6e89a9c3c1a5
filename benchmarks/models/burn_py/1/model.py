"""Benchmark model for the python backend: CPU-bound interpreter work, one response per request.

OUTPUT0[i] is the logistic map r -> 3.7 r (1 - r), iterated ``rounds`` times (config parameter) from
r = 0.5 + 0.4 * frac(|INPUT0[i]|) (0.5 for a value that is not finite). Plain Python floats on purpose: the
work holds the GIL the whole time, as tokenizers and parsers written in Python do, so only more processes
can run more of it at once. Runs unmodified under NVIDIA Triton's python backend and under Ferry.
"""
import json
import math

import numpy as np
import triton_python_backend_utils as pb_utils


def iterate(value, rounds):
    r = 0.5 + 0.4 * (abs(value) % 1.0) if math.isfinite(value) else 0.5
    for _ in range(rounds):
        r = 3.7 * r * (1.0 - r)
    return r


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.rounds = int(parameters.get("rounds", {}).get("string_value", "1500"))

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = np.array([iterate(v, self.rounds) for v in x.reshape(-1).tolist()], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", y.reshape(x.shape))]))
        return responses
