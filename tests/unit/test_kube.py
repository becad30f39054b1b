"""skyscan.io.kube's pure parts (paths, query, line splitting, kubeconfig and in-cluster endpoints), and
its TLS client-certificate and token handling against a real local HTTPS server."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import io
import json
import ssl
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from skyscan.io import kube, kubeconfig
from skyscan.io.kube_errors import KubeError
from tests import helpers


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
    e = KubeError(404, "Not Found", b'{"kind":"Status","message":"scans \\"x\\" not found","code":404}')
    assert (e.status, e.reason, e.message) == (404, "Not Found", 'scans "x" not found')
    assert KubeError(502, "Bad Gateway", b"upstream gone").message == "upstream gone"


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
    found = kubeconfig.endpoint_of_kubeconfig(doc, Path("/nowhere"))
    assert found == kubeconfig.Endpoint("https://h:6443", ca="CA", cert="CERT", key="KEY")


def test_kubeconfig_file_forms_are_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    for name, text in {"ca.crt": "CA", "tok": "secret\n", "me.crt": "CERT", "me.key": "KEY"}.items():
        (tmp_path / name).write_text(text)
    user = {"tokenFile": "tok", "client-certificate": "me.crt", "client-key": str(tmp_path / "me.key")}
    doc = _config({"certificate-authority": "ca.crt", "insecure-skip-tls-verify": True}, user)
    found = kubeconfig.endpoint_of_kubeconfig(doc, tmp_path)
    assert (found.ca, found.token_file, found.verify) == ("CA", str(tmp_path / "tok"), False)
    assert (found.cert, found.key) == ("CERT", "KEY")  # relative, or absolute
    assert kubeconfig.endpoint_of_kubeconfig(_config({}, {"token": "t"}), tmp_path).token == "t"


def test_kubeconfig_exec_plugin(tmp_path: Path) -> None:
    spec = {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "bin/plugin", "args": ["token", 7],
        "env": [{"name": "REGION", "value": "eu"}], "interactiveMode": "Never",
    }  # fmt: skip
    found = kubeconfig.endpoint_of_kubeconfig(_config({}, {"exec": spec}), tmp_path).plugin
    assert found == kubeconfig.Plugin(
        user="u", command=str(tmp_path / "bin/plugin"), args=("token", "7"), env=(("REGION", "eu"),),
        api_version="client.authentication.k8s.io/v1beta1", interactive="Never",
    )  # fmt: skip
    bare = {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}
    found = kubeconfig.endpoint_of_kubeconfig(_config({}, {"exec": bare}), tmp_path).plugin
    assert found == kubeconfig.Plugin(user="u", command="aws")  # looked up on $PATH; IfAvailable by default


def test_kubeconfig_errors() -> None:
    with pytest.raises(ValueError, match="no context 'gone'"):
        kubeconfig.endpoint_of_kubeconfig(_config({}, {}), Path("."), context="gone")
    oidc = {"auth-provider": {"name": "oidc", "config": {"id-token": "t"}}}
    with pytest.raises(ValueError, match=r"user 'u' .* auth-provider 'oidc'.* exec credential plugin"):
        kubeconfig.endpoint_of_kubeconfig(_config({}, oidc), Path("."))
    old = {"exec": {"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"}}
    with pytest.raises(ValueError, match=r"user 'u': exec apiVersion .*v1alpha1"):
        kubeconfig.endpoint_of_kubeconfig(_config({}, old), Path("."))
    odd = {"exec": {"apiVersion": V1, "command": "x", "interactiveMode": "Often"}}
    with pytest.raises(ValueError, match="interactiveMode 'Often'"):
        kubeconfig.endpoint_of_kubeconfig(_config({}, odd), Path("."))


PLUGIN = kubeconfig.Plugin(user="u", command="p")
V1 = "client.authentication.k8s.io/v1"


def _answer(status: dict[str, object], version: str = V1) -> bytes:
    return json.dumps({"apiVersion": version, "kind": "ExecCredential", "status": status}).encode()


def test_exec_credential_token_certificate_and_expiry() -> None:
    answer = _answer({"token": "t", "expirationTimestamp": "2030-01-02T03:04:05Z"})
    found = kubeconfig.exec_credential(answer, PLUGIN)
    assert found == kubeconfig.Credential(token="t", expires=dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
    found = kubeconfig.exec_credential(_answer({"clientCertificateData": "C", "clientKeyData": "K"}), PLUGIN)
    assert found == kubeconfig.Credential(cert="C", key="K")


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"Password:", "answered no ExecCredential"),
        (_answer({"token": "t"}, "client.authentication.k8s.io/v1beta1"), "not an ExecCredential of .*/v1 "),
        (b"[]", "answered no ExecCredential"),
        (_answer({"token": "t", "expirationTimestamp": "soon"}), "answered no ExecCredential"),
        (_answer({}), "neither status.token nor clientCertificateData"),
        (_answer({"clientCertificateData": "C"}), "neither status.token nor clientCertificateData"),
    ],
)
def test_exec_credential_refuses_what_is_no_credential(raw: bytes, says: str) -> None:
    with pytest.raises(kubeconfig.PluginError, match=f"kubeconfig user 'u': p .*{says}"):
        kubeconfig.exec_credential(raw, PLUGIN)


async def test_plugin_gets_its_args_env_and_exec_info(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # no terminal, whatever runs the tests
    plugin = kubeconfig.Plugin(
        user="u", command=str(helpers.exec_plugin(tmp_path)), args=("get-token", "--region=eu"),
        env=(("SKYSCAN_PLUGIN_NOTE", "hi"),),
    )  # fmt: skip
    helpers.plugin_answers(tmp_path, {"status": {"token": "t"}})
    assert await kubeconfig.run_plugin(plugin) == kubeconfig.Credential(token="t")
    info = {"apiVersion": V1, "kind": "ExecCredential", "spec": {"interactive": False}}
    args = ["get-token", "--region=eu"]
    assert helpers.plugin_runs(tmp_path) == [{"args": args, "note": "hi", "info": info}]
    with pytest.raises(kubeconfig.PluginError, match="needs a terminal"):
        await kubeconfig.run_plugin(replace(plugin, interactive="Always"))
    assert len(helpers.plugin_runs(tmp_path)) == 1


async def test_failing_plugin_is_a_clear_error(tmp_path: Path) -> None:
    plugin = kubeconfig.Plugin(user="eks-admin", command=str(helpers.exec_plugin(tmp_path)))
    helpers.plugin_answers(tmp_path, {"fail": "Unable to locate credentials. Run aws configure."})
    with pytest.raises(
        kubeconfig.PluginError, match=r"user 'eks-admin': .*plugin.py failed \(exit 3\): Unable to"
    ):
        await kubeconfig.run_plugin(plugin)
    with pytest.raises(
        kubeconfig.PluginError, match=r"user 'eks-admin': .*/gone cannot be run: .*No such file"
    ):
        await kubeconfig.run_plugin(replace(plugin, command=str(tmp_path / "gone")))


async def test_a_slow_plugin_is_stopped_and_never_blocks_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "slow.sh"
    script.write_text("#!/bin/sh\nsleep 30\n")
    script.chmod(0o755)
    monkeypatch.setattr(kubeconfig, "EXEC_TIMEOUT_SECONDS", 1.0)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    ticking = asyncio.create_task(tick())
    started = time.monotonic()
    with pytest.raises(kubeconfig.PluginError, match="did not answer within 1 s"):
        await kubeconfig.run_plugin(kubeconfig.Plugin(user="u", command=str(script)))
    ticking.cancel()
    assert time.monotonic() - started < 10  # killed, not waited for
    assert ticks >= 10  # the loop went on meanwhile


def test_in_cluster(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    assert kubeconfig.endpoint_in_cluster(env, tmp_path) is None  # no token mounted
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("CA")
    assert kubeconfig.endpoint_in_cluster(env, tmp_path) == kubeconfig.Endpoint(
        "https://[fd00::1]:443", ca="CA", token_file=str(tmp_path / "token")
    )
    assert kubeconfig.endpoint_in_cluster({}, tmp_path) is None


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


@asynccontextmanager
async def _whoami_server(tmp_path: Path) -> AsyncIterator[tuple[str, tuple[x509.Certificate, Key]]]:
    """A real HTTPS server on localhost that demands a client certificate from its CA: GET /whoami
    answers the certificate's common name and the Authorization header. Yields its URL and CA."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("test-ca", ca_key, None)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _issue("localhost", server_key, (ca.subject, ca_key), server=True)
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
    try:
        yield f"https://localhost:{runner.addresses[0][1]}", (ca, ca_key)
    finally:
        await runner.cleanup()


