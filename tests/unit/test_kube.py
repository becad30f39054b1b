"""skyscan.kube's pure parts (paths, query, line splitting, kubeconfig and in-cluster endpoints), and
its TLS client-certificate and token handling against a real local HTTPS server."""

from __future__ import annotations

import base64
import datetime as dt
import ssl
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from skyscan import kube


def test_paths() -> None:
    assert kube.scan_path("ns") == "/apis/skyscan.io/v1alpha1/namespaces/ns/scans"
    assert kube.scan_path("ns", "s-1", "status") == "/apis/skyscan.io/v1alpha1/namespaces/ns/scans/s-1/status"
    assert kube.core_path("configmaps", "ns", "cm") == "/api/v1/namespaces/ns/configmaps/cm"
    assert kube.core_path("namespaces", name="ns") == "/api/v1/namespaces/ns"
    assert kube.path("batch/v1", "jobs", "ns") == "/apis/batch/v1/namespaces/ns/jobs"


def test_query_spells_booleans_and_drops_none() -> None:
    assert kube.query({"watch": True, "limit": 5, "continue": None, "x": "y", "f": False}) == {
        "watch": "true", "limit": "5", "x": "y", "f": "false",
    }  # fmt: skip
    assert kube.query(None) == {}


def test_lines_joins_a_line_split_across_chunks() -> None:
    pending: list[bytes] = []
    assert list(kube.lines(pending, b'{"a"')) == []
    assert list(kube.lines(pending, b":1}\n{")) == [b'{"a":1}']
    assert list(kube.lines(pending, b'"b":2}\n\n{"c":3}\n')) == [b'{"b":2}', b"", b'{"c":3}']
    assert pending == [b""]


def test_api_error_message_is_the_status_message() -> None:
    e = kube.ApiError(404, "Not Found", b'{"kind":"Status","message":"scans \\"x\\" not found","code":404}')
    assert (e.status, e.reason, e.message) == (404, "Not Found", 'scans "x" not found')
    assert kube.ApiError(502, "Bad Gateway", b"upstream gone").message == "upstream gone"


def _config(cluster: dict[str, object], user: dict[str, object]) -> dict[str, object]:
    return {
        "current-context": "c",
        "contexts": [{"name": "other", "context": {"cluster": "x", "user": "x"}},
                     {"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": "https://h:6443/", **cluster}}],
        "users": [{"name": "u", "user": user}],
    }  # fmt: skip


def test_kubeconfig_data_forms() -> None:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    doc = _config(
        {"certificate-authority-data": b64("CA")},
        {"client-certificate-data": b64("CERT"), "client-key-data": b64("KEY")},
    )
    found = kube.endpoint_of_kubeconfig(doc, Path("/nowhere"))
    assert found == kube.Endpoint("https://h:6443", ca="CA", cert="CERT", key="KEY")


def test_kubeconfig_file_forms_are_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    for name, text in {"ca.crt": "CA", "tok": "secret\n"}.items():
        (tmp_path / name).write_text(text)
    doc = _config({"certificate-authority": "ca.crt", "insecure-skip-tls-verify": True}, {"tokenFile": "tok"})
    found = kube.endpoint_of_kubeconfig(doc, tmp_path)
    assert (found.ca, found.token_file, found.verify) == ("CA", str(tmp_path / "tok"), False)
    assert kube.endpoint_of_kubeconfig(_config({}, {"token": "t"}), tmp_path).token == "t"


def test_kubeconfig_errors() -> None:
    with pytest.raises(ValueError, match="no context 'gone'"):
        kube.endpoint_of_kubeconfig(_config({}, {}), Path("."), context="gone")
    with pytest.raises(ValueError, match="not supported"):
        kube.endpoint_of_kubeconfig(_config({}, {"exec": {"command": "x"}}), Path("."))


def test_in_cluster(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    assert kube.endpoint_in_cluster(env, tmp_path) is None  # no token mounted
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("CA")
    assert kube.endpoint_in_cluster(env, tmp_path) == kube.Endpoint(
        "https://[fd00::1]:443", ca="CA", token_file=str(tmp_path / "token")
    )
    assert kube.endpoint_in_cluster({}, tmp_path) is None


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


Key = ec.EllipticCurvePrivateKey


def _key_pem(key: Key) -> str:
    plain = serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, plain).decode()


def _issue(
    name: str, key: Key, issuer: tuple[x509.Name, Key] | None, server: bool = False
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name, signer = issuer or (subject, key)
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )  # fmt: skip
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False
        )
    return builder.sign(signer, hashes.SHA256())


async def test_client_certificate_and_rotated_token_over_tls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real HTTPS server that demands a client certificate from its CA sees ours, and the bearer
    token from a file, re-read once it changes."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("test-ca", ca_key, None)
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    server_cert = _issue("localhost", server_key, (ca.subject, ca_key), server=True)
    client_cert = _issue("me", client_key, (ca.subject, ca_key))
    (tmp_path / "s.crt").write_text(_pem(server_cert))
    (tmp_path / "s.key").write_text(_key_pem(server_key))
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=_pem(ca))
    serving.verify_mode = ssl.CERT_REQUIRED
    serving.load_cert_chain(tmp_path / "s.crt", tmp_path / "s.key")

    async def whoami(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(x[0] for x in (peer or {}).get("subject", ()))
        return web.json_response(
            {"cn": subject.get("commonName"), "auth": request.headers.get("Authorization")}
        )

    app = web.Application()
    app.router.add_get("/whoami", whoami)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "localhost", 0, ssl_context=serving)
    await site.start()
    port = runner.addresses[0][1]
    token = tmp_path / "token"
    token.write_text("one\n")
    try:
        endpoint = kube.Endpoint(
            f"https://localhost:{port}", ca=_pem(ca), cert=_pem(client_cert), key=_key_pem(client_key),
            token_file=str(token),
        )  # fmt: skip
        async with kube.Kube(endpoint) as client:
            assert await client.request("GET", "/whoami") == {"cn": "me", "auth": "Bearer one"}
            token.write_text("two\n")
            monkeypatch.setattr(kube, "TOKEN_REREAD_SECONDS", 0.0)
            assert (await client.request("GET", "/whoami"))["auth"] == "Bearer two"
            with pytest.raises(kube.ApiError) as caught:
                await client.request("GET", "/nothing")
            assert caught.value.status == 404
        async with kube.Kube(kube.Endpoint(f"https://localhost:{port}")) as stranger:
            with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
                await stranger.request("GET", "/whoami")  # our CA is not a system one
    finally:
        await runner.cleanup()
