"""Custom metrics as Triton's README shows them: a counter, a gauge and a histogram family.

Each request counts its input elements, sets the gauge to their sum and observes every value;
it answers with the counter's value. The request parameter "misuse" makes execute misuse the
API instead (the pb_utils error fails the request).
"""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.seen_family = pb_utils.MetricFamily(
            name="custom_inputs_seen", description="Input elements seen", kind=pb_utils.MetricFamily.COUNTER
        )
        self.sum_family = pb_utils.MetricFamily(
            name="custom_last_sum", description="Sum of the last request's input", kind=pb_utils.MetricFamily.GAUGE
        )
        self.value_family = pb_utils.MetricFamily(
            name="custom_input_values", description="Input values", kind=pb_utils.MetricFamily.HISTOGRAM
        )
        self.seen = self.seen_family.Metric(labels=labels)
        self.last_sum = self.sum_family.Metric(labels=labels)
        self.values = self.value_family.Metric(labels=labels, buckets=[1.0, 2.5, 5.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            misuse = json.loads(request.parameters()).get("misuse")
            if misuse == "negative":
                self.seen.increment(-1)
            elif misuse == "observe_gauge":
                self.last_sum.observe(1.0)
            elif misuse == "labels":
                self.sum_family.Metric(labels={"0bad": "x"})
            elif misuse == "kind":
                pb_utils.MetricFamily(name="custom_inputs_seen", description="again", kind=pb_utils.MetricFamily.GAUGE)
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            self.seen.increment(x.size)
            self.last_sum.set(float(x.sum()))
            for value in x.tolist():
                self.values.observe(value)
            seen = np.array([self.seen.value()], dtype=np.float64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", seen)]))
        return responses