def _client(name: str, ca: tuple[x509.Certificate, Key]) -> tuple[str, str]:
    """A client certificate of `ca` for `name` and its key, as PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    return _pem(_issue(name, key, (ca[0].subject, ca[1]))), _key_pem(key)


async def test_client_certificate_and_rotated_token_over_tls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real HTTPS server that demands a client certificate from its CA sees ours, and the bearer
    token from a file, re-read once it changes."""
    token = tmp_path / "token"
    token.write_text("one\n")
    async with _whoami_server(tmp_path) as (url, ca):
        cert, key = _client("me", ca)
        endpoint = kubeconfig.Endpoint(url, ca=_pem(ca[0]), cert=cert, key=key, token_file=str(token))
        async with kube.Kube(endpoint) as client:
            assert await client.request("GET", "/whoami") == {"cn": "me", "auth": "Bearer one"}
            token.write_text("two\n")
            monkeypatch.setattr(kubeconfig, "TOKEN_REREAD_SECONDS", 0.0)
            assert (await client.request("GET", "/whoami"))["auth"] == "Bearer two"
            with pytest.raises(KubeError) as caught:
                await client.request("GET", "/nothing")
            assert caught.value.status == 404
        async with kube.Kube(kubeconfig.Endpoint(url)) as stranger:
            with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
                await stranger.request("GET", "/whoami")  # our CA is not a system one


