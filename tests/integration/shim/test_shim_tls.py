"""The scanner reaches the shim over TLS (issue 18, item 3): a `skyscan-shim serve` process with a
certificate, and the real `skyscan-sidecar` program trusting only the CA the operator mounts
(SSL_CERT_FILE, as in a scanner Pod with SKYSCAN_REST_CA_CONFIGMAP)."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api_shim.auth import make_token
from skyscan_local.control_plane_pki import write_etcd_pki
from tests.conftest import Cluster
from tests.helpers import eventually
from tests.integration.shim.conftest import start_shim_process

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    """A CA and a certificate for 127.0.0.1 it signed (the local control plane's etcd kind)."""
    d = tmp_path / "pki"
    d.mkdir()
    write_etcd_pki(d)
    return d


@pytest.fixture
def served(cluster: Cluster, namespace: str, tmp_path: Path, pki: Path) -> Iterator[tuple[str, str]]:
    tokens = tmp_path / "tokens.json"
    system = make_token(tokens, "scanner", ["system"])
    process, url = start_shim_process(
        cluster, namespace, tokens, tmp_path / "shim.log",
        SKYSCAN_TLS_CERT_FILE=str(pki / "etcd-server.crt"), SKYSCAN_TLS_KEY_FILE=str(pki / "etcd-server.key"),
    )  # fmt: skip
    try:
        yield url.replace("http://", "https://"), system
    finally:
        process.terminate()
        process.wait(10)


TRUST_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE")


def trusting(pki: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki / "etcd-ca.crt"))


async def answers(url: str, verify: ssl.SSLContext | bool) -> bool:
    async with httpx.AsyncClient(verify=verify) as http:
        return (await http.get(f"{url}/healthz")).status_code == 200


async def ready(url: str, pki: Path) -> bool:
    try:
        return await answers(url, trusting(pki))
    except httpx.TransportError:  # not listening yet
        return False


async def test_the_shim_serves_https_to_clients_that_trust_its_ca(served: tuple[str, str], pki: Path) -> None:
    url, _ = served
    await eventually(lambda: ready(url, pki), timeout=60)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        await answers(url, True)  # the system's trust store knows no such CA
    with pytest.raises(httpx.TransportError):
        await answers(url.replace("https://", "http://"), True)  # no plain HTTP beside it


def sidecar(url: str, token: str, startup: Path, trust: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in TRUST_ENV} | trust
    env |= {"SKYSCAN_SKYDRIVER_ADDRESS": url, "SKYSCAN_SKYDRIVER_SCAN_ID": "no-such-scan"}
    env["SKYSCAN_SKYDRIVER_AUTH"] = token
    argv = [sys.executable, "-m", "skyscan.io.sidecar", str(startup), "--exit-when-done"]
    argv += ["--retry-seconds", "1"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


async def test_the_sidecar_reaches_the_shim_only_through_the_mounted_ca(
    served: tuple[str, str], pki: Path, tmp_path: Path
) -> None:
    url, token = served
    startup = tmp_path / "startup.json"
    startup.write_text('{"k": 1}')
    await eventually(lambda: ready(url, pki), timeout=60)
    trusted = sidecar(url, token, startup, {"SSL_CERT_FILE": str(pki / "etcd-ca.crt")})
    assert "HTTP 404" in trusted.stderr, trusted.stderr  # over TLS to the shim, which knows no such scan
    untrusted = sidecar(url, token, startup, {})
    assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr, untrusted.stderr
