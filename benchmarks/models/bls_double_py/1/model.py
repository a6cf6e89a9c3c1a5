"""Benchmark model for BLS: each request is answered by a request to ``double_py`` made from ``execute``.

Runs unmodified under NVIDIA Triton's python backend (every call crosses the stub's shared memory twice) and
under Ferry's in-process python backend.
"""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="double_py",
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0")],
            )
            answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(answer.error().message())))
                continue
            out = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", out.as_numpy())]))
        return responses
