"""Counts the requests of each sequence: ``OUTPUT0`` is how many requests the request's sequence (correlation ID)
has had, this one included. A correlation ID serves one sequence in the model's life: a START for an ID it has
seen, or a request of an ID it never saw START, raises ``TritonModelException``. Decoupled (by its
``model_transaction_policy``), it sends its answer three times and then the final flag alone."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.counts = {}

    def _count(self, request):
        sequence = request.correlation_id()
        if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
            if sequence in self.counts:
                raise pb_utils.TritonModelException(f"sequence {sequence} was used before: start another one")
            self.counts[sequence] = 0
        elif sequence not in self.counts:
            raise pb_utils.TritonModelException(f"sequence {sequence} never started")
        self.counts[sequence] += 1
        return pb_utils.Tensor("OUTPUT0", np.array([self.counts[sequence]], np.int32))

    def execute(self, requests):
        if not self.decoupled:
            return [pb_utils.InferenceResponse([self._count(request)]) for request in requests]
        for request in requests:
            count = self._count(request)
            sender = request.get_response_sender()
            for _ in range(3):
                sender.send(pb_utils.InferenceResponse([count]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
