"""Records initialize's args and finalize in files under the model directory."""
import json
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.dir = args["model_repository"]
        config = json.loads(args["model_config"])
        self.out_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"])
        with open(os.path.join(self.dir, "initialized.json"), "w") as f:
            json.dump({"args": args, "model_dir": pb_utils.get_model_dir()}, f)

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().astype(self.out_dtype))])
            for r in requests
        ]

    def finalize(self):
        with open(os.path.join(self.dir, "finalized.txt"), "a") as f:
            f.write(self.args["model_instance_name"] + "\n")
