"""Decoupled, async execute: COUNT responses OUT = 10, 20, ... 10 ms apart, then the final flag."""
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            for index in range(count):
                await asyncio.sleep(0.01)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([10 * (index + 1)], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