async def test_plugin_certificate_over_tls_renewed_once_expired(tmp_path: Path) -> None:
    """A plugin answering a client certificate: the server sees it; once it has expired the plugin
    runs again and the next request presents the new one."""
    plugin = kubeconfig.Plugin(user="u", command=str(helpers.exec_plugin(tmp_path)))
    async with _whoami_server(tmp_path) as (url, ca):
        async with kube.Kube(kubeconfig.Endpoint(url, ca=_pem(ca[0]), plugin=plugin)) as client:
            cert, key = _client("first", ca)
            answer = {"clientCertificateData": cert, "clientKeyData": key}
            helpers.plugin_answers(tmp_path, {"status": answer, "lifetime": -60})
            assert await client.request("GET", "/whoami") == {"cn": "first", "auth": None}
            cert, key = _client("second", ca)
            answer = {"clientCertificateData": cert, "clientKeyData": key}
            helpers.plugin_answers(tmp_path, {"status": answer})
            assert (await client.request("GET", "/whoami"))["cn"] == "second"
            assert (await client.request("GET", "/whoami"))["cn"] == "second"
    assert len(helpers.plugin_runs(tmp_path)) == 2  # no expiry given: kept


def test_an_apply_body_is_yaml_that_keeps_any_text() -> None:
    """What the API server's YAML reader refuses or folds is escaped, characters beyond the BMP are
    sent as UTF-8 (YAML refuses surrogate escapes), a lone surrogate becomes U+FFFD."""
    text = 'a\x00b\x0e\x7f\x85\x86\x9f\u2028\u2029\ufffe😀\u00e9 \\ " /'
    body = {"status": {"progress": {text: text, "lone": "x\udaa8y"}}}
    assert yaml.safe_load(kube.as_yaml(body)) == {"status": {"progress": {text: text, "lone": "x\ufffdy"}}}
