"""Decoupled counter. Request parameter "mode":

- "count" (default): COUNT responses OUT = 0..COUNT-1, then a flag-only final response;
- "final_with_data": the last of the COUNT responses carries the final flag itself;
- "raise": execute raises (the error reaches the client in the stream);
- "error_between": OUT = 0, an error response (not final), OUT = 1, then the final flag;
- "until_cancelled": one response, then wait (on a thread) until the request is cancelled, write
  "cancelled" to the file named by parameter "marker" and close the stream.
"""
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            params = json.loads(request.parameters())
            mode = params.get("mode", "count")
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            if mode == "raise":
                raise pb_utils.TritonModelException(f"asked to fail after {count}")
            if mode == "error_between":
                sender.send(self._out(0))
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("an error between two responses")))
                sender.send(self._out(1))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            if mode == "until_cancelled":
                sender.send(self._out(0))
                thread = threading.Thread(target=self._wait_cancel, args=(request, params["marker"]))
                thread.start()
                self.threads.append(thread)
                continue
            for index in range(count):
                last = mode == "final_with_data" and index == count - 1
                sender.send(self._out(index), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
            if mode != "final_with_data":
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    @staticmethod
    def _out(value):
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])

    def _wait_cancel(self, request, marker):
        deadline = time.monotonic() + 20
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(marker, "w") as handle:
            handle.write("cancelled" if request.is_cancelled() else "timeout")
        try:
            request.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except pb_utils.TritonModelException:
            pass  # the stream is gone

    def finalize(self):
        for thread in self.threads:
            thread.join()
