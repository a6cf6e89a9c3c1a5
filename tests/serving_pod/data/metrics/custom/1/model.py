"""Custom metrics (``pb_utils.MetricFamily``): each request names one use of the API in OP and gets back
the values it read, "ok", or the exception's type and message (so misuse never fails the request itself)."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        kind = pb_utils.MetricFamily
        self.kind = kind
        self.keep = []
        self.counter = kind(name="custom_counter", description='A counter \\ with "quotes"', kind=kind.COUNTER)
        self.gauge = kind(name="custom_gauge", description="A gauge", kind=kind.GAUGE)
        self.histogram = kind(name="custom_histogram", description="A histogram", kind=kind.HISTOGRAM)
        self.labelled = self.counter.Metric(labels={"b": "2", "a": 'x"y\\z\nw'})
        self.plain = self.counter.Metric(labels={})
        self.level = self.gauge.Metric(labels={"model": "custom"})
        self.values = self.histogram.Metric(labels={"k": "v"}, buckets=[1.0, 2.5, 5.0])

    def run(self, op):
        kind = self.kind
        if op == "update":
            self.labelled.increment(2)
            self.plain.increment(0.5)
            self.level.set(-3.25)
            self.level.increment(1)
            for value in (0.5, 1.0, 2.6, 9):
                self.values.observe(value)
            return f"{self.labelled.value()} {self.level.value()}"
        if op == "set_counter":
            self.labelled.set(1)
        if op == "histogram_value":
            return str(self.values.value())
        if op == "histogram_increment":
            self.values.increment(1)
        if op == "histogram_without_buckets":
            self.histogram.Metric(labels={"x": "1"})
        if op == "unsorted_buckets":
            self.histogram.Metric(labels={"x": "2"}, buckets=[2.0, 1.0])
        if op == "equal_buckets":
            self.histogram.Metric(labels={"x": "4"}, buckets=[1.0, 1.0])
        if op == "nan_bucket":
            self.histogram.Metric(labels={"x": "5"}, buckets=[float("nan")])
        if op == "inf_bucket":
            self.histogram.Metric(labels={"x": "6"}, buckets=[1.0, float("inf")])
        if op == "le_label":
            self.histogram.Metric(labels={"le": "x"}, buckets=[1.0])
        if op == "buckets_on_counter":
            self.counter.Metric(labels={"x": "3"}, buckets=[1.0])
        if op == "label_value_not_string":
            self.gauge.Metric(labels={"x": 1})
        if op == "invalid_name":
            kind(name="0bad", description="x", kind=kind.GAUGE)
        if op == "kind_clash":
            kind(name="custom_counter", description="again", kind=kind.GAUGE)
        if op == "same_family_again":  # same name and kind: the same series
            family = kind(name="custom_gauge", description="other help", kind=kind.GAUGE)
            metric = family.Metric(labels={"model": "custom"})
            self.keep += [family, metric]
            metric.set(42)
            return str(self.level.value())
        if op == "second_series":
            metric = self.gauge.Metric(labels={"x": "y"})
            self.keep.append(metric)
            metric.set(float("inf"))
        if op == "server_family":
            family = kind(name="nv_inference_count", description="clash", kind=kind.COUNTER)
            metric = family.Metric(labels={"model": "custom", "version": "1"})
            self.keep += [family, metric]
            metric.increment(100)
        return "ok"

    def execute(self, requests):
        responses = []
        for request in requests:
            op = pb_utils.get_input_tensor_by_name(request, "OP").as_numpy()[0].decode()
            try:
                message = self.run(op)
            except Exception as error:  # noqa: BLE001  # the message is the answer
                message = f"{type(error).__name__}: {error}"
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("MSG", np.array([message.encode()], np.object_))]))
        return responses
