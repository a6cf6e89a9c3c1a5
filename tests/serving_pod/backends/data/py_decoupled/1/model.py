"""Decoupled: COUNT responses (INDEX 0..COUNT-1) then the final flag; COUNT < 0 raises in execute,
COUNT == 99 answers from a background thread after execute returned."""
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.late_send_errors = []
        self.threads = []

    def _stream(self, request, count):
        sender = request.get_response_sender()
        for index in range(count):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("INDEX", np.array([index], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        try:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("INDEX", np.array([-1], np.int32))]))
        except pb_utils.TritonModelException as exc:
            self.late_send_errors.append(str(exc))

    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            if count < 0:
                raise RuntimeError("negative count")
            if count == 99:
                thread = threading.Thread(target=self._stream, args=(request, 2))
                thread.start()
                self.threads.append(thread)
            else:
                self._stream(request, count)
        return None

    def finalize(self):
        for thread in self.threads:
            thread.join()
