"""execute raises, or returns something that is not a list of responses, depending on the input."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        mode = int(pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()[0])
        if mode == 0:
            raise ValueError("the model refuses this input")
        if mode == 1:
            return {"not": "a list"}
        if mode == 2:
            return []
        if mode == 3:
            return ["not a response"] * len(requests)
        raise pb_utils.TritonModelException("explicit model exception")
