"""A thin async client for the Kubernetes API server, on aiohttp: JSON in, JSON (or raw bytes) out.

Everything we ask of the API server is a handful of REST calls on plain dicts; a generated client
costs the operator ~36 MiB and the shim ~0.35 s of import for nothing we use. `Kube` holds one
aiohttp session (no `trust_env`: the API server is reached directly, and netrc/proxy lookups would
hop to a thread on every call), authenticated by the kubeconfig's client certificate or bearer token
(inline or from files), by its exec credential plugin (run as a subprocess, its answer kept until it
expires), or in-cluster by the pod's service-account token (re-read as the kubelet rotates it).

    async with await connect(kubeconfig) as kube:
        scan = await kube.request("GET", scan_path("ns", "s-1"))
        await kube.request("PATCH", scan_path("ns", "s-1", "status"), body=..., content_type=MERGE_PATCH)
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import re
import signal
import ssl
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import yaml

from skyscan import model

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # server-side apply; a JSON body is valid YAML
# A watch event or a payload ConfigMap can carry an object up to etcd's request limit (1.5 MiB).
READ_BUFSIZE = 2**21
# Re-read a token file this often: the kubelet rotates projected service-account tokens well before
# they expire (client-go re-reads every minute too).
TOKEN_REREAD_SECONDS = 60.0
IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# The ExecCredential versions a credential plugin may speak (v1alpha1 is gone from Kubernetes).
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
INTERACTIVE_MODES = ("Never", "IfAvailable", "Always")  # may the plugin have our terminal
# A credential plugin answers in about a second (aws, gcloud); one that asks a person gets as long.
EXEC_TIMEOUT_SECONDS = 60.0

Params = Mapping[str, Any]  # str, int or bool values; None ones are left out


class WatchIdle(Exception):
    """A watch's stream brought nothing, not even a bookmark, for longer than the caller allows."""


class PluginError(aiohttp.ClientOSError):
    """A kubeconfig user's exec credential plugin failed, or answered with no credential: to callers, as
    the API server not answering (the shim's 503, the operator's retry)."""


class ApiError(Exception):
    """A non-2xx answer of the API server: its status, reason phrase and body."""

    def __init__(self, status: int, reason: str, body: bytes = b"") -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def message(self) -> str:
        """The message of the Status the API server answered with, else the body as text."""
        text = self.body.decode(errors="replace")
        try:
            found = json.loads(text)
        except ValueError:
            return text
        return str(found.get("message") or text) if isinstance(found, dict) else text

    @property
    def quota_exceeded(self) -> bool:
        """The namespace's ResourceQuota refused the write (used up, or its usage not yet counted)."""
        return self.status == 403 and "quota" in self.message.lower()


# ------------------------------------------------------------------------------ paths
def path(api: str, plural: str, namespace: str | None = None, name: str | None = None,
         subresource: str | None = None) -> str:  # fmt: skip
    """A resource's path: `api` is "v1" (the core group) or "group/version"."""
    parts = ["/api/v1" if api == "v1" else f"/apis/{api}"]
    if namespace is not None:
        parts.append(f"namespaces/{namespace}")
    parts.append(plural)
    if name is not None:
        parts.append(name)
        if subresource is not None:
            parts.append(subresource)
    return "/".join(parts)


def core_path(plural: str, namespace: str | None = None, name: str | None = None,
              subresource: str | None = None) -> str:  # fmt: skip
    return path("v1", plural, namespace, name, subresource)


def scan_path(namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    return path(f"{model.GROUP}/{model.VERSION}", model.PLURAL, namespace, name, subresource)


# What the API server's YAML reader refuses raw or folds (C1 controls, NEL, the Unicode line and paragraph
# separators, non-characters): written as \u escapes instead. Surrogates it refuses even escaped.
YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufffe\uffff]")
SURROGATE = re.compile("[\ud800-\udfff]")


