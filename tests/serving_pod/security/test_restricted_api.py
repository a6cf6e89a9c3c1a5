"""Restricted APIs: ``--http-restricted-api`` / ``--grpc-restricted-protocol`` refuse calls without the header."""

from __future__ import annotations

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from serving_pod.security import GRPC_HEADER_PREFIX, grpc_group, http_group, parse_restrictions
from support.server import test_model_config, write_model

RULES = ["model-repository,logging:admin-key=s3cret", "inference:infer-key=abc"]


@pytest.fixture
def server(threaded_server, tmp_path):
    write_model(tmp_path, "idt", test_model_config("idt"))
    return threaded_server(
        [tmp_path],
        model_control_mode="explicit",
        load_models=("idt",),
        http_restrictions=parse_restrictions(RULES, "--http-restricted-api"),
        grpc_restrictions=parse_restrictions(RULES, "--grpc-restricted-protocol", GRPC_HEADER_PREFIX),
    )


def _infer(server, protocol, headers=None):
    client, module = server.client(protocol), server.module(protocol)
    infer_input = module.InferInput("INPUT0", [1, 4], "FP32")
    infer_input.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    return client.infer("idt", [infer_input], headers=headers)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_restricted_groups_need_their_header(server, protocol):
    """Over gRPC the metadata key is the flag's key after tritonserver's ``triton-grpc-protocol-`` (Triton 2.51
    answers "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"); the bare key, which
    Ferry took before, is refused like no header."""
    client = server.client(protocol)
    prefix = "" if protocol == "http" else "triton-grpc-protocol-"
    admin, infer = prefix + "admin-key", prefix + "infer-key"
    expected = (f"This API is restricted, expecting header '{admin}'" if protocol == "http"
                else f"This protocol is restricted, expecting header '{admin}'")
    with pytest.raises(InferenceServerException, match=expected):
        client.unload_model("idt")
    with pytest.raises(InferenceServerException, match=expected):
        client.unload_model("idt", headers={admin: "wrong"})
    if protocol == "grpc":
        with pytest.raises(InferenceServerException, match=expected):
            client.unload_model("idt", headers={"admin-key": "s3cret"})
    with pytest.raises(InferenceServerException, match=f"expecting header '{admin}'"):
        client.get_log_settings()
    with pytest.raises(InferenceServerException, match=f"expecting header '{infer}'"):
        _infer(server, protocol)
    # unrestricted groups and correct headers pass
    assert client.is_server_live() and client.get_model_metadata("idt")
    _infer(server, protocol, headers={infer: "abc"})
    client.get_log_settings(headers={admin: "s3cret"})
    assert server.engine.model_ready("idt")  # refused unloads did nothing


def test_http_refusal_is_403_with_json_error(server):
    response = httpx.post(f"http://{server.http_url}/v2/repository/index", json={})
    assert response.status_code == 403
    assert response.json() == {"error": "This API is restricted, expecting header 'admin-key'"}
    ok = httpx.post(f"http://{server.http_url}/v2/repository/index", json={}, headers={"Admin-Key": "s3cret"})
    assert ok.status_code == 200


def test_grpc_refusal_is_unavailable(server):
    with pytest.raises(InferenceServerException) as info:
        server.client("grpc").get_model_repository_index()
    assert info.value.status() == str(grpc.StatusCode.UNAVAILABLE)


def test_parsing_and_group_mapping():
    rules = parse_restrictions(["health,metadata:K=v"], "--http-restricted-api")
    assert rules["health"].header == "k" and rules["metadata"].value == "v"
    form = "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got "
    for bad, message in [("nope:k=v", "unknown restricted api 'nope'"), ("health:k", form + "health:k"),
                         ("k=v", form + "k=v"), ("health:=v", form + "health:=v"), ("health:k=", form + "health:k=")]:
        with pytest.raises(ValueError) as refused:
            parse_restrictions([bad], "--http-restricted-api")
        assert str(refused.value) == message
    with pytest.raises(ValueError, match="^restricted api 'health' can not be specified in multiple config groups$"):
        parse_restrictions(["health:a=b", "health:c=d"], "--http-restricted-api")
    with pytest.raises(ValueError, match="^unknown restricted protocol 'nope'$"):
        parse_restrictions(["nope:k=v"], "--grpc-restricted-protocol", "triton-grpc-protocol-")


def test_a_value_may_hold_colons_and_equals_signs():
    """As tritonserver (it splits at the first ':' and the first '=' after it): a token such as ``user:secret`` is a
    value; an empty value is refused above (Ferry had split at the last ':', refusing it, and taken "")."""
    rules = parse_restrictions(["model-repository,trace:Authorization=Basic a:b=c"], "--http-restricted-api")
    assert rules["model-repository"] == rules["trace"]
    assert (rules["trace"].header, rules["trace"].value) == ("authorization", "Basic a:b=c")
    assert http_group("/v2") == "metadata"
    assert http_group("/v2/models/m/versions/1/infer") == "inference"
    assert http_group("/v2/models/m/versions/1") == "metadata"
    assert http_group("/v2/models/m/ready") == "health"
    assert http_group("/v2/models/stats") == "statistics"
    assert http_group("/v2/models/m/config") == "model-config"
    assert http_group("/v2/models/m/trace/setting") == "trace"
    assert http_group("/v2/systemsharedmemory/region/r/register") == "shared-memory"
    assert http_group("/v2/repository/models/m/load") == "model-repository"
    assert http_group("/metrics") is None
    assert grpc_group("/inference.GRPCInferenceService/CudaSharedMemoryRegister") == "shared-memory"
    assert grpc_group("/grpc.health.v1.Health/Check") == "health"
