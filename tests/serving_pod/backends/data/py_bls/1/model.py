"""BLS: forwards INPUT0 to another model; the request parameter "mode" picks how."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            mode = json.loads(request.parameters()).get("mode", "sync")
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            target = "missing_model" if mode == "missing" else ("counter" if mode == "stream" else "double")
            bls = pb_utils.InferenceRequest(
                model_name=target,
                inputs=[pb_utils.Tensor("INPUT0", data.as_numpy())],
                requested_output_names=["OUTPUT0"],
            )
            if mode == "async":
                result = await bls.async_exec()
            elif mode == "stream":
                total = np.zeros(4, np.float32)
                for part in bls.exec(decoupled=True):
                    if part.has_error():
                        raise pb_utils.TritonModelException(part.error().message())
                    if part.output_tensors():
                        total += pb_utils.get_output_tensor_by_name(part, "OUTPUT0").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total)]))
                continue
            else:
                result = bls.exec()
            if result.has_error():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("BLS failed: " + result.error().message(), result.error().code())))
                continue
            out = pb_utils.get_output_tensor_by_name(result, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]))
        return responses