def as_yaml(body: Any) -> bytes:
    """A body for server-side apply (YAML, of which JSON is a subset), so that any text survives it:
    non-ASCII as UTF-8 rather than escaped (a character beyond the BMP would be a surrogate pair, which
    YAML refuses), what YAML cannot hold raw escaped, and a lone surrogate (JSON lets a client send
    one) as U+FFFD, as the API server's JSON reader makes it."""
    text = json.dumps(body, ensure_ascii=False)
    text = SURROGATE.sub("\ufffd", YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text))
    return text.encode()


def query(params: Params | None) -> dict[str, str]:
    """Query parameters as the API server spells them (booleans lower case); None values left out."""
    out: dict[str, str] = {}
    for key, value in (params or {}).items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def lines(pending: list[bytes], chunk: bytes) -> Iterator[bytes]:
    """The complete lines that `chunk` ends, given the unfinished line's earlier parts in `pending`
    (updated in place to hold the new unfinished part). Joins each line once, whatever its size."""
    if b"\n" not in chunk:
        pending.append(chunk)
        return
    first, *rest = chunk.split(b"\n")
    pending.append(first)
    yield b"".join(pending)
    pending[:] = [rest.pop()]
    yield from rest


# ------------------------------------------------------------------------------ credentials
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


# ------------------------------------------------------------------------------ the client
class Kube:
    """One API server, one aiohttp session. Create it with `connect`; close it (or `async with`)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.server = endpoint.server
        self._credentials = Credentials(endpoint)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(),  # TLS: each request's (the current certificate's)
            trust_env=False,
            read_bufsize=READ_BUFSIZE,
            timeout=aiohttp.ClientTimeout(),  # none by default: a call's `timeout` bounds it
        )

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._session.close()

    @asynccontextmanager
    async def _send(
        self, method: str, path: str, params: dict[str, str], data: bytes | None, accept: str,
        content_type: str | None, timeout: aiohttp.ClientTimeout,
    ) -> AsyncIterator[aiohttp.ClientResponse]:  # fmt: skip
        """The answer to a request with our current credential; one more try, with a fresh one, if the
        API server answers 401 and a fresh one may be had (see Credentials.renew)."""
        headers = {"Accept": accept} | ({"Content-Type": content_type} if content_type else {})
        for last in (False, True):
            credential = await self._credentials.current()
            token = {"Authorization": f"Bearer {credential.token}"} if credential.token else {}
            response = await self._session.request(
                method, self.server + path, params=params, data=data, headers=headers | token,
                timeout=timeout, ssl=self._credentials.ssl or False,
            )  # fmt: skip
            if response.status == 401 and not last and self._credentials.renew(credential):
                response.release()
                continue
            async with response:
                yield response
            return

    async def read(
        self, method: str, path: str, *, params: Params | None = None, body: Any = None,
        content_type: str = JSON, accept: str = JSON, timeout: float | None = None,
        idle: float | None = None,
    ) -> bytes:  # fmt: skip
        """The raw body of a 2xx answer (else `ApiError`); `body` is sent as JSON unless bytes.
        `timeout` bounds the whole call, `idle` each wait for the answer's next bytes (a long listing
        may take its time, a server that stopped answering may not)."""
        if body is None or isinstance(body, bytes):
            data = body
        else:
            data = as_yaml(body) if content_type == APPLY_PATCH else json.dumps(body).encode()
        async with self._send(
            method, path, query(params), data, accept, content_type if data is not None else None,
            aiohttp.ClientTimeout(total=timeout, sock_read=idle),
        ) as response:  # fmt: skip
            raw = await response.read()
            if response.status >= 300:
                raise ApiError(response.status, response.reason or "", raw)
            return raw

    async def request(
        self, method: str, path: str, *, params: Params | None = None, body: Any = None,
        content_type: str = JSON, accept: str = JSON, timeout: float | None = None,
    ) -> Any:  # fmt: skip
        """The parsed JSON answer (None for an empty one)."""
        raw = await self.read(
            method, path, params=params, body=body, content_type=content_type, accept=accept, timeout=timeout
        )
        return json.loads(raw) if raw else None

    async def apply(
        self, path: str, body: dict[str, Any], field_manager: str, *, force: bool = True,
        timeout: float | None = None, parse: bool = True,
    ) -> Any:  # fmt: skip
        """Server-side apply `body` at `path` (the object's own path: created if absent) as
        `field_manager`, which then owns exactly the fields `body` sets: a field it set before and
        leaves out now is removed. `force` takes over fields another manager set to other values
        (each component is the one writer of its fields) instead of answering 409. The object as
        applied (None unless `parse`: a payload's answer echoes the payload)."""
        raw = await self.read(
            "PATCH", path, params={"fieldManager": field_manager, "force": force}, body=body,
            content_type=APPLY_PATCH, timeout=timeout,
        )  # fmt: skip
        return json.loads(raw) if parse and raw else None

    async def watch(
        self, path: str, params: Params | None = None, *,
        answer: float | None = None, idle: float | None = None,
    ) -> AsyncIterator[dict[str, Any]]:  # fmt: skip
        """The watch events of a collection (`{"type", "object"}` dicts, ERROR ones included), until
        the API server ends the watch; it is bounded by `timeoutSeconds` (plus 30 s) when given.
        `answer`: seconds the API server has to answer the request (else `TimeoutError`); `idle`:
        seconds the stream may bring nothing, not even a bookmark, before `WatchIdle`."""
        wanted = query(params) | {"watch": "true"}
        seconds = wanted.get("timeoutSeconds")
        total = aiohttp.ClientTimeout(total=int(seconds) + 30 if seconds else None)
        async with AsyncExitStack() as stack:
            async with asyncio.timeout(answer):
                sending = self._send("GET", path, wanted, None, JSON, None, total)
                response = await stack.enter_async_context(sending)
            if response.status >= 300:
                raise ApiError(response.status, response.reason or "", await response.read())
            pending: list[bytes] = []
            chunks = response.content.iter_any()
            while True:
                quiet = asyncio.timeout(idle)
                try:
                    async with quiet:
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    return
                except TimeoutError as e:
                    if quiet.expired():
                        raise WatchIdle(f"nothing for {idle:g} s, not even a bookmark") from e
                    raise
                for line in lines(pending, chunk):
                    if line.strip():
                        yield json.loads(line)


def endpoint(kubeconfig: str | None = None) -> Endpoint:
    """The given kubeconfig file, else in-cluster, else $KUBECONFIG (its first file) or ~/.kube/config."""
    found = None if kubeconfig else endpoint_in_cluster(os.environ)
    if found is not None:
        return found
    file = Path(kubeconfig or (os.environ.get("KUBECONFIG") or "~/.kube/config").split(os.pathsep)[0])
    file = file.expanduser()
    return endpoint_of_kubeconfig(yaml.safe_load(file.read_text()), file.parent)


async def connect(kubeconfig: str | None = None) -> Kube:
    """A client for `endpoint(kubeconfig)`."""
    return Kube(endpoint(kubeconfig))


# ------------------------------------------------------------------------------ Scans and the CRD
async def list_scans(kube: Kube, namespace: str, page_size: int = 500) -> AsyncIterator[list[dict[str, Any]]]:
    """The Scans of a namespace, a page at a time (so no reader holds them all at once)."""
    token: str | None = None
    while True:
        page = await kube.request("GET", scan_path(namespace), params={"limit": page_size, "continue": token})
        yield page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


def is_established(crd: dict[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []  # raw: CRD
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)  # raw: CRD


async def apply_crd(kube: Kube, body: dict[str, Any], field_manager: str, timeout: float = 60.0) -> None:
    """Create or update a CRD (server-side apply) and wait until the API server serves it."""
    crds = path("apiextensions.k8s.io/v1", "customresourcedefinitions")
    name = body["metadata"]["name"]
    await kube.apply(f"{crds}/{name}", body, field_manager)
    deadline = time.monotonic() + timeout
    while not is_established(await kube.request("GET", f"{crds}/{name}")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRD {name} not Established after {timeout}s")
        await asyncio.sleep(0.2)
