"""``pb_utils.ModelConfig``: the object a model's ``auto_complete_config`` edits.

Triton hands ``auto_complete_config(auto_complete_model_config)`` a wrapper over the model
configuration as a JSON dict; the model may add inputs and outputs, set ``max_batch_size``,
turn on the dynamic batcher and set the transaction policy, and anything that conflicts with
what ``config.pbtxt`` already says raises ``ValueError`` with a message naming the model and
tensor. The python backend (``python.py``) writes the edited dict back into the config proto.
"""

from __future__ import annotations

import json
from typing import Any


class ModelConfig:
    """Mutable view of a model configuration during auto-complete."""

    def __init__(self, model_config: str | dict) -> None:
        self._model_config: dict[str, Any] = (
            json.loads(model_config) if isinstance(model_config, str) else model_config
        )
        self._model_config.setdefault("input", [])
        self._model_config.setdefault("output", [])
        self._model_config.setdefault("max_batch_size", 0)

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        """The configuration as a dict (read it; change it through the setters)."""
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._model_config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._name}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002  (Triton's name)
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        if not isinstance(tensor, dict):
            raise ValueError(
                f"{kind} in auto-complete-config function for model '{self._name}' must be a dict"
            )
        label = f"{kind} '{tensor.get('name', '')}'"
        extra = [key for key in tensor if key not in allowed]
        if extra:  # Triton's words: "'name', 'data_type', 'dims' and 'optional'."
            listed = ", ".join(repr(a) for a in allowed[:-1]) + f" and {allowed[-1]!r}"
            raise ValueError(
                f"{label} in auto-complete-config function for model '{self._name}' contains "
                f"property other than {listed}."
            )
        for required in ("name", "data_type", "dims"):
            if required not in tensor:
                what = kind if required == "name" else label
                raise ValueError(
                    f"{what} in auto-complete-config function for model '{self._name}' is "
                    f"missing '{required}' property."
                )
        for current in self._model_config[kind]:
            if current.get("name") != tensor["name"]:
                continue
            current_type = current.get("data_type", "TYPE_INVALID")
            if current_type != "TYPE_INVALID" and current_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{self._name}', configuration expects datatype "
                    f"{current_type} for {label}, model provides {tensor['data_type']}"
                )
            current_dims = [int(d) for d in current.get("dims", [])]
            if current_dims and current_dims != [int(d) for d in tensor["dims"]]:
                raise ValueError(
                    f"model '{self._name}', tensor '{tensor['name']}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims {current_dims}"
                )
            if (
                "optional" in current
                and "optional" in tensor
                and bool(current["optional"]) != bool(tensor["optional"])
            ):
                raise ValueError(
                    f"model '{self._name}', tensor '{tensor['name']}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional "
                    f"{current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = list(tensor["dims"])
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        extra = [key for key in transaction_policy_dict if key != "decoupled"]
        if extra:
            raise ValueError(
                "model transaction property in auto-complete-config function for model "
                f"'{self._name}' contains property other than 'decoupled'."
            )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
