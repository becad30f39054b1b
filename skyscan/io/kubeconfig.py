"""Who we are to the API server, and where it is: a kubeconfig's context (its cluster's address and
CA, its user's client certificate, bearer token, token file or exec credential plugin) or the pod's
own service account in-cluster, read into an `Endpoint`; `Credentials` keeps the current credential
(a token file re-read as the kubelet rotates it, a plugin's answer kept until it expires) and the TLS
context presenting its certificate. The client (`skyscan.io.kube`) asks it before each request.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import signal
import ssl
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import yaml

# Re-read a token file this often: the kubelet rotates projected service-account tokens well before
# they expire (client-go re-reads every minute too).
TOKEN_REREAD_SECONDS = 60.0
IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# The ExecCredential versions a credential plugin may speak (v1alpha1 is gone from Kubernetes).
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
INTERACTIVE_MODES = ("Never", "IfAvailable", "Always")  # may the plugin have our terminal
# A credential plugin answers in about a second (aws, gcloud); one that asks a person gets as long.
EXEC_TIMEOUT_SECONDS = 60.0


class PluginError(aiohttp.ClientOSError):
    """A kubeconfig user's exec credential plugin failed, or answered with no credential: to callers, as
    the API server not answering (the shim's 503, the operator's retry)."""


@dataclass(frozen=True)
class Plugin:
    """A kubeconfig user's exec credential plugin: a program printing an ExecCredential."""

    user: str  # the kubeconfig user, for errors
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = EXEC_API_VERSIONS[0]
    interactive: str = "IfAvailable"  # Never, IfAvailable or Always (a terminal on our stdin)


@dataclass(frozen=True)
class Endpoint:
    """Where the API server is and how to prove who we are (PEM text, or None)."""

    server: str
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    token: str | None = None
    token_file: str | None = None
    verify: bool = True
    plugin: Plugin | None = None


@dataclass(frozen=True)
class Credential:
    """What a request proves who we are with: a bearer token and/or a client certificate (PEM), good
    until `expires` (None: no end known)."""

    token: str | None = None
    cert: str | None = None
    key: str | None = None
    expires: dt.datetime | None = None


def _named(entries: Iterable[dict[str, Any]] | None, name: str | None, kind: str) -> dict[str, Any]:
    for entry in entries or ():
        if entry.get("name") == name:
            found: dict[str, Any] = entry.get(kind) or {}
            return found
    raise ValueError(f"kubeconfig has no {kind} {name!r}")


def _pem(section: dict[str, Any], key: str, base: Path) -> str | None:
    """The `<key>-data` (base64) or `<key>` (a file, relative to the kubeconfig) of a section."""
    if data := section.get(f"{key}-data"):
        return base64.b64decode(data).decode()
    if file := section.get(key):
        return (base / str(file)).read_text()
    return None


def _plugin(spec: dict[str, Any], user: str, base: Path) -> Plugin:
    """A user's `exec` section; a command with a path separator is relative to the kubeconfig (as
    kubectl has it), a bare name is looked up on $PATH."""
    version, mode = spec.get("apiVersion"), spec.get("interactiveMode") or "IfAvailable"
    who = f"kubeconfig user {user!r}"
    if version not in EXEC_API_VERSIONS:
        raise ValueError(f"{who}: exec apiVersion {version!r} is not one of {EXEC_API_VERSIONS}")
    if mode not in INTERACTIVE_MODES:
        raise ValueError(f"{who}: exec interactiveMode {mode!r} is not one of {INTERACTIVE_MODES}")
    command = str(spec["command"])
    return Plugin(
        user=user,
        command=str(base / command) if os.sep in command else command,
        args=tuple(str(a) for a in spec.get("args") or ()),
        env=tuple((str(e["name"]), str(e["value"])) for e in spec.get("env") or ()),
        api_version=version,
        interactive=mode,
    )


