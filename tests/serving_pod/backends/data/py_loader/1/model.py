"""Loads, checks, calls and unloads other models as the request parameters say.

Parameters: "action" (load | unload | ready | infer), "model", and for load "config" (a JSON
config override) and "source" (a model.py override, sent as files={"file:1/model.py": ...}).
Answers Y (the BLS result for "infer", else X) and READY (is_model_ready after the action).
Errors of the API propagate: the request fails with the TritonModelException's message.
"""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        on_init = parameters.get("LOAD_ON_INIT", {}).get("string_value", "")
        if on_init and not pb_utils.is_model_ready(model_name=on_init, model_version="1"):
            pb_utils.load_model(model_name=on_init)

    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            action, model = params["action"], params["model"]
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            y = x
            if action == "load":
                files = {"file:1/model.py": params["source"].encode()} if "source" in params else None
                pb_utils.load_model(model, config=params.get("config", ""), files=files)
            elif action == "unload":
                pb_utils.unload_model(model_name=model, unload_dependents=False)
            elif action == "infer":
                result = pb_utils.InferenceRequest(
                    model_name=model, inputs=[pb_utils.Tensor("X", x)], requested_output_names=["Y"]
                ).exec()
                if result.has_error():
                    raise pb_utils.TritonModelException(result.error().message())
                y = pb_utils.get_output_tensor_by_name(result, "Y").as_numpy()
            ready = pb_utils.is_model_ready(model, params.get("version", ""))
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", y), pb_utils.Tensor("READY", np.array([ready], dtype=bool)),
            ]))
        return responses
