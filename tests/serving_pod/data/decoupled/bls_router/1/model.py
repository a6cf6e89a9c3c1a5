"""BLS router (async execute). Request parameter "mode":

- "sync" / "async": Y = OUTPUT0 of ONNX ``add_sub`` on (X, X), via ``exec()`` / ``await async_exec()``;
- "stream": Y = [the OUT values] of decoupled ``dec_counter`` with COUNT = X[0], via ``exec(decoupled=True)``;
- "sequence": Y = the outputs of three requests of one sequence (START, -, END) to ONNX ``onnx_acc``,
  sent with correlation_id and flags;
- "missing": a BLS call to a model that does not exist; its error becomes this request's error;
- "params": a call to ``params_echo`` with custom parameters named like Triton's reserved ones, a correlation
  id and a timeout; Y is empty and the response parameter "echo" is what ``params_echo`` saw, as JSON.
"""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            mode = json.loads(request.parameters()).get("mode", "sync")
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if mode == "params":
                responses.append(self._params(x))
                continue
            try:
                y = await self._route(mode, x, request.request_id())
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y.astype(np.float32))]))
            except pb_utils.TritonModelException as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
        return responses

    def _params(self, x):
        bls = pb_utils.InferenceRequest(
            model_name="params_echo", inputs=[pb_utils.Tensor("X", x)], requested_output_names=["OUT"],
            correlation_id=77, timeout=5_000_000,
            parameters={"timeout": "soon", "sequence_id": "not-a-sequence", "priority": "high", "note": 1},
        )
        result = bls.exec()
        if result.has_error():
            return pb_utils.InferenceResponse(error=result.error())
        seen = [v.decode() for v in pb_utils.get_output_tensor_by_name(result, "OUT").as_numpy()]
        return pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros(0, np.float32))],
                                          parameters={"echo": json.dumps(seen)})

    async def _route(self, mode, x, request_id):
        if mode in ("sync", "async", "missing"):
            bls = pb_utils.InferenceRequest(
                model_name="no_such_model" if mode == "missing" else "add_sub",
                inputs=[pb_utils.Tensor("INPUT0", x[None]), pb_utils.Tensor("INPUT1", x[None])],
                requested_output_names=["OUTPUT0"],
            )
            result = await bls.async_exec() if mode == "async" else bls.exec()
            if result.has_error():
                raise pb_utils.TritonModelException("BLS failed: " + result.error().message())
            return pb_utils.get_output_tensor_by_name(result, "OUTPUT0").as_numpy()[0]
        if mode == "stream":
            bls = pb_utils.InferenceRequest(
                model_name="dec_counter",
                inputs=[pb_utils.Tensor("COUNT", np.array([int(x[0])], np.int32))],
                requested_output_names=["OUT"],
            )
            values = []
            for part in bls.exec(decoupled=True):
                if part.has_error():
                    raise pb_utils.TritonModelException(part.error().message())
                if part.output_tensors():
                    values.append(pb_utils.get_output_tensor_by_name(part, "OUT").as_numpy()[0])
            return np.array(values)
        if mode == "sequence":
            outputs = []
            for index, flags in enumerate((pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, 0,
                                           pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)):
                bls = pb_utils.InferenceRequest(
                    model_name="onnx_acc",
                    inputs=[pb_utils.Tensor("INPUT", np.array([[int(x[index])]], np.int32))],
                    requested_output_names=["OUTPUT"], correlation_id=4242, flags=flags,
                )
                result = bls.exec()
                if result.has_error():
                    raise pb_utils.TritonModelException(result.error().message())
                outputs.append(pb_utils.get_output_tensor_by_name(result, "OUTPUT").as_numpy()[0][0])
            return np.array(outputs)
        raise pb_utils.TritonModelException(f"unknown mode {mode}")