def endpoint_of_kubeconfig(doc: dict[str, Any], base: Path, context: str | None = None) -> Endpoint:
    """The current (or named) context of a parsed kubeconfig; files are read relative to `base`."""
    ctx = _named(doc.get("contexts"), context or doc.get("current-context"), "context")
    cluster = _named(doc.get("clusters"), ctx.get("cluster"), "cluster")
    name = ctx.get("user")
    user = _named(doc.get("users"), name, "user") if name else {}
    if provider := user.get("auth-provider"):
        # Deprecated upstream (gcp and azure removed in 1.26); oidc's id-token would work only until it
        # expires, as refreshing it is the identity provider's flow: an exec plugin does that.
        raise ValueError(
            f"kubeconfig user {name!r} logs in with the auth-provider {provider.get('name')!r}, which "
            "Kubernetes deprecated and skyscan does not support: switch it to an exec credential plugin "
            "(kubelogin for OIDC or Azure, gke-gcloud-auth-plugin for GKE)"
        )
    token_file = user.get("tokenFile")
    return Endpoint(
        server=str(cluster["server"]).rstrip("/"),
        ca=_pem(cluster, "certificate-authority", base),
        cert=_pem(user, "client-certificate", base),
        key=_pem(user, "client-key", base),
        token=str(user["token"]) if user.get("token") else None,
        token_file=str(base / token_file) if token_file else None,
        verify=not cluster.get("insecure-skip-tls-verify", False),
        plugin=_plugin(user["exec"], str(name), base) if user.get("exec") else None,
    )


