"""Span logger: sleeps ``delay_ms`` per execution and appends "<model> <start> <end>" (time.monotonic) to the
file named by the config parameter ``span_log``, so a test can see which executions overlapped (also in
Triton, where each instance runs in its own stub process: CLOCK_MONOTONIC is shared by all processes)."""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.log = parameters["span_log"]["string_value"]
        self.delay = float(parameters["delay_ms"]["string_value"]) / 1000
        self.name = args["model_name"]

    def execute(self, requests):
        start = time.monotonic()
        time.sleep(self.delay)
        end = time.monotonic()
        with open(self.log, "a") as log:
            log.write(f"{self.name} {start!r} {end!r}\n")
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy())])
            for r in requests
        ]
