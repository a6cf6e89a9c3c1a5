"""Sequence depth probe (python backend): reports, as JSON, the whole batch the sequence batcher formed.

OUT (TYPE_STRING) = {"instance", "position", "batch": [[READY, CORRID, INPUT, START, END] of every request
in this execution, in order], "state": ACC_IN if the model has implicit state}. ACC_OUT = ACC_IN + INPUT
when READY. Each execution sleeps ``delay_ms`` so that requests sent meanwhile queue and share the next one.
"""
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(value):
    value = np.asarray(value).reshape(-1)[0]
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode()
    return value.item() if hasattr(value, "item") else value


class TritonPythonModel:
    def initialize(self, args):
        self.instance = int(args["model_instance_name"].rsplit("_", 1)[1])
        config = json.loads(args["model_config"])
        self.delay = float(config["parameters"]["delay_ms"]["string_value"]) / 1000.0
        self.stateful = bool(config.get("sequence_batching", {}).get("state"))

    def execute(self, requests):
        time.sleep(self.delay)

        def get(request, name):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

        batch = []
        for request in requests:
            batch.append([_scalar(get(request, name)) for name in ("READY", "CORRID", "INPUT", "START", "END")])
        responses = []
        for position, request in enumerate(requests):
            report = {"instance": self.instance, "position": position, "batch": batch}
            outputs = []
            if self.stateful:
                acc = get(request, "ACC_IN")
                report["state"] = _scalar(acc)
                total = acc + get(request, "INPUT") if batch[position][0] else acc
                outputs.append(pb_utils.Tensor("ACC_OUT", total.astype(np.int32)))
            text = json.dumps(report)
            outputs.append(pb_utils.Tensor("OUT", np.array([[text.encode()]], dtype=np.object_)))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
