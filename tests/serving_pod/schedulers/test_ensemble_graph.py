"""``ensemble_graph``: the static checks of an ensemble config and the checks against composing configs (pure)."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core.errors import ModelLoadError
from serving_pod.schedulers.ensemble_graph import chain, ensemble_steps, validate_mapping, validate_structure


def _ensemble(body: str, io: str = 'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ] '
              'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]') -> mc.ModelConfig:
    return text_format.Parse(f'name: "ens" platform: "ensemble" max_batch_size: 8 {io} {body}', mc.ModelConfig())


def _steps(*steps: tuple[str, dict[str, str], dict[str, str]]) -> str:
    parts = []
    for model, inputs, outputs in steps:
        imap = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
        omap = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
        parts.append(f'step {{ model_name: "{model}" model_version: -1 {imap} {omap} }}')
    return "ensemble_scheduling { " + " ".join(parts) + " }"


def _model(max_batch: int = 8, dims: str = "[ 4 ]", optional: bool = False, decoupled: bool = False) -> mc.ModelConfig:
    return text_format.Parse(
        f'name: "m" max_batch_size: {max_batch} '
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims} }}, '
        f'{{ name: "EXTRA" data_type: TYPE_FP32 dims: [ 1 ] optional: {str(optional).lower()} }} ] '
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {dims} }} ] '
        f"model_transaction_policy {{ decoupled: {str(decoupled).lower()} }}",
        mc.ModelConfig(),
    )


STRUCTURE_ERRORS = [
    ("", "must specify 'step' for ensemble 'ens'"),
    (_steps(("ens", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})), "step 0 (model 'ens') refers to the ensemble itself"),
    (_steps(("a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}), ("b", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})),
     "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'ens' step 1 (already written by step 0 (model 'a'))"),
    (_steps(("a", {"INPUT0": "IN"}, {"OUTPUT0": "IN"})), "step 0 (model 'a') writes ensemble tensor 'IN', which is an ensemble input"),
    (_steps(("a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT", "OUTPUT1": "dangling"})),
     "ensemble tensor 'dangling' is unused in ensemble 'ens' (written by step 0 (model 'a')"),
    (_steps(("a", {"INPUT0": "x"}, {"OUTPUT0": "y"}), ("b", {"INPUT0": "y"}, {"OUTPUT0": "z"}),
            ("c", {"INPUT0": "z", "INPUT1": "IN"}, {"OUTPUT0": "x", "OUTPUT1": "OUT"})),
     "has a cycle"),
    (_steps(("a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})) + ' instance_group [ { count: 1 } ]',
     "instance group should not be specified for ensemble 'ens'"),
]


@pytest.mark.parametrize("body,message", STRUCTURE_ERRORS)
def test_structure_errors(body: str, message: str) -> None:
    with pytest.raises(ModelLoadError) as error:
        validate_structure(_ensemble(body))
    assert message in str(error.value)


def test_unused_ensemble_input() -> None:
    config = _ensemble(
        _steps(("a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})),
        io='input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "SPARE" data_type: TYPE_FP32 dims: [ 4 ] } ] '
           'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]',
    )
    with pytest.raises(ModelLoadError, match="ensemble input 'SPARE' for ensemble 'ens' is not used"):
        validate_structure(config)


def test_mapping_checks() -> None:
    config = _ensemble(_steps(("m", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})))
    steps = validate_structure(config)
    validate_mapping(config, steps, {0: _model(optional=True)})  # an optional input may stay unmapped
    # a non-batching model whose dims include the batch dim matches a batching ensemble's full shape
    validate_mapping(config, steps, {0: _model(max_batch=0, dims="[ -1, 4 ]", optional=True)})
    with pytest.raises(ModelLoadError, match="input 'EXTRA' in model m is not mapped to any ensemble tensors"):
        validate_mapping(config, steps, {0: _model()})
    with pytest.raises(ModelLoadError, match="allows maximum batch size 8, but it contains model m which only allows maximum batch size to be 2"):
        validate_mapping(config, steps, {0: _model(max_batch=2, optional=True)})
    validate_mapping(config, steps, {0: _model(optional=True, decoupled=True)})  # served: the ensemble decouples
    assert config.model_transaction_policy.decoupled
    with pytest.raises(ModelLoadError, match=r"ensemble tensor 'IN': inconsistent shape: \[-1, 4\] is inferred from ensemble 'ens' while \[-1, 5\]"):
        validate_mapping(config, steps, {0: _model(dims="[ 5 ]", optional=True)})


def test_decoupled_steps_make_the_ensemble_decoupled() -> None:
    """As Triton's decouple labels: a decoupled step anywhere decouples the ensemble; a declared ``decoupled:
    true`` over plain steps does not (unless the response cache is on: then the cache check refuses it); a step
    reading tensors of different decoupled flows is refused with Triton's words."""
    two = _ensemble(_steps(("m", {"INPUT0": "IN"}, {"OUTPUT0": "mid"}), ("m", {"INPUT0": "mid"}, {"OUTPUT0": "OUT"})))
    plain, repeat = _model(optional=True), _model(optional=True, decoupled=True)
    for composing, expected in (((plain, repeat), True), ((repeat, plain), True), ((plain, plain), False)):
        config = mc.ModelConfig()
        config.CopyFrom(two)
        config.model_transaction_policy.decoupled = True
        validate_mapping(config, validate_structure(config), dict(enumerate(composing)))
        assert config.model_transaction_policy.decoupled is expected
    cached = mc.ModelConfig()
    cached.CopyFrom(two)
    cached.model_transaction_policy.decoupled = True
    cached.response_cache.enable = True
    validate_mapping(cached, validate_structure(cached), {0: plain, 1: plain})
    assert cached.model_transaction_policy.decoupled
    io = ('input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ] '
          'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]')
    mixed = text_format.Parse(
        f'name: "ens" platform: "ensemble" max_batch_size: 8 {io} ensemble_scheduling {{ '
        'step { model_name: "r" input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "r" } } '
        'step { model_name: "m" input_map { key: "INPUT0" value: "r" } input_map { key: "EXTRA" value: "IN" } '
        'output_map { key: "OUTPUT0" value: "OUT" } } }', mc.ModelConfig())
    extra = _model()
    extra.input[1].dims[:] = [4]  # EXTRA reads the request's IN
    with pytest.raises(ModelLoadError, match="in ensemble ens, step of model 'ens' receives inputs originated from "
                                             "different decoupled models"):
        validate_mapping(mixed, validate_structure(mixed), {0: repeat, 1: extra})


