"""TLS and mutual TLS for HTTP and gRPC, with tritonclient; certificates are made in the test (cryptography)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from serving_pod.options import TlsOptions
from support.server import test_model_config, write_model


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject: str, key, issuer_key, issuer: x509.Name | None, *, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert=None, key=None) -> str:
    if cert is not None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    else:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("pki")
    ca_key = _key()
    ca = _cert("ferry-test-ca", ca_key, ca_key, None, ca=True)
    files = {"ca": _write(base / "ca.pem", cert=ca)}
    for who in ("server", "client"):
        key = _key()
        files[who] = _write(base / f"{who}.pem", cert=_cert(who, key, ca_key, ca.subject, ca=False))
        files[f"{who}_key"] = _write(base / f"{who}.key", key=key)
    return files


def _tls(pki, mutual: bool) -> TlsOptions:
    return TlsOptions(pki["server"], pki["server_key"], pki["ca"], mutual)


def _start(threaded_server, tmp_path, pki, mutual):
    write_model(tmp_path, "idt", test_model_config("idt"))
    return threaded_server([tmp_path], http_tls=_tls(pki, mutual), grpc_tls=_tls(pki, mutual))


def _infer(client, module) -> np.ndarray:
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    infer_input = module.InferInput("INPUT0", [1, 4], "FP32")
    infer_input.set_data_from_numpy(data)
    return client.infer("idt", [infer_input]).as_numpy("OUTPUT0")


def _http(server, pki, with_client_cert: bool):
    options = {"ca_certs": pki["ca"]}
    if with_client_cert:
        options.update(certfile=pki["client"], keyfile=pki["client_key"])
    return httpclient.InferenceServerClient(server.http_url, ssl=True, ssl_options=options, network_timeout=10)


def _grpc(server, pki, with_client_cert: bool):
    kwargs = {"root_certificates": pki["ca"]}
    if with_client_cert:
        kwargs.update(private_key=pki["client_key"], certificate_chain=pki["client"])
    return grpcclient.InferenceServerClient(server.grpc_url, ssl=True, **kwargs)


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual-tls"])
def test_tls_with_tritonclient(threaded_server, tmp_path, pki, mutual):
    server = _start(threaded_server, tmp_path, pki, mutual)
    for client, module in ((_http(server, pki, mutual), httpclient), (_grpc(server, pki, mutual), grpcclient)):
        assert client.is_server_ready()
        np.testing.assert_array_equal(_infer(client, module), np.arange(4, dtype=np.float32).reshape(1, 4))


def test_plaintext_clients_are_not_served_over_tls(threaded_server, tmp_path, pki):
    server = _start(threaded_server, tmp_path, pki, False)
    with pytest.raises(Exception):
        httpclient.InferenceServerClient(server.http_url, network_timeout=5).is_server_live()
    with pytest.raises(Exception):
        grpcclient.InferenceServerClient(server.grpc_url).is_server_live(client_timeout=5)


def test_mutual_tls_refuses_clients_without_a_certificate(threaded_server, tmp_path, pki):
    server = _start(threaded_server, tmp_path, pki, True)
    with pytest.raises(Exception):
        _http(server, pki, False).is_server_live()
    with pytest.raises(Exception):
        _grpc(server, pki, False).is_server_live(client_timeout=5)
    assert _http(server, pki, True).is_server_live()