def endpoint_in_cluster(env: Mapping[str, str], root: Path = IN_CLUSTER) -> Endpoint | None:
    """The pod's own service account, or None outside a cluster."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port or not (root / "token").exists():
        return None
    host = f"[{host}]" if ":" in host else host  # IPv6
    return Endpoint(
        server=f"https://{host}:{port}", ca=(root / "ca.crt").read_text(), token_file=str(root / "token")
    )


def ssl_context(endpoint: Endpoint) -> ssl.SSLContext | None:
    if not endpoint.server.startswith("https:"):
        return None
    context = ssl.create_default_context(cadata=endpoint.ca) if endpoint.ca else ssl.create_default_context()
    if not endpoint.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if endpoint.cert and endpoint.key:
        # The ssl module loads a certificate chain from files only: a private directory, gone at once.
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert.write_text(endpoint.cert)
            key.touch(0o600)
            key.write_text(endpoint.key)
            context.load_cert_chain(cert, key)
    return context


def exec_credential(raw: bytes, plugin: Plugin) -> Credential:
    """The credential in a plugin's answer: an ExecCredential of the plugin's apiVersion whose status
    holds a token or a client certificate and key (PEM), and maybe an expirationTimestamp."""
    who = f"kubeconfig user {plugin.user!r}: {plugin.command}"
    try:
        doc = json.loads(raw)
        status = doc["status"] if doc.get("kind") == "ExecCredential" else None  # raw: ExecCredential
        if doc.get("apiVersion") != plugin.api_version or not isinstance(status, dict):
            raise ValueError(f"not an ExecCredential of {plugin.api_version} with a status")
        stamp = status.get("expirationTimestamp")
        expires = dt.datetime.fromisoformat(stamp) if stamp else None
        found = Credential(
            token=status.get("token") or None,
            cert=status.get("clientCertificateData") or None,
            key=status.get("clientKeyData") or None,
            expires=expires.replace(tzinfo=expires.tzinfo or dt.UTC) if expires else None,  # RFC 3339: UTC
        )
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        raise PluginError(f"{who} answered no ExecCredential: {e}") from e
    if bool(found.cert) != bool(found.key) or not (found.token or found.cert):
        raise PluginError(f"{who} answered neither status.token nor clientCertificateData with clientKeyData")
    return found


async def run_plugin(plugin: Plugin) -> Credential:
    """Run a credential plugin as a subprocess (the event loop goes on), bounded by
    EXEC_TIMEOUT_SECONDS. It gets our stdin and stderr only if it may be interactive and stdin is a
    terminal; otherwise its stderr is kept for the error if it fails."""
    who = f"kubeconfig user {plugin.user!r}: {plugin.command}"
    interactive = plugin.interactive != "Never" and sys.stdin is not None and sys.stdin.isatty()
    if plugin.interactive == "Always" and not interactive:
        raise PluginError(f"{who} needs a terminal (interactiveMode Always) and there is none")
    info = {"apiVersion": plugin.api_version, "kind": "ExecCredential", "spec": {"interactive": interactive}}
    env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}
    pipe, devnull = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
    try:
        process = await asyncio.create_subprocess_exec(
            plugin.command, *plugin.args, env=env, stdout=pipe,
            stdin=None if interactive else devnull, stderr=None if interactive else pipe,
            process_group=None if interactive else 0,  # its own, so a stop reaches what it started
        )  # fmt: skip
    except OSError as e:
        raise PluginError(f"{who} cannot be run: {e}") from e
    try:
        async with asyncio.timeout(EXEC_TIMEOUT_SECONDS):
            out, err = await process.communicate()
    except TimeoutError:
        raise PluginError(f"{who} did not answer within {EXEC_TIMEOUT_SECONDS:g} s") from None
    finally:
        if process.returncode is None:
            # The whole group: a child still holding the pipes would hold up the wait.
            if interactive:
                process.kill()
            else:
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    if process.returncode:
        said = (err or b"").decode(errors="replace").strip()[-2000:]
        raise PluginError(f"{who} failed (exit {process.returncode}): {said or 'no message'}")
    return exec_credential(out, plugin)


class Credentials:
    """An endpoint's current credential: its fixed token or certificate, its token file (re-read every
    TOKEN_REREAD_SECONDS), or its plugin's answer, kept until it expires; one plugin run at a time,
    however many requests wait for it. `ssl` is the TLS context presenting the current certificate."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint
        self._now = Credential(endpoint.token, endpoint.cert, endpoint.key)
        self._read_at = 0.0
        self._lock = asyncio.Lock()
        self.ssl = ssl_context(endpoint)
        self._stale = endpoint.plugin is not None

    def _reread(self) -> None:
        file = self._endpoint.token_file
        if file and time.monotonic() - self._read_at > TOKEN_REREAD_SECONDS:
            self._now = replace(self._now, token=Path(file).read_text().strip())
            self._read_at = time.monotonic()

    async def current(self) -> Credential:
        self._reread()
        if (plugin := self._endpoint.plugin) is None:
            return self._now
        async with self._lock:
            expires = self._now.expires
            if self._stale or (expires is not None and dt.datetime.now(dt.UTC) >= expires):
                self._now = await run_plugin(plugin)
                self._stale = False
                if self._now.cert:
                    self.ssl = ssl_context(replace(self._endpoint, cert=self._now.cert, key=self._now.key))
            return self._now

    def renew(self, rejected: Credential) -> bool:
        """The API server answered 401 to `rejected`: whether a fresh credential may be had for one
        more try (a plugin's: the plugin runs again, unless it has since)."""
        if self._endpoint.plugin is None:
            return False
        self._stale = self._stale or rejected is self._now
        return True


def endpoint(kubeconfig: str | None = None) -> Endpoint:
    """The given kubeconfig file, else in-cluster, else $KUBECONFIG (its first file) or ~/.kube/config."""
    found = None if kubeconfig else endpoint_in_cluster(os.environ)
    if found is not None:
        return found
    file = Path(kubeconfig or (os.environ.get("KUBECONFIG") or "~/.kube/config").split(os.pathsep)[0])
    file = file.expanduser()
    return endpoint_of_kubeconfig(yaml.safe_load(file.read_text()), file.parent)
