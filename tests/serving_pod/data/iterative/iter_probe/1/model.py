"""Iterative-sequence probe: a request with IN = n is released with RESCHEDULE until it ran n times, then answers
OUT = [correlation_id, flags of its first run, flags of its last run, runs]. IN = -1 reschedules the request and
returns a response for it anyway (the python backend refuses that)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = {}
        self.first = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            want = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            cid = request.correlation_id()
            runs = self.runs.get(cid, 0) + 1
            if runs == 1:
                self.first[cid] = request.flags()
            out = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([cid, self.first[cid], request.flags(), runs], np.int64))])
            if want < 0:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(out)
            elif runs < want:
                self.runs[cid] = runs
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
            else:
                self.runs.pop(cid, None)
                self.first.pop(cid, None)
                responses.append(out)
        return responses
