"""BLS probe: a request runs the scenario named by ``CASE`` with ``exec()`` (``DECOUPLED`` false) or
``exec(decoupled=True)`` and answers ``SEEN``, the JSON of what the model saw: error messages, output values,
counts. The models it calls are those of the same test repository (``sum_diff_fp32``, ``repeat_int32``,
``mirror_fp32``, ``slow_mirror_fp32``, ``refuses_fp32``, ``iter_probe``, ``countdown``)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _tensor(name, values, dtype=np.float32):
    return pb_utils.Tensor(name, np.asarray(values, dtype))


def _call(model, inputs, outputs, decoupled, **options):
    """The responses of one BLS call: ``exec()``'s one, or all that ``exec(decoupled=True)`` gives."""
    request = pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=outputs, **options)
    return list(request.exec(decoupled=True)) if decoupled else [request.exec()]


def _seen(response, name):
    """A response's error message and output count, else the values of its output ``name`` (None: no outputs)."""
    if response.has_error():
        return {"error": response.error().message(), "outputs": len(response.output_tensors())}
    tensor = pb_utils.get_output_tensor_by_name(response, name)
    return None if tensor is None else tensor.as_numpy().tolist()


def _sum_diff_right(decoupled, rng):
    a, b = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    responses = _call("sum_diff_fp32", [_tensor("A", a), _tensor("B", b)], ["SUM", "DIFF"], decoupled)
    return len(responses) == 1 and _seen(responses[0], "SUM") == (a + b).tolist() and \
        _seen(responses[0], "DIFF") == (a - b).tolist()


def _repeat_right(n):
    responses = _call("repeat_int32", [_tensor("IN", [n], np.int32)], ["OUT"], True)
    return [_seen(r, "OUT") for r in responses] == [[n]] * n + [None]


def missing_input(decoupled, rng):
    if decoupled:
        responses = _call("repeat_int32", [], ["OUT"], True)
    else:
        responses = _call("sum_diff_fp32", [_tensor("A", np.zeros(16))], ["SUM", "DIFF"], False)
    return [_seen(r, "OUT") for r in responses]


def constructor_errors(decoupled, rng):
    """Which of model_name, inputs and requested_output_names ``InferenceRequest`` cannot go without."""
    given = {"model_name": "sum_diff_fp32", "inputs": [], "requested_output_names": ["SUM"]}
    seen = {}
    for left_out in given:
        try:
            pb_utils.InferenceRequest(**{k: v for k, v in given.items() if k != left_out})
            seen[left_out] = "constructed"
        except Exception as exc:  # noqa: BLE001 (its type is what is compared)
            seen[left_out] = type(exc).__name__
    return seen


def unknown_model(decoupled, rng):
    """A call to a model that is not there, then a good one."""
    responses = _call("no_such_model", [], [], decoupled)
    good = _repeat_right(3) if decoupled else _sum_diff_right(False, rng)
    return [[_seen(r, "Y") for r in responses], good]


def error_in_model(decoupled, rng):
    """A call that leaves out the one input, then a good call that the model answers with an error response."""
    return [[_seen(r, "Y") for r in _call("refuses_fp32", [], [], decoupled)],
            [_seen(r, "Y") for r in _call("refuses_fp32", [_tensor("X", [[1.5]])], ["Y"], decoupled)]]


def many_calls(decoupled, rng):
    """Thirty calls one after another: how many answered right."""
    if decoupled:
        return sum(_repeat_right(int(n)) for n in rng.integers(0, 6, 30))
    return sum(_sum_diff_right(False, rng) for _ in range(30))


def zero_length(decoupled, rng):
    responses = _call("mirror_fp32", [_tensor("X", np.zeros((1, 0)))], ["Y"], decoupled)
    tensors = [pb_utils.get_output_tensor_by_name(r, "Y").as_numpy() for r in responses]
    return [[list(t.shape), str(t.dtype)] for t in tensors]


def response_iterator(decoupled, rng):
    """One ``exec(decoupled=True)`` of ``repeat_int32`` (4 responses and an empty final one), read in turns."""
    request = pb_utils.InferenceRequest(model_name="repeat_int32", inputs=[_tensor("IN", [4], np.int32)],
                                        requested_output_names=["OUT"])
    responses = request.exec(decoupled=True)
    seen = {"next": _seen(next(responses), "OUT"), "loop": [_seen(r, "OUT") for r in responses],
            "after_loop": _spent(responses), "loops_again": [[_seen(r, "OUT") for r in responses] for _ in range(3)]}
    broken_off = []
    for response in responses:
        broken_off.append(_seen(response, "OUT"))
        if len(broken_off) == 2:
            break
    seen.update(broken_off=broken_off, next_after_break=_seen(next(responses), "OUT"),
                rest=[_seen(r, "OUT") for r in responses], after_rest=_spent(responses))
    fresh = request.exec(decoupled=True)  # the same request again, dropped after its first response
    seen["fresh"] = _seen(next(fresh), "OUT")
    del fresh
    return seen


def _spent(responses):
    try:
        next(responses)
    except StopIteration:
        return "StopIteration"
    return "more"


def timeout(decoupled, rng):
    """``slow_mirror_fp32`` with a request timeout of 5 us (past before it runs), then of 11 s."""
    return [_seen(_call("slow_mirror_fp32", [_tensor("X", [[1.0, 2.0]])], ["Y"], decoupled, timeout=t)[0], "Y")
            for t in (5, 11_000_000_000)]


def rescheduling(decoupled, rng):
    """``iter_probe`` asked to reschedule yet answer (-1), and to run 3 times; ``countdown`` from 3."""
    refused = _call("iter_probe", [_tensor("IN", [-1], np.int32)], ["OUT"], decoupled)
    thrice = _call("iter_probe", [_tensor("IN", [3], np.int32)], ["OUT"], decoupled)
    countdown = _call("countdown", [_tensor("IN", [3], np.int32)], ["OUT"], True)
    return {"refused": [_seen(r, "OUT") for r in refused],
            "thrice": [None if r.has_error() else _seen(r, "OUT")[1:] for r in thrice],  # flags first, last; runs
            "countdown": [_seen(r, "OUT") for r in countdown]}


CASES = {f.__name__: f for f in (missing_input, constructor_errors, unknown_model, error_in_model, many_calls,
                                 zero_length, response_iterator, timeout, rescheduling)}


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            case = pb_utils.get_input_tensor_by_name(request, "CASE").as_numpy()[0].decode()
            decoupled = bool(pb_utils.get_input_tensor_by_name(request, "DECOUPLED").as_numpy()[0])
            seen = CASES[case](decoupled, np.random.default_rng(7))
            text = np.array([json.dumps(seen)], np.object_)
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", text)]))
        return answers
