"""A chain of BLS calls to itself: a request of ``DEPTH`` d > 0 adds ``bool_<d>`` (True), ``int_<d>`` (d) and
``str_<d>`` ("d") to the parameters it came with and sends them one call down (``DEPTH`` d - 1), whose answer it
returns; ``DEPTH`` 0 answers ``PARAMS``, the JSON of the parameters it received."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def _answer(self, request):
        depth = int(pb_utils.get_input_tensor_by_name(request, "DEPTH").as_numpy()[0])
        received = json.loads(request.parameters())
        if depth == 0:
            return pb_utils.InferenceResponse([pb_utils.Tensor("PARAMS", np.array([json.dumps(received)], np.object_))])
        received.update({f"bool_{depth}": True, f"int_{depth}": depth, f"str_{depth}": str(depth)})
        below = pb_utils.InferenceRequest(
            model_name=self.name, inputs=[pb_utils.Tensor("DEPTH", np.array([depth - 1], np.uint8))],
            requested_output_names=["PARAMS"], parameters=received).exec()
        if below.has_error():
            return pb_utils.InferenceResponse(error=below.error())
        return pb_utils.InferenceResponse(below.output_tensors())

    def execute(self, requests):
        return [self._answer(request) for request in requests]