def _chain_of(body: str, inputs: tuple[str, ...] = ("IN",), outputs: tuple[str, ...] = ("OUT",)) -> list[str] | None:
    steps = ensemble_steps(_ensemble(body))
    order = chain(steps, frozenset(inputs), frozenset(outputs))
    return None if order is None else [step.model_name for step in order]


def test_chain_orders_the_steps_as_they_can_run_whatever_the_config_order() -> None:
    assert _chain_of(_steps(("a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}))) == ["a"]
    # listed last, run first: c reads only the ensemble input, b reads c's output, a reads b's
    body = _steps(("a", {"INPUT0": "y"}, {"OUTPUT0": "OUT"}), ("b", {"INPUT0": "x"}, {"OUTPUT0": "y"}),
                  ("c", {"INPUT0": "IN"}, {"OUTPUT0": "x"}))
    assert _chain_of(body) == ["c", "b", "a"]
    # a later step may read any earlier tensor, the ensemble's inputs included
    body = _steps(("a", {"INPUT0": "IN"}, {"OUTPUT0": "x"}), ("b", {"INPUT0": "x", "INPUT1": "IN"}, {"OUTPUT0": "OUT"}))
    assert _chain_of(body) == ["a", "b"]


def test_steps_that_could_run_side_by_side_or_leave_an_output_unwritten_are_no_chain() -> None:
    # two steps ready at once (both read IN): they run concurrently, so not a chain
    parallel = _steps(("a", {"INPUT0": "IN"}, {"OUTPUT0": "x"}), ("b", {"INPUT0": "IN"}, {"OUTPUT0": "y"}),
                      ("c", {"INPUT0": "x", "INPUT1": "y"}, {"OUTPUT0": "OUT"}))
    assert _chain_of(parallel) is None
    # a step whose input nothing writes never runs: the general path answers with Triton's deadlock error
    stuck = _steps(("a", {"INPUT0": "IN"}, {"OUTPUT0": "x"}), ("b", {"INPUT0": "missing"}, {"OUTPUT0": "OUT"}))
    assert _chain_of(stuck) is None
    # every step ran but an output of the ensemble is never written
    assert _chain_of(_steps(("a", {"INPUT0": "IN"}, {"OUTPUT0": "x"})), outputs=("OUT",)) is None
