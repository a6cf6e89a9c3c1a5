"""async def execute: requests are handled concurrently with asyncio.gather."""
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def initialize(self, args):
        await asyncio.sleep(0)
        self.offset = np.float32(1.0)

    async def _one(self, request):
        await asyncio.sleep(0.001)
        data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data + self.offset)])

    async def execute(self, requests):
        return list(await asyncio.gather(*(self._one(r) for r in requests)))
