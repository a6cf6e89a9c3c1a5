"""OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1. The very first request the model is given is released
with RESCHEDULE (its entry in the returned list is None) and answered when it runs again; every later request is
answered at once."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.rescheduled_one = False

    def execute(self, requests):
        answers = []
        for request in requests:
            if not self.rescheduled_one:
                self.rescheduled_one = True
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                answers.append(None)
                continue
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b),
                                                       pb_utils.Tensor("OUTPUT1", a - b)]))
        return answers
